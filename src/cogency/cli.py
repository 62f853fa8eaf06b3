"""The ``cogency`` command: run and resume tasks, and look at what is stored.

argparse and a few ANSI codes rather than typer/rich: the command starts in about half the
time (typer and rich import in ~0.5 s on a busy machine, more than the rest of cogency) and
works from the core install, with no extra dependency.

    cogency run "query" [--user U] [--conversation C] [--llm L] [--tools files,shell,http]
                        [--mcp "command args"]... [--yes | --read-only]
    cogency resume TASK_ID
    cogency approve TASK_ID [--deny CALL_ID ...]
    cogency mcp [--user U] [--llm L] [--db URL]   (an agent served over MCP on stdio)
    cogency tasks [release TASK_ID --user U] | conversations [show ID] | profile show|forget USER
    cogency serve [--db URL] [--llm L] [--port P] | keys create|list|revoke  (server/commands.py)

A tool call that needs approval (file writes, shell) is asked about on the terminal
(``[y/N]``); ``--yes`` allows them all. Without a terminal on stdin the task pauses, the
command that decides it is printed, and the exit status is 3.

Errors print one line (``error: …``) on stderr and exit 1 (``--debug`` adds the traceback);
Ctrl-C exits 130 and leaves the task resumable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import traceback
import unicodedata
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_AWAITING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
TOOL_SETS = ("files", "shell", "http")
OUTPUT_CHARS = 400
"""A tool's output is cut to this on screen (the model and the database get all of it)."""
ASK_CHARS = 2_000
"""A call's arguments shown when asking for approval (longer ones are cut, and say so)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cogency`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    progress: dict[str, Any] = {}
    try:
        return asyncio.run(args.handler(args, progress))
    except KeyboardInterrupt:
        task = progress.get("task_id")
        hint = f"; resume with: cogency resume {task}" if task else ""
        print(f"\ninterrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into a line
        if args.debug:
            traceback.print_exc()
        message = str(exc) or type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return EXIT_ERROR


# -- commands ---------------------------------------------------------------------------------


async def _run(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    store = _store(args)
    ask = _Ask() if not args.yes and _isatty(sys.stdin) else None
    try:
        decisions = await _decisions(store, args) if args.command == "approve" else None
        async with _agent(args, store, ask) as agent:  # no terminal to ask on: tasks pause
            start = getattr(agent.llm, "start", None)
            if start is not None:  # the offline model: fetch and load it before the spinner
                await start()
            if args.command == "run":
                events = agent.stream(args.query, args.user, args.conversation)
            else:
                events = agent.resume_stream(args.task_id, args.user, approvals=decisions)
            return await _show(events, args, progress, ask)
    finally:
        await store.close()


async def _decisions(store: Any, args: argparse.Namespace) -> dict[str, bool]:
    """What ``cogency approve`` decides: every pending call approved, but those ``--deny``."""
    from .errors import NotFoundError, UsageError

    pending = [call["id"] for call in
               await store.load_approvals(args.task_id, args.user, "pending")]
    if not pending:
        raise UsageError(
            f"task {args.task_id!r} waits for no approval; continue it with: "
            f"cogency resume {shlex.quote(args.task_id)}"
        )
    unknown = [call_id for call_id in args.deny if call_id not in pending]
    if unknown:
        raise NotFoundError(
            f"task {args.task_id!r} has no call {_safe(unknown[0])!r} waiting for approval "
            f"(waiting: {', '.join(pending)})"
        )
    return {call_id: not (args.deny_all or call_id in args.deny) for call_id in pending}


async def _mcp(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .mcp_server import serve_stdio
    from .tools.mcp import require_sdk

    require_sdk()
    store = _store(args)
    try:
        async with _agent(args, store) as agent:
            await serve_stdio(agent, args.user)
    finally:
        await store.close()
    return EXIT_OK


def _agent(args: argparse.Namespace, store: Any, ask: Any = None) -> Any:
    """The agent the command line describes; ``ask`` decides calls that need approval
    (``--yes`` allows them all; with neither, a task pauses at such a call)."""
    from .agent import Agent
    from .errors import UsageError

    if args.read_only and args.mcp:
        raise UsageError("--read-only cannot include --mcp servers (their tools may change "
                         "anything); leave --mcp out")
    return Agent(
        llm=args.llm,
        tools=[*builtin_tools(args.tools, Path(args.root), read_only=args.read_only),
               *mcp_servers(args.mcp)],
        store=store,
        max_iterations=args.max_iterations,
        approve=True if args.yes else ask,
    )


async def _tasks(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    if args.release:
        return await _release(args)
    store = _store(args)
    try:
        tasks = await store.list_tasks(args.user)
    finally:
        await store.close()
    if args.json:
        for task in tasks:
            _json_line({"task_id": task.task_id, "user_id": task.user_id,
                        "conversation_id": task.conversation_id, "query": task.query,
                        "workspace": task.workspace, "updated_at": _iso(task.updated_at),
                        "pending_approvals": task.pending_approvals})
        return EXIT_OK
    if not tasks:
        print("no unfinished tasks")
        return EXIT_OK
    style = _Style(sys.stdout)
    for task in tasks:
        print(f"{style.bold(task.task_id)}  {task.user_id}  {_iso(task.updated_at)}  "
              f"{_clip(_safe(task.query), 60)}")
        for call in task.pending_approvals:
            print(style.yellow(f"  waits for approval: {call['id']}  ") + _call_text(call, 200))
    print(style.dim("resume one with: cogency resume TASK_ID --user USER; decide what one "
                    "waits for with: cogency approve TASK_ID [--deny CALL_ID] --user USER"))
    return EXIT_OK


async def _release(args: argparse.Namespace) -> int:
    from .errors import UsageError

    if not args.task_id or not args.user:
        raise UsageError("usage: cogency tasks release TASK_ID --user USER")
    store = _store(args)
    try:
        runner = await store.force_release(args.task_id, args.user)
    finally:
        await store.close()
    held = f" from runner {runner}" if runner else " (no runner held it)"
    print(f"released task {args.task_id}{held}; its later writes are refused. "
          f"Resume it with: cogency resume {args.task_id} --user {args.user}")
    return EXIT_OK


async def _conversations(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    store = _store(args)
    try:
        if args.conversation_id:
            return await _show_conversation(store, args)
        conversations = await store.list_conversations(args.user)
    finally:
        await store.close()
    if args.json:
        for item in conversations:
            _json_line({"conversation_id": item.conversation_id, "user_id": item.user_id,
                        "messages": item.message_count, "updated_at": _iso(item.updated_at)})
        return EXIT_OK
    if not conversations:
        print(f"no conversations for user {args.user!r}")
        return EXIT_OK
    style = _Style(sys.stdout)
    for item in conversations:
        print(f"{style.bold(item.conversation_id)}  {item.message_count} messages  "
              f"{_iso(item.updated_at)}")
    return EXIT_OK


async def _show_conversation(store: Any, args: argparse.Namespace) -> int:
    await store.load_conversation(args.conversation_id, args.user)  # NotFoundError if not theirs
    messages = await store.load_messages(args.conversation_id, args.user)
    if args.json:
        for message in messages:
            _json_line({"role": message["role"], "content": message["content"]})
        return EXIT_OK
    style = _Style(sys.stdout)
    for message in messages:
        print(f"{style.bold(message['role'])}: {message['content']}")
    return EXIT_OK


async def _profile(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    store = _store(args)
    try:
        if args.action == "forget":
            await store.forget_user(args.user_id)
            print(f"forgot {args.user_id!r}: profile, conversations, messages and tasks deleted")
            return EXIT_OK
        profile = await store.load_profile(args.user_id)
    finally:
        await store.close()
    if profile is None:
        print(f"nothing is stored about {args.user_id!r}")
        return EXIT_OK
    print(json.dumps(profile.to_dict(), indent=2, ensure_ascii=False, default=str))
    return EXIT_OK


# -- streaming a run --------------------------------------------------------------------------


async def _show(events: AsyncIterator[Any], args: argparse.Namespace,
                progress: dict[str, Any], ask: _Ask | None = None) -> int:
    out = sys.stdout
    view = None if args.json else _View(out, sys.stderr)
    if ask is not None:
        ask.view = view
    fatal: str | None = None
    end: Any = None
    waiting: list[Any] = []
    try:
        async for event in events:
            progress.setdefault("task_id", event.task_id)
            if event.type == "error" and event.fatal:
                fatal = event.message
            if event.type == "approval":
                waiting.append(event)
            if event.type == "end":
                end = event
            if view is None:
                _json_line(event.to_dict())
            else:
                view.show(event)
    finally:
        if view is not None:
            view.stop()
    if end is None:
        return EXIT_ERROR
    if end.stop_reason in ("completed", "security"):
        return EXIT_OK
    if end.stop_reason == "awaiting_approval":
        _tell_how_to_decide(end.task_id, waiting, args)
        return EXIT_AWAITING
    if fatal is None:
        fatal = f"the task stopped ({end.stop_reason}) after {end.iterations} iterations"
    print(f"error: {fatal}; resume with: cogency resume {end.task_id}", file=sys.stderr)
    return EXIT_ERROR


def _tell_how_to_decide(task_id: str, waiting: list[Any], args: argparse.Namespace) -> None:
    """Print what the paused task waits for, and the commands that decide it."""
    count = len(waiting)
    lines = [f"task {task_id} waits for your approval of {count} call{'s' * (count != 1)} "
             "(no terminal to ask on):"]
    lines += [f"  {event.id}  {_call_text(event, 300)}" for event in waiting]
    command = ["cogency", "approve", task_id]
    for flag, value, default in (("--user", args.user, "default"), ("--db", args.db, None),
                                 ("--llm", args.llm, None), ("--tools", args.tools, ""),
                                 ("--root", args.root, ".")):
        if value != default:
            command += [flag, value]
    decide = " ".join(shlex.quote(part) for part in command)
    lines.append(f"approve: {decide}")
    lines.append(f"deny:    {decide} --deny CALL_ID  (or --deny-all)")
    print("\n".join(lines), file=sys.stderr)


class _Ask:
    """Asks on the terminal whether a tool call may run: ``[y/N]``, no answer is no."""

    def __init__(self) -> None:
        self.view: _View | None = None

    async def __call__(self, call: dict[str, Any]) -> bool:
        for _ in range(5):  # let the view print the step's events first: they explain the call
            await asyncio.sleep(0)
        if self.view is not None:
            self.view.stop()
        sys.stderr.write(f"allow {_call_text(call, ASK_CHARS)}? [y/N] ")
        sys.stderr.flush()
        answer = (await _read_line(sys.stdin)).strip().lower()
        return answer in ("y", "yes")


async def _read_line(stream: IO[str]) -> str:
    """A line typed on the terminal, read without a thread (so Ctrl-C is not held up)."""
    loop = asyncio.get_running_loop()
    fd = stream.fileno()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 4096).decode("utf-8", "replace")


class _View:
    """Renders events for a person: thinking, tool calls and results, then the answer."""

    def __init__(self, out: IO[str], status: IO[str]) -> None:
        self.out = out
        self.style = _Style(out)
        self.spinner = _Spinner(status) if _isatty(status) else None
        self.workspace: dict[str, str] = {}
        if self.spinner:
            self.spinner.start("thinking")

    def show(self, event: Any) -> None:
        kind = event.type
        if kind == "token":
            if self.spinner:
                self.spinner.grow(len(event.text))
            return
        if self.spinner:
            self.spinner.clear()
        style = self.style
        if kind == "start":
            verb = "resuming" if event.resumed else "task"
            self._line(style.dim(f"{verb} {event.task_id} · conversation {event.conversation_id}"))
        elif kind == "reason":
            for name, value in event.workspace.items():
                if value and self.workspace.get(name) != value:
                    self._line(style.dim(f"  {name}: ") + _clip(value, 300))
            self.workspace = dict(event.workspace)
        elif kind == "action":
            args = _safe(json.dumps(event.args, ensure_ascii=False))
            self._line(style.cyan(f"→ {event.name}") + style.dim(f"({_clip(args, 200)})"))
        elif kind == "approval":
            self._line(style.yellow(f"⏸ {event.name} waits for approval ({event.id})"))
        elif kind == "result":
            mark = style.green("✓") if event.ok else style.red("✗")
            self._line(f"{mark} {event.name}: {_clip(str(event.output), OUTPUT_CHARS)}")
        elif kind == "response":
            self._line("")
            self._line(style.bold(event.text))
        elif kind == "error":
            if not event.fatal:
                self._line(style.yellow(f"! {event.message}"))
        elif kind == "end":
            self._line(style.dim(f"{event.stop_reason} · {event.iterations} iteration"
                                 f"{'' if event.iterations == 1 else 's'}"))
            return
        if self.spinner and kind != "response":
            self.spinner.start("working" if kind in ("action", "result") else "thinking")

    def stop(self) -> None:
        if self.spinner:
            self.spinner.stop()

    def _line(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class _Spinner:
    """A one-line spinner on a terminal, redrawn by a task until an event clears it."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.label = ""
        self.chars = 0
        self._task: asyncio.Task[None] | None = None

    def start(self, label: str) -> None:
        self.label, self.chars = label, 0
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._spin())

    def grow(self, chars: int) -> None:
        self.chars += chars

    def clear(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.stream.write("\r\033[2K")
        self.stream.flush()

    async def _spin(self) -> None:
        frame = 0
        while True:
            extra = f" ({self.chars} chars)" if self.chars else ""
            self.stream.write(f"\r\033[2K{self.FRAMES[frame % len(self.FRAMES)]} "
                              f"{self.label}…{extra}")
            self.stream.flush()
            frame += 1
            await asyncio.sleep(0.1)


class _Style:
    """ANSI styles on a terminal, plain text elsewhere or with ``NO_COLOR`` set."""

    def __init__(self, stream: IO[str]) -> None:
        self.on = _isatty(stream) and not os.environ.get("NO_COLOR")

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def cyan(self, text: str) -> str:
        return self._wrap("36", text)


# -- helpers ------------------------------------------------------------------------------------


def builtin_tools(spec: str | None, root: Path, *, read_only: bool = False) -> list[Any]:
    """The built-in tool sets named in ``spec`` ("files,shell,http"), confined to ``root``;
    ``read_only`` keeps only tools that change nothing (no file writes, no shell)."""
    from .errors import ConfigurationError, UsageError

    tools: list[Any] = []
    for name in [part.strip() for part in (spec or "").split(",") if part.strip()]:
        if name not in TOOL_SETS:
            raise UsageError(f"unknown tool set {name!r}: choose from {', '.join(TOOL_SETS)}")
        if name == "shell" and read_only:
            raise UsageError("--read-only cannot include the shell tool (a command can change "
                             "anything); leave shell out of --tools")
        try:
            if name == "files":
                from .tools.files import files_tools

                tools.extend(files_tools(root, read_only=read_only))
            elif name == "shell":
                from .tools.shell import shell_tool

                tools.append(shell_tool(root))
            else:
                from .tools.http import http_tool

                tools.append(http_tool())
        except ImportError as exc:
            raise ConfigurationError(
                f"the {name!r} tools are not available in this version of cogency"
            ) from exc
    return tools


def mcp_servers(specs: Sequence[str] | None) -> list[Any]:
    """An ``MCPServer`` for each ``--mcp``: a command line (stdio) or an http(s) URL."""
    if not specs:
        return []
    from .tools.mcp import MCPServer

    return [
        MCPServer(url=spec.strip()) if spec.strip().startswith(("http://", "https://"))
        else MCPServer(spec)
        for spec in specs
    ]


def _store(args: argparse.Namespace) -> Any:
    from .storage import open_store

    return open_store(args.db)


def _json_line(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, default=str), flush=True)


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value or "")


def _safe(text: str) -> str:
    """``text`` with every control, format (bidi, zero-width) or unassigned character shown as
    an escape, so what a model wrote cannot move the cursor, recolour or reorder the screen."""
    return "".join(
        ch if ch == " " or unicodedata.category(ch)[0] not in "CZ"
        or unicodedata.category(ch) == "Zs" else
        (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000
         else f"\\U{ord(ch):08x}")
        for ch in text
    )


def _call_text(call: Any, limit: int) -> str:
    """``name({args})`` of a call (a dict or an event), escaped and cut at ``limit`` chars."""
    name = call["name"] if isinstance(call, dict) else call.name
    args = call["args"] if isinstance(call, dict) else call.args
    text = _safe(f"{name}({json.dumps(args, ensure_ascii=False, default=str)})")
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text) - limit} more characters)"
    return text


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", help="database file or URL (default: $COGENCY_DB or the "
                                     "user data directory)")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    user = argparse.ArgumentParser(add_help=False)
    user.add_argument("--user", default="default", help="user id (default: %(default)s)")
    agent = argparse.ArgumentParser(add_help=False)
    agent.add_argument("--llm", help="model: openai:MODEL, anthropic:MODEL, gemini:MODEL, "
                                       "ollama:MODEL, local, local:/path.gguf, or "
                                       "module:factory (default: $COGENCY_LLM, API keys, local)")
    agent.add_argument("--tools", default="", help=f"built-in tools, comma separated: "
                                                   f"{','.join(TOOL_SETS)}")
    agent.add_argument("--root", default=".", help="directory the files and shell tools are "
                                                   "confined to (default: current)")
    agent.add_argument("--mcp", action="append", metavar="COMMAND_OR_URL",
                       help='an MCP server\'s tools: "command args" (stdio) or an http(s) URL; '
                            "repeatable")
    agent.add_argument("--max-iterations", type=int, default=10)
    agent.add_argument("--yes", "-y", action="store_true",
                       help="allow every tool call that needs approval, without asking")
    agent.add_argument("--read-only", action="store_true",
                       help="give the model only tools that change nothing")
    running = argparse.ArgumentParser(add_help=False, parents=[agent])
    running.add_argument("--json", action="store_true", help="events as JSON lines")

    parser = argparse.ArgumentParser(
        prog="cogency", description="Stateful LLM agents: run tasks, inspect what is stored."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", parents=[common, user, running], help="run a task")
    run.add_argument("query")
    run.add_argument("--conversation", help="continue this conversation")
    run.set_defaults(handler=_run)
    resume = commands.add_parser("resume", parents=[common, user, running],
                                 help="continue an unfinished task")
    resume.add_argument("task_id")
    resume.set_defaults(handler=_run)
    approve = commands.add_parser("approve", parents=[common, user, running],
                                  help="decide the tool calls a paused task waits for, then "
                                       "continue it")
    approve.add_argument("task_id")
    approve.add_argument("--deny", action="append", default=[], metavar="CALL_ID",
                         help="deny this call (repeatable); every other waiting call is allowed")
    approve.add_argument("--deny-all", action="store_true", help="deny every waiting call")
    approve.set_defaults(handler=_run)
    mcp = commands.add_parser("mcp", parents=[common, user, agent],
                              help="serve an agent over MCP (stdio) for the user")
    mcp.set_defaults(handler=_mcp)
    tasks = commands.add_parser(
        "tasks", parents=[common],
        help="list unfinished tasks, or: tasks release TASK_ID --user USER (take a task from "
             "a runner known to be dead)")
    tasks.add_argument("release", nargs="?", choices=["release"], help=argparse.SUPPRESS)
    tasks.add_argument("task_id", nargs="?", help=argparse.SUPPRESS)
    tasks.add_argument("--user", help="only this user's")
    tasks.add_argument("--json", action="store_true")
    tasks.set_defaults(handler=_tasks)
    conversations = commands.add_parser("conversations", parents=[common, user],
                                        help="list conversations, or: conversations show ID")
    conversations.add_argument("show", nargs="?", choices=["show"], help=argparse.SUPPRESS)
    conversations.add_argument("conversation_id", nargs="?")
    conversations.add_argument("--json", action="store_true")
    conversations.set_defaults(handler=_conversations)
    profile = commands.add_parser("profile", parents=[common],
                                  help="show or forget what is known of a user")
    profile.add_argument("action", choices=["show", "forget"])
    profile.add_argument("user_id")
    profile.set_defaults(handler=_profile)
    from .server.commands import add_commands  # `serve` and `keys`

    add_commands(commands, common, agent)
    return parser


if __name__ == "__main__":
    sys.exit(main())
