"""Tools: typed functions the model may call, with schemas, validation and time limits."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import inspect
import json
import logging
import os
import re
import threading
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Union, get_args, get_origin, overload

from .. import _telemetry
from .._redact import redact_cut
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
    """

    name: str
    description: str
    parameters: dict[str, Any]
    func: Callable[..., Any]
    timeout: float = DEFAULT_TIMEOUT
    needs_approval: bool | Callable[[dict[str, Any]], Any] = False
    hide: Callable[[Sequence[str]], None] | None = field(default=None, repr=False)
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
        _check(args, self.parameters, "args", self.name)
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
        args = ", ".join(
            f"{key}: {_type_name(spec)}{'' if key in required else ' = optional'}"
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

    The schema comes from the signature's annotations (str, int, float, bool, list[...],
    dict, Literal[...], Enum, ``X | None``); the description and per-argument help come from
    the docstring (its first paragraph, and an ``Args:`` section).
    """

    def build(fn: Callable[..., Any]) -> Tool:
        summary, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
        text = description or summary
        if not text:
            raise ToolError(
                f"tool {fn.__name__!r} needs a description: add a docstring or pass description="
            )
        return Tool(
            name=name or fn.__name__,
            description=text,
            parameters=_schema_of(fn, arg_docs),
            func=fn,
            timeout=timeout,
            needs_approval=needs_approval,
        )

    return build(func) if func is not None else build


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
    output = await _off_loop(tool_, _render, value)
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


def _render(value: Any) -> str:
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return _cut(text)


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


# -- schemas from signatures ---------------------------------------------------------------


def _schema_of(fn: Callable[..., Any], docs: dict[str, str]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ToolError(f"tool {fn.__name__!r}: cannot read its type hints ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {fn.__name__!r}: *args and **kwargs cannot be described")
        if param.name not in hints:
            raise ToolError(
                f"tool {fn.__name__!r}: argument {param.name!r} needs a type annotation"
            )
        spec = _type_schema(hints[param.name], f"{fn.__name__}.{param.name}")
        if param.name in docs:
            spec["description"] = docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is None or isinstance(param.default, (str, int, float, bool)):
            spec["default"] = param.default
        properties[param.name] = spec
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin = get_origin(hint)
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is Any:
        return {}
    if hint is type(None):
        return {"type": "null"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [member.value for member in hint]}
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        args = get_args(hint)
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        args = get_args(hint)
        spec: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            spec["additionalProperties"] = _type_schema(args[1], where)
        return spec
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin in (Union, types.UnionType):
        options = [_type_schema(arg, where) for arg in get_args(hint)]
        return {"anyOf": options}
    raise ToolError(f"{where}: cannot describe the type {hint!r} in a JSON schema")


def _type_name(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return " | ".join(json.dumps(v) for v in spec["enum"])
    if "anyOf" in spec:
        return " | ".join(_type_name(s) for s in spec["anyOf"])
    if spec.get("type") == "array" and "items" in spec:
        return f"list[{_type_name(spec['items'])}]"
    return str(spec.get("type", "any"))


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


# -- validation ----------------------------------------------------------------------------

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _check(value: Any, spec: dict[str, Any], path: str, tool_name: str) -> None:
    def fail(message: str) -> None:
        raise ToolArgumentError(f"tool {tool_name!r}: {path} {message}")

    if "anyOf" in spec:
        for option in spec["anyOf"]:
            try:
                _check(value, option, path, tool_name)
                return
            except ToolArgumentError:
                continue
        fail(f"must be {_type_name(spec)}, got {_describe(value)}")
    if "enum" in spec and value not in spec["enum"]:
        fail(f"must be one of {', '.join(json.dumps(v) for v in spec['enum'])}, got {_describe(value)}")
    kind = spec.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_JSON_TYPES[k](value) for k in kinds if k in _JSON_TYPES):
            fail(f"must be {'/'.join(kinds)}, got {_describe(value)}")
    if isinstance(value, float) and value != value:
        fail("must be a number, got NaN")
    if isinstance(value, str) and "maxLength" in spec and len(value) > spec["maxLength"]:
        fail(f"is longer than {spec['maxLength']} characters")
    if isinstance(value, list) and "items" in spec:
        for index, item in enumerate(value):
            _check(item, spec["items"], f"{path}[{index}]", tool_name)
    if isinstance(value, dict):
        props = spec.get("properties", {})
        for key in spec.get("required", []):
            if key not in value:
                fail(f"is missing the required argument {key!r}")
        extra = spec.get("additionalProperties", True)
        for key, item in value.items():
            if not isinstance(key, str):
                fail("has a non-string key")
            if key in props:
                _check(item, props[key], f"{path}.{key}", tool_name)
            elif extra is False:
                allowed = ", ".join(props) or "none"
                fail(f"has an unknown argument {key!r} (allowed: {allowed})")
            elif isinstance(extra, dict):
                _check(item, extra, f"{path}.{key}", tool_name)


def _describe(value: Any) -> str:
    try:
        if isinstance(value, str):
            text = repr(value)
        else:
            text = json.dumps(value, ensure_ascii=False, default=repr)
    except (RecursionError, ValueError):  # hostile input: nested past the recursion limit
        text = "(nested too deeply to show)"
    kind = type(value).__name__
    return f"{kind} {text[:60]}{'…' if len(text) > 60 else ''}"

