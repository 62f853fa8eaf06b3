"""Tools: typed functions the model may call, with schemas, validation and time limits."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import enum
import functools
import inspect
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast, overload

from .. import _telemetry
from .._jsonschema import MAX_STEPS, SchemaViolation, TooCostly, type_name, validate
from .._redact import redact_cut
from ._plain import plain_arguments
from ..errors import ToolArgumentError, ToolError
from ..tokens import truncate_tokens

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
MAX_OUTPUT_CHARS = 20_000
"""Tool output kept in the conversation; longer output is cut and marked."""
MAX_OUTPUT_TOKENS = 6_000
"""And at most this many tokens of it: text denser than ~3 characters a token (digits, CJK,
base64) is cut sooner, so no result costs more to count, or in the history window."""
MAX_TOOL_THREADS = 8
"""Calls of one synchronous tool that run at once; more wait (within their time limit)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")


@dataclass
class Tool:
    """A callable the model can use: a name, a description, a JSON schema for its arguments.

    ``func`` may be sync or async. Arguments are checked against ``parameters`` before the
    call; a call that raises or exceeds ``timeout`` seconds becomes an error result the model
    sees. A sync ``func`` runs in a thread of this tool's own (at most
    :data:`MAX_TOOL_THREADS`), never in the event loop's shared pool: a call that hangs keeps
    its thread, but never starves other tools or the loop.

    ``needs_approval``: ``True`` when a person must allow each call first (see the agent's
    ``approve``), or a callable of the call's arguments (a dict) returning whether this call
    needs it; a callable that raises or returns anything but ``False`` means it does.

    ``hide``, when set, is called by the :class:`~cogency.Agent` with the paths of its store's
    files, which the tool must keep out of reach (the shell sandbox hides them).

    ``root`` is the directory a tool is confined to (the files and shell tools have one), and
    ``rebuild`` makes the same tool confined to another directory: :meth:`confined_to` uses it
    to give each user of an ``Agent(root_per_user=True)`` a directory of their own.
    """

    checks: ClassVar[int] = MAX_STEPS
    """Checks :meth:`validate` may spend on one call's arguments (see cogency._jsonschema)."""

    name: str
    description: str
    parameters: dict[str, Any]
    func: Callable[..., Any]
    timeout: float = DEFAULT_TIMEOUT
    needs_approval: bool | Callable[[dict[str, Any]], Any] = False
    hide: Callable[[Sequence[str]], None] | None = field(default=None, repr=False)
    root: str | None = None
    rebuild: Callable[[str], Tool] | None = field(default=None, repr=False, compare=False)
    _threads: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_TOOL_THREADS),
        init=False, repr=False, compare=False,
    )
    _renders: threading.BoundedSemaphore = field(
        # Apart from the calls' threads, which hung calls may hold: a render always ends soon.
        default_factory=lambda: threading.BoundedSemaphore(MAX_TOOL_THREADS),
        init=False, repr=False, compare=False,
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ToolError(
                f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-' "
                "starting with a letter or '_'"
            )
        if not callable(self.func):
            raise ToolError(f"tool {self.name!r}: func must be callable")
        if self.parameters.get("type") != "object":
            raise ToolError(f"tool {self.name!r}: parameters must be a JSON schema of type object")
        if not self.timeout or self.timeout <= 0:
            raise ToolError(f"tool {self.name!r}: timeout must be a positive number of seconds")
        if not isinstance(self.needs_approval, bool) and not callable(self.needs_approval):
            raise ToolError(
                f"tool {self.name!r}: needs_approval must be a bool or a callable of the args"
            )

    def confined_to(self, root: str) -> Tool:
        """This tool working in ``root`` instead of its own root (a tool without a root, or
        one that cannot be rebuilt, is itself). The copy shares this tool's thread slots, so
        its users together never run more calls at once than the tool alone would."""
        if self.rebuild is None or self.root is None:
            return self
        copy = self.rebuild(root)
        copy._threads, copy._renders = self._threads, self._renders
        return copy

    async def requires_approval(self, args: dict[str, Any]) -> bool:
        """Whether this call must wait for a person (fails closed: an error means yes)."""
        rule = self.needs_approval
        if isinstance(rule, bool):
            return rule
        try:
            verdict = rule(dict(args))
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:  # a broken rule must not let a call through unasked
            _log.warning("the needs_approval rule of %s raised %s: %s; the call needs approval",
                         self.name, type(exc).__name__, exc)
            return True
        return verdict is not False

    def validate(self, args: Any) -> dict[str, Any]:
        """``args`` checked against the schema (ints accepted for numbers); raises
        :class:`~cogency.errors.ToolArgumentError` saying what is wrong."""
        if args is None:
            args = {}
        try:
            validate(args, self.parameters, "args", "argument", budget=self.checks)
        except TooCostly as exc:
            raise ToolArgumentError(f"tool {self.name!r}: {exc}, so the call was not made: "
                                    "the schema is too complex for arguments this large; send "
                                    "smaller ones") from None
        except SchemaViolation as exc:
            raise ToolArgumentError(f"tool {self.name!r}: {exc}") from None
        return args

    async def __call__(self, **args: Any) -> Any:
        if inspect.iscoroutinefunction(self.func):
            return await self.func(**args)
        result = await self._in_thread(functools.partial(self.func, **args))
        if inspect.isawaitable(result):
            return await result
        return result

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        return await in_thread(call, self._threads, f"cogency-tool-{self.name}")

    def _saturated(self) -> bool:
        if self._threads.acquire(blocking=False):
            self._threads.release()
            return False
        return True

    def signature(self) -> str:
        """One line for the prompt: ``name(arg: type, ...): description``."""
        props = self.parameters.get("properties", {})
        required = set(self.parameters.get("required", []))
        defs = self.parameters.get("$defs")
        args = ", ".join(
            f"{key}: {type_name(spec, defs)}{'' if key in required else ' = optional'}"
            for key, spec in props.items()
        )
        return f"{self.name}({args}): {self.description}"


class Toolset(Protocol):
    """Tools known only once something is started (an MCP server's): goes in
    ``Agent(tools=[...])``; the agent lists its tools at the start of each run and calls
    ``aclose`` in ``agent.close()``."""

    async def list_tools(self) -> list[Tool]: ...

    async def aclose(self) -> None: ...


@overload
def tool(func: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    needs_approval: bool | Callable[[dict[str, Any]], Any] = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    needs_approval: bool | Callable[[dict[str, Any]], Any] = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a typed, documented function (``@tool`` or ``@tool(timeout=5)``).

    Pydantic builds the arguments' JSON schema from the signature and validates each call's
    arguments against it: any type Pydantic knows works (models, dataclasses, TypedDicts,
    ``datetime``, enums, ``Literal``, ``Annotated[int, Field(ge=1, description=...)]``, fixed
    tuples), and the function receives its arguments as the declared types (a model
    instance, a ``datetime``). Arguments that do not validate are an error the model is shown,
    naming the argument. The description and per-argument help come from the docstring (its
    first paragraph, and an ``Args:`` section) unless a ``Field`` describes the argument.
    """
    caller = sys._getframe(1).f_locals  # annotations may name classes local to the caller

    def build(fn: Callable[..., Any]) -> Tool:
        summary, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
        text = description or summary
        if not text:
            raise ToolError(
                f"tool {fn.__name__!r} needs a description: add a docstring or pass description="
            )
        # Arguments that are all str, int, float or bool get Pydantic's own schema without
        # Pydantic, which validates them on the first call (so a process whose tools are
        # never called never imports it); any other signature is Pydantic's from the start.
        parameters, adapter = plain_arguments(fn, arg_docs, caller), None
        if parameters is None:
            from ._typed import arguments_of

            parameters, adapter = arguments_of(fn, arg_docs, caller)
        return _TypedTool(
            name=name or fn.__name__,
            description=text,
            parameters=parameters,
            func=fn,
            timeout=timeout,
            needs_approval=needs_approval,
            adapter=adapter,
        )

    return build(func) if func is not None else build


@dataclass
class _TypedTool(Tool):
    """A tool made by :func:`tool`: Pydantic's ``adapter`` validates the arguments, and the
    function gets them as the declared types (the arguments stored and shown stay JSON)."""

    adapter: Any = field(default=None, repr=False, compare=False)

    def _adapter(self) -> Any:
        if self.adapter is None:  # a plain signature's, made on its first call
            from ._typed import arguments_of

            self.adapter = arguments_of(self.func, {})[1]
        return self.adapter

    def validate(self, args: Any) -> dict[str, Any]:
        from ._typed import typed_arguments

        if args is None:
            args = {}
        typed_arguments(self._adapter(), args, self.name, self.parameters.get("properties", ()))
        try:  # Pydantic's lax mode takes bytes for text; what is stored and shown is JSON
            json.dumps(args, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise ToolArgumentError(
                f"tool {self.name!r}: the arguments must be JSON values (text, numbers, "
                "booleans, null, lists and objects)") from None
        return cast(dict[str, Any], args)

    async def __call__(self, **args: Any) -> Any:
        from ._typed import typed_arguments

        return await super().__call__(**typed_arguments(self._adapter(), args, self.name))


async def in_thread(call: Callable[[], Any], slots: threading.BoundedSemaphore, name: str) -> Any:
    """``call()`` in a new daemon thread once one of ``slots`` is free; its result or error.

    Not the loop's shared pool: a call that hangs holds only its own slot, and (unlike a
    pool's worker) never blocks the interpreter's exit. Cancelling the await abandons the call.
    """
    while not slots.acquire(blocking=False):
        await asyncio.sleep(0.01)  # cancelled by a time limit like any other wait
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(call))
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome = (False, exc)
        finally:
            slots.release()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(_resolve, future, outcome)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


def hide_store_files(tools: Iterable[Tool], store: Any) -> None:
    """Give the tools that hide paths (``Tool.hide``) the files of ``store``: a SQLite file and
    its journals. A store without a local file (PostgreSQL) has nothing to hide."""
    path = getattr(store, "path", None)
    if not isinstance(path, str) or not path or path == ":memory:" or path.startswith("file:"):
        return
    base = os.path.realpath(os.path.expanduser(path))
    files = [base + suffix for suffix in ("", "-wal", "-shm", "-journal")]
    for item in tools:
        if item.hide is not None:
            item.hide(files)


async def run_tool(tool_: Tool | None, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one validated call; failures come back as ``{"ok": False, "error": ...}``."""
    if tool_ is None:
        return {"name": name, "args": args, "ok": False, "error": f"unknown tool {name!r}"}
    try:
        value = await asyncio.wait_for(tool_(**args), timeout=tool_.timeout)
    except asyncio.TimeoutError:
        busy = (
            f" ({MAX_TOOL_THREADS} earlier calls of it are still running)"
            if tool_._saturated() else ""
        )
        return {
            "name": name, "args": args, "ok": False,
            "error": f"timed out after {tool_.timeout:g}s{busy}",
        }
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the model sees the failure as the call's result
        # Redacted before it is stored or shown.
        error = await _off_loop(tool_, _cut, f"{type(exc).__name__}: {exc}")
        return {"name": name, "args": args, "ok": False, "error": error}
    output = await _off_loop(tool_, render_output, value)
    return {"name": name, "args": args, "ok": True, "output": output}


async def _off_loop(tool_: Tool, render: Callable[[Any], str], value: Any) -> str:
    if isinstance(value, str) and len(value) < _RENDER_ON_LOOP:
        return render(value)
    # A long output is redacted (~24,000 characters scanned) and counted (tiktoken frees the
    # GIL) in a thread: the event loop is not held while it is.
    return await in_thread(functools.partial(render, value), tool_._renders, "cogency-render")


async def run_tools(
    tools: dict[str, Tool], calls: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run the calls of one step concurrently; results keep the order of the calls."""
    return list(
        await asyncio.gather(
            *(_telemetry.execute_tool(tools.get(call["name"]), call, run_tool(
                tools.get(call["name"]), call["name"], call.get("args") or {})) for call in calls)
        )
    )


_RENDER_ON_LOOP = 1_000
"""Outputs shorter than this are redacted (and counted) on the loop: a thread costs more."""


def render_output(value: Any) -> str:
    """A tool's output as stored and shown: JSON for what is not text, secrets redacted, cut
    to :data:`MAX_OUTPUT_CHARS` (and :data:`MAX_OUTPUT_TOKENS`)."""
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=_jsonable)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
    return _cut(text)


def _jsonable(value: Any) -> Any:
    """What a tool's result holds beyond JSON, as JSON: a Pydantic model or a dataclass as its
    fields, an enum as its value, a date as ISO text; anything else as ``str``."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        with contextlib.suppress(Exception):
            return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _cut(text: str) -> str:
    # Secrets never reach the conversation, the events or the database. Only what is kept is
    # scanned, so a huge output costs no more event-loop time than a 20,000-character one.
    kept, left_out = redact_cut(text, MAX_OUTPUT_CHARS)
    if len(kept.encode()) > MAX_OUTPUT_TOKENS:  # a token is at least one byte: else it fits
        shorter = truncate_tokens(kept, MAX_OUTPUT_TOKENS, marker="")
        left_out += len(kept) - len(shorter)
        kept = shorter
    return kept + (f"\n…[cut: {left_out} more characters]" if left_out else "")


def _resolve(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if not future.done():
        ok, value = outcome
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?:^\S|\Z)", doc, re.M | re.S)
    if match:
        current = None
        for line in match.group(1).splitlines():
            item = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", line)
            if item:
                current = item.group(1)
                args[current] = item.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return summary, args
