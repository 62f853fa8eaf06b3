"""The ``cogency`` command: run and resume tasks, and look at what is stored.

argparse and a few ANSI codes rather than typer/rich: the command starts in about half the
time (typer and rich import in ~0.5 s on a busy machine, more than the rest of cogency) and
works from the core install, with no extra dependency.

    cogency run "query" [--user U] [--conversation C] [--llm L] [--tools files,shell,http]
                        [--mcp "command args"]... [--yes | --read-only]
    cogency resume TASK_ID
    cogency approve TASK_ID [--deny CALL_ID ...]
    cogency mcp [--user U] [--llm L] [--db URL]   (an agent served over MCP on stdio)
    cogency tasks [release TASK_ID --user U] | conversations [ID]
    cogency profile show|history|set|remove|export|import|forget ...
    cogency serve [--db URL] [--llm L] [--port P] | keys create|list|revoke  (server/commands.py)

A tool call that needs approval (file writes, shell) is asked about on the terminal
(``[y/N]``); ``--yes`` allows them all. Without a terminal on stdin the task pauses, the
command that decides it is printed, and the exit status is 3.

Each subcommand is one ``_add_*`` function in :data:`COMMANDS` that declares its parser and
handler; a new subcommand is one more function there. Errors print one line (``error: …``)
on stderr and exit 1 (``--debug`` adds the traceback); Ctrl-C exits 130 and leaves the task
resumable. Everything printed that came from a model, a tool or the database goes through
:func:`visible`: terminal control characters are shown as escapes, never interpreted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import os
import re
import shlex
import sys
import time
import traceback
import unicodedata
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ._telemetry_setup import configure as configure_telemetry
from .tools.spec import TOOL_SETS, builtin_tools, mcp_servers

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_AWAITING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
OUTPUT_CHARS = 400
"""A tool's output is cut to this on screen (the model and the database get all of it)."""
ASK_CHARS = 2_000
"""A call's arguments shown when asking for approval (longer ones are cut, and say so)."""
MAX_QUERY_BYTES = 16 * 1024 * 1024
"""The most a query read from standard input may hold."""
LOAD_NOTICE = 0.5
"""Seconds a model may take to get ready before the command says it is loading it."""
WAIT_NOTICE = 10.0
"""Seconds without any event before the command says what it is still waiting for."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cogency`` console script; returns the exit status."""
    _safe_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    progress: dict[str, Any] = {}
    try:
        args.telemetry = configure_telemetry(metrics=getattr(args, "metrics", False))
        outcome = args.handler(args, progress)
        return int(asyncio.run(outcome) if inspect.iscoroutine(outcome) else outcome)
    except BrokenPipeError:  # stdout was closed (`cogency tasks | head -1`): nothing to say
        _stdout_closed()
        return EXIT_OK
    except KeyboardInterrupt:
        task = progress.get("task_id")
        hint = f"; resume with: {command_hint(args, 'resume', task)}" if task else ""
        print(f"\ninterrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into a line
        if args.debug:
            traceback.print_exc()
        message = _concrete(str(exc) or type(exc).__name__, args, progress.get("task_id"))
        print(f"error: {visible(message)}", file=sys.stderr)
        return EXIT_ERROR
    finally:  # exports what the command traced (a no-op unless OTEL_* asked for it)
        if getattr(args, "telemetry", None) is not None:
            args.telemetry.close()


def _concrete(message: str, args: argparse.Namespace, task: str | None) -> str:
    """``message`` with the library's generic command suggestions (`cogency tasks`, …) made
    into commands that work as printed for this invocation."""
    task = task or getattr(args, "task_id", None)
    if task:
        message = message.replace("`cogency tasks release TASK_ID --user USER`",
                                  command_hint(args, "tasks", "release", task))
    return (message
            .replace("`cogency conversations --user USER`", command_hint(args, "conversations"))
            .replace("`cogency tasks`", command_hint(args, "tasks")))


# -- the parser: one function per subcommand --------------------------------------------------


@dataclass
class Commands:
    """The subcommand registry handed to each ``_add_*`` function.

    ``add(name, help, handler, *parents)`` returns the new subparser; ``parents`` name the
    shared option groups: ``"db"`` (``--db``, ``--debug``), ``"user"`` (``--user``),
    ``"agent"`` (model, tools, root, iterations, MCP servers) and ``"running"`` (``"agent"``,
    learning, and how a run is shown).
    """

    subparsers: Any
    parents: dict[str, argparse.ArgumentParser]

    def add(
        self,
        name: str,
        help: str,
        handler: Callable[[argparse.Namespace, dict[str, Any]], Any],
        *parents: str,
        description: str | None = None,
    ) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self.subparsers.add_parser(
            name,
            help=help,
            description=description or help[:1].upper() + help[1:] + ".",
            parents=[self.parents[parent] for parent in ("db", *parents)],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(handler=handler)
        return parser


def _add_run(commands: Commands) -> None:
    run = commands.add(
        "run", "run a task: stream the agent's thinking, tool calls and answer", _run,
        "user", "running",
        description="Run a task and stream the agent's steps.\n\nexamples:\n"
                    "  cogency run \"What is 2 + 2?\"\n"
                    "  cogency run - < question.txt          # the query from standard input\n"
                    "  git diff | cogency run -               # long input through a pipe",
    )
    run.add_argument("query", nargs="?", help="what to do; '-' (or nothing, with a pipe) "
                                              "reads it from standard input")
    run.add_argument("--conversation", metavar="ID",
                     help="continue this conversation (it must exist: `cogency conversations` "
                          "lists them); leave out to start a new one")


def _add_resume(commands: Commands) -> None:
    resume = commands.add(
        "resume", "continue an unfinished task", _run, "user", "running",
        description="Continue an unfinished task. It runs with the tools, root, MCP servers "
                    "and model it was started with, unless --tools, --root, --mcp or --llm say "
                    "otherwise.",
    )
    resume.add_argument("task_id", help="the task to continue (`cogency tasks` lists them)")


def _add_approve(commands: Commands) -> None:
    approve = commands.add(
        "approve", "decide the tool calls a paused task waits for, then continue it", _run,
        "user", "running",
    )
    approve.add_argument("task_id", help="the paused task (`cogency tasks` shows what it "
                                         "waits for)")
    approve.add_argument("--deny", action="append", default=[], metavar="CALL_ID",
                         help="deny this call (repeatable); every other waiting call is allowed")
    approve.add_argument("--deny-all", action="store_true", help="deny every waiting call")


def _add_server(commands: Commands) -> None:
    from .server.commands import add_commands  # `serve` and `keys`

    add_commands(commands.subparsers, commands.parents["db"], commands.parents["agent"])


def _add_mcp(commands: Commands) -> None:
    mcp = commands.add("mcp", "serve an agent over MCP (stdio) for the user", _mcp, "user",
                       "agent")
    mcp.add_argument("--no-memory", action="store_true",
                     help="do not learn the user's profile from the tasks it runs (learning is "
                          "on by default, as for run and serve)")


def _add_tasks(commands: Commands) -> None:
    tasks = commands.add(
        "tasks", "list unfinished tasks (read-only), or release one", _tasks,
        description="List unfinished tasks (read-only), each with the command that resumes it.\n"
                    "\n  cogency tasks release TASK_ID --user USER\n\ntakes a task from a "
                    "runner known to be dead (its later writes are refused), so it can be "
                    "resumed at once.",
    )
    tasks.add_argument("target", nargs="*", metavar="release TASK_ID",
                       help="release this task (from a runner known to be dead)")
    tasks.add_argument("--user", help="only this user's tasks (default: every user's); the "
                                      "task's user, to release it")
    tasks.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_conversations(commands: Commands) -> None:
    conversations = commands.add(
        "conversations", "list a user's conversations, or show one's messages (read-only)",
        _conversations, "user",
        description="List a user's conversations (newest first), or show one's messages.\n\n"
                    "  cogency conversations --user alice\n"
                    "  cogency conversations ID --user alice   (also: conversations show ID)",
    )
    conversations.add_argument("target", nargs="*", metavar="ID",
                               help="a conversation to show (`show ID` works too)")
    conversations.add_argument("--json", action="store_true", help="one JSON object per line")


PROFILE_ACTIONS = ("show", "history", "set", "remove", "export", "import", "forget")


def _add_profile(commands: Commands) -> None:
    profile = commands.add(
        "profile", "show, correct, export or forget what is known of a user", _profile, "user",
        description="What is known of a user, and where it came from.\n\n"
                    "  cogency profile show [USER] [--why]     the profile (--why: each entry "
                    "with the messages it was learned from)\n"
                    "  cogency profile history [USER]          entries replaced or dropped, and "
                    "why\n"
                    "  cogency profile set FIELD[.KEY] VALUE   add or change an entry as the user "
                    "(it wins over learning),\n"
                    "                                          e.g. set preferences.language Rust"
                    ", set goals 'ship v2'\n"
                    "  cogency profile remove ENTRY_ID         take an entry out (it stays in the "
                    "history)\n"
                    "  cogency profile export [USER] [-o FILE] everything stored about the user, "
                    "as one JSON document\n"
                    "  cogency profile import FILE             restore an export into a store "
                    "holding nothing of that user\n"
                    "  cogency profile forget [USER]           erase it all, and the directory "
                    "their tools had under\n"
                    "                                          `cogency serve --root` (asks first;"
                    " --yes does not), and\n"
                    "                                          print what was erased\n\n"
                    "show, history and export only read. set, remove and import act as --user "
                    "(import: the export's user unless --user is given).",
    )
    profile.add_argument("action", choices=PROFILE_ACTIONS, metavar="ACTION",
                         help=", ".join(PROFILE_ACTIONS))
    profile.add_argument("operands", nargs="*", metavar="ARG",
                         help="the user (show, history, export, forget), FIELD[.KEY] VALUE "
                              "(set), ENTRY_ID (remove), FILE (import)")
    profile.add_argument("--why", action="store_true",
                         help="show: each entry with its sources (the quoted messages, dates)")
    profile.add_argument("--json", action="store_true",
                         help="show --why, history: one JSON object per line")
    profile.add_argument("--replaces", metavar="ENTRY_ID",
                         help="set: the entry this one replaces (e.g. to correct a goal)")
    profile.add_argument("--output", "-o", metavar="FILE",
                         help="export: write the document to FILE instead of standard output")
    profile.add_argument("--yes", "-y", action="store_true",
                         help="forget without asking for confirmation")
    profile.add_argument("--root", metavar="DIR",
                         help="forget also deletes the user's tools' directory under DIR, the "
                              "--root of `cogency serve` (default: the current directory)")


COMMANDS: tuple[Callable[[Commands], None], ...] = (
    _add_run, _add_resume, _add_approve, _add_mcp, _add_tasks, _add_conversations,
    _add_profile, _add_server,
)
"""Every subcommand, in the order ``cogency --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``cogency`` argument parser with every subcommand of :data:`COMMANDS`."""
    from . import __version__

    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="PATH_OR_URL",
                    help="database file, sqlite:///file.db or postgresql://… (default: "
                         "$COGENCY_DB or cogency.db in the user data directory); "
                         "sqlite:///file.db?synchronous=full makes every commit survive a "
                         "power loss, not only a crash")
    db.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    user = argparse.ArgumentParser(add_help=False)
    user.add_argument("--user", default="default", help="user id (default: %(default)s)")
    agent = argparse.ArgumentParser(add_help=False)
    agent.add_argument("--llm", metavar="MODEL",
                         help="openai:MODEL, anthropic:MODEL, gemini:MODEL, ollama:MODEL, local, "
                              "local:/path.gguf, or package.module:factory (default: "
                              "$COGENCY_LLM, else the first API key set, else local)")
    agent.add_argument("--tools", metavar="SETS",
                         help=f"built-in tools, comma separated: {','.join(TOOL_SETS)} "
                              "(default: none; resume: the task's own)")
    agent.add_argument("--root", metavar="DIR",
                         help="directory the files and shell tools are confined to (default: "
                              "the current one; resume: the task's own)")
    agent.add_argument("--max-iterations", type=int, default=10, metavar="N",
                         help="stop after N reasoning steps (default: %(default)s)")
    agent.add_argument("--mcp", action="append", metavar="COMMAND_OR_URL",
                       help='an MCP server\'s tools: "command args" (stdio) or an http(s) URL; '
                            "repeatable")
    agent.add_argument("--yes", "-y", action="store_true",
                       help="allow every tool call that needs approval, without asking")
    agent.add_argument("--read-only", action="store_true",
                       help="give the model only tools that change nothing")
    running = argparse.ArgumentParser(add_help=False, parents=[agent])
    running.add_argument("--no-memory", action="store_true",
                         help="do not learn the user's profile from this task (learning is on "
                              "by default; `cogency profile show` shows what was learned)")
    running.add_argument("--json", action="store_true",
                         help="print events as JSON lines instead of text")
    running.add_argument("--tokens", action="store_true",
                         help="with --json, also print the model's reply as it streams "
                              "(token and response_delta events)")
    running.add_argument("--wait-notice", type=float, default=WAIT_NOTICE, metavar="SECONDS",
                         help="say what the run is waiting for after this long without news "
                              "(default: %(default)g)")

    parser = argparse.ArgumentParser(
        prog="cogency",
        description="Stateful LLM agents: run tasks, inspect what is stored.",
        epilog="`cogency COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"cogency {__version__}",
                        help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                       help="what to do (`cogency COMMAND --help` for more)")
    commands = Commands(subparsers, {"db": db, "user": user, "agent": agent, "running": running})
    for add in COMMANDS:
        add(commands)
    return parser


# -- commands ---------------------------------------------------------------------------------


async def _run(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .errors import NotFoundError, UsageError
    from .state.state import check_id

    resuming = args.command != "run"  # resume, approve
    query = "" if resuming else read_query(args.query)
    if not resuming and not query.strip():
        raise UsageError("the query is empty: say what to do, e.g. cogency run 'What is 2 + 2?'")
    check_id(args.user, "--user")
    _log_to_stderr()
    store = _store(args)
    ask = _Ask() if not args.yes and _isatty(sys.stdin) else None  # else: tasks pause
    try:
        # Everything that can be checked is, before a model loads (seconds for the offline
        # one): the database opens, and can be written.
        await _ready_to_write(store, args.user)
        stored: dict[str, Any] = {}
        if resuming:
            check_id(args.task_id, "task id")
            try:
                stored = (await store.load_task(args.task_id, args.user)).settings
            except NotFoundError:
                raise NotFoundError(
                    f"no unfinished task {args.task_id!r} for user {args.user!r}; list them "
                    f"with: {command_hint(args, 'tasks')}"
                ) from None
        elif args.conversation is not None:
            check_id(args.conversation, "--conversation")
            try:
                await store.load_conversation(args.conversation, args.user)
            except NotFoundError:
                raise UsageError(
                    f"no conversation {args.conversation!r} for user {args.user!r}; list them "
                    f"with: {command_hint(args, 'conversations')} (leave out --conversation to "
                    "start a new conversation)"
                ) from None
        tools = args.tools if args.tools is not None else stored.get("tools", "")
        root = Path(args.root if args.root is not None else stored.get("root", ".")).resolve()
        llm = args.llm if args.llm is not None else stored.get("llm")
        mcp = args.mcp if args.mcp is not None else stored.get("mcp")
        decisions = await _decisions(store, args) if args.command == "approve" else None
        async with _agent(args, store, llm, tools, root, mcp, memory=not args.no_memory,
                          ask=ask) as agent:
            await _start_model(agent.llm)
            if resuming:
                events = agent.resume_stream(args.task_id, args.user, approvals=decisions)
            else:
                settings: dict[str, Any] = {"tools": tools, "root": str(root)}
                if llm and not _has_secret(llm):
                    settings["llm"] = llm
                if mcp and not any(_has_secret(spec) for spec in mcp):
                    settings["mcp"] = mcp
                events = agent.stream(query, args.user, args.conversation, settings=settings)
            code = await _show(events, args, progress, ask)
            if agent.memory is not None and agent.memory.learning(args.user):  # close() waits
                print(f"learning about {visible(args.user, keep='')!r} from this task… "
                      "(--no-memory skips this)", file=sys.stderr, flush=True)
        return code
    finally:
        await store.close()


async def _ready_to_write(store: Any, user: str) -> None:
    """Open ``store`` (connect, migrate) and make sure this process can write it, so that a
    missing database, directory or permission is said at once, not after the model loads."""
    from .errors import StorageError

    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:" and not path.startswith("file:"):
        file = Path(path).expanduser()
        for where in (file, file.parent) if file.exists() else (file.parent,):
            if where.exists() and not os.access(where, os.W_OK):
                raise StorageError(
                    f"the database {path!r} cannot be written by this process ({where} is "
                    "read-only); a run stores its task: pass a writable --db (`cogency "
                    "tasks` and `conversations` read a read-only file)"
                )
    await store.load_profile(user)


async def _decisions(store: Any, args: argparse.Namespace) -> dict[str, bool]:
    """What ``cogency approve`` decides: every pending call approved, but those ``--deny``."""
    from .errors import NotFoundError, UsageError

    pending = [call["id"] for call in
               await store.load_approvals(args.task_id, args.user, "pending")]
    if not pending:
        raise UsageError(
            f"task {args.task_id!r} waits for no approval; continue it with: "
            f"{command_hint(args, 'resume', args.task_id)}"
        )
    unknown = [call_id for call_id in args.deny if call_id not in pending]
    if unknown:
        raise NotFoundError(
            f"task {args.task_id!r} has no call {visible(unknown[0], keep='')!r} waiting for "
            f"approval (waiting: {', '.join(pending)})"
        )
    return {call_id: not (args.deny_all or call_id in args.deny) for call_id in pending}


async def _start_model(llm: Any) -> None:
    """Get the model ready before the run; say so when that takes a while (the offline model
    loads, or is fetched the first time), so the screen is never blank meanwhile."""
    began = time.monotonic()
    starting = asyncio.ensure_future(llm.start())
    done, _ = await asyncio.wait({starting}, timeout=LOAD_NOTICE)
    if not done:
        print(f"loading the model ({visible(llm.name)})…", file=sys.stderr, flush=True)
        await starting
        print(f"model loaded in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    starting.result()


async def _mcp(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .mcp_server import serve_stdio
    from .tools.mcp import require_sdk

    require_sdk()
    store = _store(args)
    try:
        root = Path(args.root or ".").resolve()
        async with _agent(args, store, args.llm, args.tools, root, args.mcp,
                          memory=not args.no_memory) as agent:
            await serve_stdio(agent, args.user)
    finally:
        await store.close()
    return EXIT_OK


@contextlib.asynccontextmanager
async def _agent(args: argparse.Namespace, store: Any, llm: str | None, tools: str | None,
                 root: Path, mcp: Sequence[str] | None, *, memory: bool,
                 ask: Any = None) -> AsyncIterator[Any]:
    """The agent of a command; it learns with ``memory`` unless its model cannot (the default
    offline model is too small: asking it would only print a warning on every run). ``ask``
    decides calls that need approval (``--yes`` allows them all; with neither, a task pauses
    at such a call)."""
    from .agent import Agent
    from .llm.resolve import resolve_llm

    servers = mcp_servers(mcp, read_only=args.read_only)
    model, owned = resolve_llm(llm)
    try:
        async with Agent(
            llm=model,
            tools=[*builtin_tools(tools, root, read_only=args.read_only), *servers],
            store=store,
            memory=memory and getattr(model, "learns", True),
            max_iterations=args.max_iterations,
            approve=True if args.yes else ask,
        ) as agent:
            yield agent
    finally:
        if owned:
            await model.close()


async def _tasks(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .errors import UsageError

    if args.target:
        if args.target[0] != "release" or len(args.target) != 2 or not args.user:
            raise UsageError("to release a task: cogency tasks release TASK_ID --user USER"
                             " (without operands, cogency tasks lists them)")
        return await _release(args, args.target[1])
    store = _read_store(args)
    if store is None:
        print("no unfinished tasks (nothing is stored yet)")
        return EXIT_OK
    try:
        tasks = await store.list_tasks(args.user)
    finally:
        await store.close()
    if args.json:
        for task in tasks:
            _json_line({"task_id": task.task_id, "user_id": task.user_id,
                        "conversation_id": task.conversation_id, "query": task.query,
                        "workspace": task.workspace, "settings": task.settings,
                        "updated_at": _iso(task.updated_at),
                        "pending_approvals": task.pending_approvals})
        return EXIT_OK
    if not tasks:
        print("no unfinished tasks")
        return EXIT_OK
    style = _Style(sys.stdout)
    for task in tasks:
        print(f"{style.bold(visible(task.task_id, keep=''))}  {visible(task.user_id, keep='')}  "
              f"{_iso(task.updated_at)}  {visible(_clip(task.query, 60))}")
        for call in task.pending_approvals:
            print(style.yellow(f"  waits for approval: {visible(call['id'], keep='')}  ")
                  + _call_text(call, 200))
        if task.pending_approvals:
            decide = command_hint(args, "approve", task.task_id, user=task.user_id)
            print(style.dim(f"  approve: {decide}  (deny one: add --deny CALL_ID)"))
        else:
            resume = command_hint(args, "resume", task.task_id, user=task.user_id)
            print(style.dim(f"  resume: {resume}"))
    return EXIT_OK


async def _release(args: argparse.Namespace, task_id: str) -> int:
    from .state.state import check_id

    check_id(task_id, "task id")
    check_id(args.user, "--user")
    store = _store(args)
    try:
        runner = await store.force_release(task_id, args.user)
    finally:
        await store.close()
    held = f" from runner {visible(runner, keep='')}" if runner else " (no runner held it)"
    print(f"released task {visible(task_id, keep='')}{held}; its later writes are refused. "
          f"Resume it with: {command_hint(args, 'resume', task_id)}")
    return EXIT_OK


async def _conversations(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .errors import UsageError
    from .state.state import check_id

    target = list(args.target)
    if target[:1] == ["show"]:
        target = target[1:]
    if len(target) > 1:
        raise UsageError(
            f"give one conversation id, e.g.: {command_hint(args, 'conversations', target[-1])}"
        )
    check_id(args.user, "--user")
    store = _read_store(args)
    if store is None:
        if target:
            return await _show_conversation(None, target[0], args)
        print(f"no conversations for user {visible(args.user, keep='')!r} "
              "(nothing is stored yet)")
        return EXIT_OK
    try:
        if target:
            return await _show_conversation(store, target[0], args)
        conversations = await store.list_conversations(args.user)
    finally:
        await store.close()
    if args.json:
        for item in conversations:
            _json_line({"conversation_id": item.conversation_id, "user_id": item.user_id,
                        "messages": item.message_count, "updated_at": _iso(item.updated_at)})
        return EXIT_OK
    if not conversations:
        print(f"no conversations for user {visible(args.user, keep='')!r}")
        return EXIT_OK
    style = _Style(sys.stdout)
    for item in conversations:
        print(f"{style.bold(visible(item.conversation_id, keep=''))}  "
              f"{_count(item.message_count, 'message')}  {_iso(item.updated_at)}")
    newest = command_hint(args, "conversations", conversations[0].conversation_id)
    print(style.dim(f"show the newest: {newest}"))
    return EXIT_OK


async def _show_conversation(store: Any, conversation_id: str, args: argparse.Namespace) -> int:
    from .errors import NotFoundError
    from .state.state import check_id

    check_id(conversation_id, "conversation id")
    try:
        if store is None:
            raise NotFoundError(conversation_id)
        # NotFoundError when missing or another user's
        await store.load_conversation(conversation_id, args.user)
        messages = await store.load_messages(conversation_id, args.user)
    except NotFoundError:
        raise NotFoundError(
            f"no conversation {conversation_id!r} for user {args.user!r}; list them with: "
            f"{command_hint(args, 'conversations')}"
        ) from None
    if args.json:
        for message in messages:
            _json_line({"role": message["role"], "content": message["content"]})
        return EXIT_OK
    style = _Style(sys.stdout)
    for message in messages:
        print(f"{style.bold(visible(message['role']))}: {visible(message['content'])}")
    return EXIT_OK


async def _profile(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from .errors import UsageError
    from .state.state import check_id
    from .tools.rooms import remove_user_directories, user_directory

    action, operands = args.action, list(args.operands)
    takes = {"show": 1, "history": 1, "export": 1, "forget": 1, "remove": 1, "import": 1,
             "set": 2}[action]
    if len(operands) > takes or (action in ("set", "remove", "import") and len(operands) < takes):
        usage = {"set": "cogency profile set FIELD[.KEY] VALUE [--user U]",
                 "remove": "cogency profile remove ENTRY_ID [--user U]",
                 "import": "cogency profile import FILE [--user U]"}
        raise UsageError(f"usage: {usage.get(action, f'cogency profile {action} [USER]')}")
    if action in ("set", "remove", "import"):
        return await _profile_change(args, action, operands)
    user = operands[0] if operands else args.user
    check_id(user, "user")
    shown = repr(visible(user, keep=""))
    folder = user_directory(Path(args.root or "."), user)  # from `cogency serve --root`
    has_folder = args.action == "forget" and os.path.lexists(folder)
    store = _read_store(args)
    if store is None and not has_folder:
        print(f"nothing is stored about {shown}"
              + ("; nothing to forget" if action == "forget" else ""))
        return EXIT_OK
    from .memory import Memory

    profile, conversations, tasks = None, [], []
    if store is not None:
        memory = Memory(store=store)
        try:
            if action == "show":
                return await _profile_show(memory, user, shown, args)
            if action == "history":
                return _profile_history(await memory.history(user), args)
            if action == "export":
                return _profile_export(await memory.export_user(user), args)
            profile = await store.load_profile(user)
            conversations = await store.list_conversations(user)
            tasks = await store.list_tasks(user)
        finally:
            await store.close()
    stored = profile is not None or bool(conversations) or bool(tasks)
    if not stored and not has_folder:
        print(f"nothing is stored about {shown}; nothing to forget")
        return EXIT_OK
    messages = sum(item.message_count for item in conversations)
    parts = [f"the profile, {_count(len(conversations), 'conversation')} "
             f"({_count(messages, 'message')}) and {_count(len(tasks), 'unfinished task')}"
             ] if stored else []
    if has_folder:
        parts.append(f"their tools' directory {visible(str(folder))}")
    what = " and ".join(parts)
    if not args.yes and not _confirm(f"erase everything stored about {shown}: {what}?"):
        print("nothing was erased")
        return EXIT_ERROR
    from .agent import forget_user

    roots = [folder.parent] if has_folder else []
    if store is None:  # no database: only the directory (opening one would create it)
        directory, files = await asyncio.to_thread(remove_user_directories, roots, user)
        print(f"forgot {shown}: {_removed_text(directory, files)}")
        return EXIT_OK
    writable = _store(args)
    try:
        receipt = await forget_user(writable, user, memory=Memory(store=writable), roots=roots)
    finally:
        await writable.close()
    print(f"forgot {shown}: {_receipt_text(receipt.erased())}; "
          f"{_removed_text(receipt.tool_directory, receipt.tool_files)}; learning that was in "
          f"flight is fenced out (generation {receipt.generation})")
    return EXIT_OK


_KINDS = {
    "profiles": ("profile", "profiles"), "entries": ("profile entry", "profile entries"),
    "history": ("history entry", "history entries"),
    "conversations": ("conversation", "conversations"), "messages": ("message", "messages"),
    "tasks": ("unfinished task", "unfinished tasks"), "approvals": ("approval", "approvals"),
    "pending_learning": ("task queued for learning", "tasks queued for learning"),
}


def _removed_text(directory: str | None, files: int) -> str:
    """What a forget removed of the user's tools' directory."""
    if directory is None:
        return "no tools' directory"
    return f"their tools' directory {visible(directory)} ({_count(files, 'file')}) deleted"


def _receipt_text(counts: dict[str, int]) -> str:
    """``counts`` per kind (a forget's or an import's) as one line."""
    return ", ".join(f"{counts.get(kind, 0)} {one if counts.get(kind, 0) == 1 else many}"
                     for kind, (one, many) in _KINDS.items())


async def _profile_show(memory: Any, user: str, shown: str, args: argparse.Namespace) -> int:
    profile = await memory.profile(user)
    status = await memory.status(user)
    if profile is None and status is None:
        print(f"nothing is stored about {shown}")
        return EXIT_OK
    if not args.why:
        if profile is not None:
            _json_line(profile.to_dict(), indent=2)
        if status is not None:  # a note beside the JSON, never inside it
            print(f"note: {_status_text(status)}", file=sys.stderr)
        return EXIT_OK
    explained = await memory.explain(user)
    if args.json:
        for item in explained:
            _json_line(item)
        if status is not None:
            _json_line({"learning": status.to_dict()})
        return EXIT_OK
    style = _Style(sys.stdout)
    noun = "entry" if len(explained) == 1 else "entries"
    print(style.bold(f"{shown}: {len(explained)} {noun}"))
    for item in explained:
        print(_entry_line(item, style))
        older = len(item["sources"]) - 3 + item["sources_omitted"]
        if older > 0:
            print(style.dim(f"    … {_count(older, 'older source')} (--json lists them)"))
        for source in item["sources"][-3:]:
            task = visible(str(source.get("task_id") or "?"), keep="")
            print(style.dim(f"    {_day(source.get('at'))} task {task} "
                            f"({visible(str(source.get('model') or 'unknown model'))})"))
            for quote in source.get("quotes", []):
                print(f"      {visible(quote['role'], keep='')}: "
                      f"\u201c{visible(quote['content'], keep='')}\u201d")
            if "quotes" in source and not source["quotes"]:
                print(style.dim("      (its messages are no longer stored)"))
    if status is not None:
        print(style.yellow(f"learning: {_status_text(status)}"))
    return EXIT_OK


def _entry_line(item: dict[str, Any], style: _Style) -> str:
    name = f"{item['field']}.{item['key']}" if item["key"] else item["field"]
    if item["origin"] == "user":
        how = f"yours, set {_day(item['created_at'])}"
    else:
        verb = "consolidated" if item["origin"] == "consolidated" else "learned"
        how = (f"{verb} {_day(item['created_at'])} by {item.get('model') or 'a model'}, "
               f"{_count(len(item['sources']) + item['sources_omitted'], 'source')}")
    return (f"{style.bold(visible(name, keep=''))}: {visible(item['value'], keep='')}  "
            + style.dim(f"[{visible(how, keep='')}]  id {item['entry_id']}"))


def _status_text(status: Any) -> str:
    text = (f"{_count(status.pending, 'finished task')} "
            f"{'waits' if status.pending == 1 else 'wait'} to be learned")
    if status.claimed:
        text += " (being learned now)"
    if status.attempts:
        text += (f"; {_count(status.attempts, 'attempt')} failed, the last with "
                 f"{visible(status.last_error or '?', keep='')}; next try at "
                 f"{_iso(status.next_attempt_at)} or with the next task")
    if status.dropped:
        text += f"; {status.dropped} older ones were left out (too many waited)"
    return text


def _profile_history(entries: list[Any], args: argparse.Namespace) -> int:
    from .memory.entries import REASONS

    if args.json:
        for entry in entries:
            _json_line(entry.to_dict())
        return EXIT_OK
    if not entries:
        print("no history: nothing was replaced or dropped")
        return EXIT_OK
    style = _Style(sys.stdout)
    for entry in entries:
        by = f" by {entry.superseded_by}" if entry.superseded_by else ""
        print(f"{_iso(entry.superseded_at)}  {visible(entry.label(), keep='')}  "
              + style.dim(f"({entry.reason}{by}: {REASONS.get(entry.reason or '', '')}; "
                          f"{entry.origin} {_day(entry.created_at.isoformat())})"))
    return EXIT_OK


def _profile_export(document: dict[str, Any], args: argparse.Namespace) -> int:
    text = json.dumps(document, ensure_ascii=False, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(json_text(document, indent=1), flush=True)
    return EXIT_OK


async def _profile_change(args: argparse.Namespace, action: str, operands: list[str]) -> int:
    from .errors import UsageError
    from .memory import Memory
    from .state.state import check_id

    store = _store(args)
    memory = Memory(store=store)
    try:
        if action == "import":
            document = _read_document(operands[0])
            user = args.user if args.user != "default" else None
            stored = await memory.import_user(document, user_id=user)
            print(f"imported {_receipt_text(stored)}")
            return EXIT_OK
        check_id(args.user, "--user")
        if action == "remove":
            entry = await memory.remove_entry(args.user, operands[0])
            print(f"removed {visible(entry.label(), keep='')} (entry {entry.entry_id}); it "
                  f"stays in the history: {command_hint(args, 'profile', 'history')}")
            return EXIT_OK
        name, _, key = operands[0].partition(".")
        if not key and "." in operands[0]:
            raise UsageError("give FIELD.KEY with a key after the dot, e.g. preferences.language")
        entry = await memory.set_entry(args.user, name, operands[1], key=key or None,
                                       replaces=args.replaces)
        print(f"set {visible(entry.label(), keep='')} (entry {entry.entry_id}); learning never "
              "replaces it")
        return EXIT_OK
    finally:
        await store.close()


def _read_document(path: str) -> Any:
    from .errors import UsageError

    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path!r} is not a JSON document (`cogency profile export` writes "
                         f"one): {type(exc).__name__}") from exc


def _day(value: Any) -> str:
    return str(value or "")[:10]


def _confirm(question: str) -> bool:
    from .errors import UsageError

    if not _isatty(sys.stdin):
        raise UsageError(
            f"{question} Standard input is not a terminal, so it cannot ask: add --yes to confirm"
        )
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


# -- streaming a run --------------------------------------------------------------------------


async def _show(events: AsyncIterator[Any], args: argparse.Namespace,
                progress: dict[str, Any], ask: _Ask | None = None) -> int:
    view = None if args.json else _View(sys.stdout, sys.stderr)
    if ask is not None:
        ask.view = view
    waiting: list[Any] = []
    watch = _Watch(args.wait_notice, view)
    watcher = asyncio.get_running_loop().create_task(watch.run())
    fatal: str | None = None
    end: Any = None
    try:
        async for event in events:
            watch.saw(event)
            progress.setdefault("task_id", event.task_id)
            if event.type == "error" and event.fatal:
                fatal = event.message
            if event.type == "approval":
                waiting.append(event)
            if event.type == "end":
                end = event
            if view is not None:
                view.show(event)
            elif event.type not in ("token", "response_delta") or args.tokens:
                _json_line(event.to_dict())
    finally:
        watcher.cancel()
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
        fatal = f"the task stopped ({end.stop_reason}) after {_count(end.iterations, 'iteration')}"
    print(f"error: {visible(fatal)}; resume with: {command_hint(args, 'resume', end.task_id)}",
          file=sys.stderr)
    return EXIT_ERROR


def _tell_how_to_decide(task_id: str, waiting: list[Any], args: argparse.Namespace) -> None:
    """Print what the paused task waits for, and the commands that decide it (the task keeps
    its tools, root and model, so ``--user`` and ``--db`` are all they need)."""
    count = len(waiting)
    lines = [f"task {visible(task_id, keep='')} waits for your approval of "
             f"{_count(count, 'call')} (no terminal to ask on):"]
    lines += [f"  {visible(event.id, keep='')}  {_call_text(event, 300)}" for event in waiting]
    decide = command_hint(args, "approve", task_id)
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


def _call_text(call: Any, limit: int) -> str:
    """``name({args})`` of a call (a dict or an event), escaped and cut at ``limit`` chars."""
    name = call["name"] if isinstance(call, dict) else call.name
    args = call["args"] if isinstance(call, dict) else call.args
    text = visible(f"{name}({json.dumps(args, ensure_ascii=False, default=str)})", keep="")
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text) - limit} more characters)"
    return text


class _Watch:
    """Says what a run waits for when no event came for ``every`` seconds, and again after
    each further ``every`` seconds: a hung server never means minutes of silence."""

    def __init__(self, every: float, view: _View | None) -> None:
        self.every = every
        self.view = view
        self.last = time.monotonic()
        self.next = every
        self.waiting_for = "the model"

    def saw(self, event: Any) -> None:
        self.last, self.next = time.monotonic(), self.every
        if event.type == "action":
            self.waiting_for = f"the tool {visible(event.name, keep='')}"
        elif event.type != "token":
            self.waiting_for = "the model"

    async def run(self) -> None:
        if self.every <= 0:
            return
        while True:
            await asyncio.sleep(min(1.0, self.every / 4))
            quiet = time.monotonic() - self.last
            if quiet >= self.next:
                self.next += self.every
                note = (f"… still waiting for {self.waiting_for}: nothing for {quiet:.0f} s "
                        "(Ctrl-C stops; the task stays resumable)")
                if self.view is not None:
                    self.view.notice(note)
                else:
                    print(note, file=sys.stderr, flush=True)


class _View:
    """Renders events for a person: thinking, tool calls and results, then the answer."""

    def __init__(self, out: IO[str], status: IO[str]) -> None:
        self.out = out
        self.status = status
        self.style = _Style(out)
        self.spinner = _Spinner(status) if _isatty(status) else None
        self.workspace: dict[str, str] = {}
        if self.spinner:
            self.spinner.start("thinking")

    def show(self, event: Any) -> None:
        kind = event.type
        if kind in ("token", "response_delta"):  # the answer is shown whole, when stored
            if self.spinner and kind == "token":
                self.spinner.grow(len(event.text))
            return
        if self.spinner:
            self.spinner.clear()
        style = self.style
        if kind == "start":
            verb = "resuming" if event.resumed else "task"
            self._line(style.dim(f"{verb} {visible(event.task_id, keep='')} · conversation "
                                 f"{visible(event.conversation_id, keep='')}"))
        elif kind == "reason":
            for name, value in event.workspace.items():
                if value and self.workspace.get(name) != value:
                    self._line(style.dim(f"  {visible(name)}: ") + visible(_clip(value, 300)))
            self.workspace = dict(event.workspace)
        elif kind == "action":
            args = json.dumps(event.args, ensure_ascii=False, default=str)
            self._line(style.cyan(f"→ {visible(event.name)}")
                       + style.dim(f"({visible(_clip(args, 200))})"))
        elif kind == "approval":
            self._line(style.yellow(f"⏸ {visible(event.name)} waits for approval "
                                    f"({visible(event.id, keep='')})"))
        elif kind == "result":
            mark = style.green("✓") if event.ok else style.red("✗")
            self._line(f"{mark} {visible(event.name)}: "
                       f"{visible(_clip(str(event.output), OUTPUT_CHARS))}")
        elif kind == "response":
            self._line("")
            self._line(style.bold(visible(event.text)))
        elif kind == "retry":
            self._line(style.yellow(f"! {visible(event.reason)}: retrying in {event.delay:.1f} s "
                                    f"(retry {event.attempt})"))
        elif kind == "error":
            if not event.fatal:
                self._line(style.yellow(f"! {visible(event.message)}"))
        elif kind == "end":
            self._line(style.dim(f"{visible(event.stop_reason)} · "
                                 f"{_count(event.iterations, 'iteration')}"))
            return
        if self.spinner and kind != "response":
            self.spinner.start("working" if kind in ("action", "result") else "thinking")

    def notice(self, text: str) -> None:
        """A line on the status stream (the spinner, when there is one, shows it instead)."""
        if self.spinner:
            self.spinner.note = text.removeprefix("… ").split(":")[0]
            return
        print(text, file=self.status, flush=True)

    def stop(self) -> None:
        if self.spinner:
            self.spinner.stop()

    def _line(self, text: str) -> None:
        _print_out(text, self.out)


class _Spinner:
    """A one-line spinner on a terminal, redrawn by a task until an event clears it; it shows
    how long it has been spinning."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.label = ""
        self.note = ""
        self.chars = 0
        self.began = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self, label: str) -> None:
        self.label, self.chars, self.note = label, 0, ""
        self.began = time.monotonic()
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
            seconds = time.monotonic() - self.began
            clock = f" {seconds:.0f} s" if seconds >= 2 else ""
            note = f" · {self.note}" if self.note else ""
            self.stream.write(f"\r\033[2K{self.FRAMES[frame % len(self.FRAMES)]} "
                              f"{self.label}…{extra}{clock}{note}")
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


# -- what is printed --------------------------------------------------------------------------

_DANGEROUS = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
"""Controls (ESC, BEL, backspace, CR, C1 such as CSI), format characters (bidi overrides,
zero-width), lone surrogates and line/paragraph separators: never sent to a terminal raw."""
TEXT_KEEPS = "\n\t\u200c\u200d"
"""What free text keeps: newlines and tabs, and the zero-width (non-)joiners that Persian,
Indic scripts and emoji need. Ids keep none of them."""


_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def visible(text: str, keep: str = TEXT_KEEPS) -> str:
    """``text`` with every terminal control, format character and lone surrogate shown as an
    escape (``\\x1b``, ``\\u202e``, ``\\ud800``), so printing it can neither drive the terminal
    nor fail to encode. Characters in ``keep`` pass unchanged."""
    if text.isprintable():  # the fast path: C speed for ordinary text
        return text
    return "".join(
        _escape(ch) if ch not in keep and unicodedata.category(ch) in _DANGEROUS else ch
        for ch in text
    )


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # astral: a UTF-16 surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(data: Any, indent: int | None = None) -> str:
    """``data`` as JSON whose dangerous characters are ``\\u`` escapes (still valid JSON, and
    the same value when parsed); other non-ASCII text stays readable."""
    text = json.dumps(data, ensure_ascii=False, default=str, indent=indent)
    if text.isprintable() or (indent is not None and text.replace("\n", "").isprintable()):
        return text
    return "".join(
        _json_escape(ch) if ch != "\n" and unicodedata.category(ch) in _DANGEROUS else ch
        for ch in text
    )


def _json_line(data: Any, indent: int | None = None) -> None:
    _print_out(json_text(data, indent), sys.stdout)


def _print_out(text: str, stream: IO[str]) -> None:
    """A line of a run's output. If the reader went away (``cogency run … | head -2``), the
    rest of the output is dropped and the run goes on to its end, so its task completes (its
    answer stored) or is saved to resume, as it would have been."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        if stream is not sys.stdout:
            raise
        _stdout_closed()


def _stdout_closed() -> None:
    """Point standard output at the null device: Python's own flush at exit (and any later
    print) then has nowhere to fail, so no "Broken pipe" is printed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _safe_streams() -> None:
    """Output that cannot be encoded becomes ``\\`` escapes instead of an exception."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


class _LogLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "warning" if record.levelno >= logging.WARNING else "note"
        clear = "\r\033[2K" if _isatty(sys.stderr) else ""  # over the spinner's line
        return f"{clear}{level}: {visible(record.getMessage())}"


def _log_to_stderr() -> None:
    """Cogency's warnings (e.g. learning that failed) as lines; retries arrive as events."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogLine())
    logger = logging.getLogger("cogency")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


# -- helpers ------------------------------------------------------------------------------------


def command_hint(args: argparse.Namespace, command: str, *operands: str,
                 user: str | None = None) -> str:
    """A ``cogency`` command line that works as printed: ``--user`` (``user``, else this
    invocation's) and ``--db`` are added when they are not the defaults."""
    who = user or getattr(args, "user", None)
    words = ["cogency", command, *operands]
    if who and who != "default":
        words += ["--user", who]
    if getattr(args, "db", None):
        words += ["--db", args.db]
    return visible(" ".join(shlex.quote(word) for word in words), keep="")


def read_query(query: str | None) -> str:
    """The query argument, or standard input for ``-`` (or no argument with a pipe)."""
    from .errors import UsageError

    if query is not None and query != "-":
        return query
    if query is None and _isatty(sys.stdin):
        raise UsageError(
            "give the query as an argument or on standard input, e.g.: "
            "cogency run 'What is 2 + 2?'  or  echo 'What is 2 + 2?' | cogency run -"
        )
    data = sys.stdin.buffer.read(MAX_QUERY_BYTES + 1)
    if len(data) > MAX_QUERY_BYTES:
        raise UsageError(
            f"the query on standard input is larger than {MAX_QUERY_BYTES // 2**20} MB; "
            "give the agent a file to read with --tools files instead"
        )
    text = data.decode("utf-8", errors="replace").removesuffix("\n")
    if not text.strip():
        raise UsageError("the query read from standard input is empty")
    return text


def _store(args: argparse.Namespace) -> Any:
    from .storage import open_store

    return open_store(args.db)


def _read_store(args: argparse.Namespace) -> Any:
    """A read-only store, or ``None`` when the default database does not exist yet (an
    explicit ``--db`` that does not exist is an error). Never creates a file or directory."""
    from .storage import default_db_path, open_store

    if args.db is None and not os.environ.get("COGENCY_DB", "").startswith(
        ("postgresql://", "postgres://", "sqlite:")
    ) and not default_db_path().exists():
        return None
    return open_store(args.db, read_only=True)


_SECRET = re.compile(
    r"://[^/\s]*@"  # user:password@host
    r"|(?i:(?:key|token|secret|passw(?:or)?d|auth)[\w-]*\s*[=:])"  # API_KEY=…, token: …
    r"|(?i:\s-{1,2}[\w-]*(?:key|token|secret|passw(?:or)?d|auth)[\w-]*\s)"  # --token …
)
"""Credentials in a model spec or MCP command line: ``user:pw@`` in a URL, ``--api-key=…``."""


def _has_secret(spec: str) -> bool:
    """Whether a model spec or MCP command line seems to carry credentials (then it is not
    stored with the task: resuming it needs ``--llm``/``--mcp`` again)."""
    return _SECRET.search(spec) is not None


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value or "")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
