"""Tools from MCP servers: ``MCPServer(command=[...])`` or ``MCPServer(url=...)`` in ``Agent(tools=[...])``.

Built on the official ``mcp`` SDK (extra ``mcp``). An MCP server is hostile like any tool
output: every message it sends is bounded in size, every start and call in time, the work it
makes this process do (parsing its messages, inlining its schemas, checking arguments against
them) by the budgets of :mod:`._mcp_bounds`, its text is redacted and cut like other tool
output, and its failures (it cannot start, dies mid-call, hangs, answers with an error)
become tool errors that name the server, so the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import shlex
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from .._jsonschema import SchemaError, SchemaTooLarge, inline_refs
from ..errors import ConfigurationError, ToolError, UsageError
from ._mcp_bounds import (
    MAX_CONTENT_BLOCKS,
    MAX_DEPTH,
    MAX_MESSAGE_ITEMS,
    MAX_SCHEMA_NODES,
    MAX_SERVER_SCHEMA_NODES,
    MAX_VALIDATION_STEPS,
    json_items,
)
from .base import DEFAULT_TIMEOUT, Tool, in_thread
from .shell import _RUN_MARKER, _kill_group, _kill_tree, _processes

if TYPE_CHECKING:
    from mcp import Client

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
"""Seconds a server has to start and list its tools."""
START_BACKOFF = 1.0
"""Seconds before a server that failed to start is tried again; doubled after each failure
in a row, up to START_BACKOFF_MAX."""
START_BACKOFF_MAX = 300.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""One message from a server: a longer stdio line closes the connection, a longer HTTP reply is
not read further (either way the call fails)."""
MAX_TOOLS = 200
"""Tools taken from one server; the rest are left out (and logged)."""
MAX_DESCRIPTION_CHARS = 1000
"""A tool description longer than this is cut: it goes into every prompt."""
_CLEAN_SLICE = 65_536
"""Characters of a result cleaned of control codes at once (a few ms)."""
_STDERR_BYTES = 2000
"""The tail of a server's stderr kept for error messages."""
_RESTARTED = "it is started again on the next call"
_STOP_GRACE = 1.0
"""Seconds a stdio server has to exit after its stdin closes, then after SIGTERM."""
_LAUNCHERS = {"npx", "uvx", "uv", "pipx", "node", "deno", "bun", "bunx", "docker", "python",
              "python3", "sh", "bash", "env"}
_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_\-]")
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"             # CSI sequences (colours, cursor, clear screen)
    r"|\x1b\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?"  # OSC (window titles, hyperlinks)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"      # any other control character
)


@dataclass(eq=False)
class MCPTool(Tool):
    """A tool of an MCP server. ``parameters`` is the server's input schema with its local
    ``$ref``s inlined (so it can be embedded in a provider's structured-output schema), within
    the budgets of :mod:`cogency.tools._mcp_bounds`; arguments are checked against it in at
    most ``MAX_VALIDATION_STEPS`` checks (``cogency._jsonschema``, which leaves some keywords
    unchecked: the server checks its own schema in full).

    Shared by every user of the agent: with ``Agent(root_per_user=True)`` it has no root of
    its own (``root`` is ``None``), so :meth:`~cogency.tools.Tool.confined_to` keeps it as it
    is; the server works where it was started (``cwd=``) for all of them.
    """

    checks: ClassVar[int] = MAX_VALIDATION_STEPS

    server: MCPServer | None = None
    remote_name: str = ""


class MCPServer:
    """An MCP server whose tools the agent can use, next to ordinary tools.

    ``MCPServer(command=["npx", "-y", "@modelcontextprotocol/server-everything"])`` runs a
    server over stdio (``command`` may also be one string, split like a shell would);
    ``MCPServer(url="http://host/mcp")`` connects over streamable HTTP (``headers`` for
    authentication). The agent starts it on first use and stops it in ``agent.close()``.

    - ``name`` names the server in errors and logs (default: from the command or URL).
    - ``env``: a stdio server gets only ``HOME``, ``PATH``, ``USER``, ``SHELL``, ``TERM``,
      ``LOGNAME`` of this process's environment (never its API keys), plus ``env``.
    - ``timeout`` bounds each call (seconds); ``start_timeout`` the start and tool listing.
      A failed start is tried again after START_BACKOFF (1 s), doubled after each failure in
      a row up to START_BACKOFF_MAX (5 minutes); no run waits for another run's start.
    - ``prefix`` is put before each tool's name, for two servers with the same tool names.
    - ``trusted``: MCP tools need a person's approval before each call (``needs_approval``,
      decided by the agent's ``approve``) unless the server is trusted (``True``) or the tool
      is (a collection of tool names, as the server names them).
    """

    def __init__(
        self,
        command: Sequence[str] | str | None = None,
        *,
        url: str | None = None,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
        prefix: str = "",
        trusted: bool | Collection[str] = False,
    ) -> None:
        require_sdk()
        if (command is None) == (url is None):
            raise UsageError("MCPServer needs exactly one of command=[...] (stdio) or url=...")
        if isinstance(command, str):
            command = shlex.split(command)
        if command is not None:
            command = list(command)
            if not command or not all(isinstance(part, str) and part for part in command):
                raise UsageError(f"MCPServer command must be a non-empty list of strings: "
                                 f"{command!r}")
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise UsageError(f"MCPServer url must be http:// or https://, got {url!r}")
        for label, seconds in (("timeout", timeout), ("start_timeout", start_timeout)):
            if not isinstance(seconds, (int, float)) or seconds <= 0:
                raise UsageError(f"MCPServer {label} must be a positive number of seconds")
        self.command: list[str] | None = command
        self.url = url
        self.name = _server_name(name, command, url)
        self.env = dict(env or {})
        self.cwd = cwd
        self.headers = dict(headers or {})
        self.timeout = float(timeout)
        self.start_timeout = float(start_timeout)
        self.prefix = prefix
        self.trusted: bool | frozenset[str] = (
            trusted if isinstance(trusted, bool) else frozenset(trusted)
        )
        self._connection: _Connection | None = None
        self._tools: list[Tool] | None = None
        self._starting: asyncio.Task[_Connection] | None = None
        self._started_at = 0.0
        self._failures = 0  # starts failed in a row
        self._retry_at = 0.0  # time.monotonic() before which no start is tried again
        self._last_error = ""
        self._warned = -1  # the failure count last warned about, for runs going on without it
        self._closing: set[asyncio.Task[None]] = set()
        self._threads = threading.BoundedSemaphore(2)  # for work kept off the event loop

    def __repr__(self) -> str:
        where = shlex.join(self.command) if self.command else self.url
        return f"MCPServer({self.name!r}: {where})"

    def _approval_needed(self, remote_name: str) -> bool:
        if isinstance(self.trusted, bool):
            return not self.trusted
        return remote_name not in self.trusted

    async def list_tools(self) -> list[Tool]:
        """The server's tools, starting it if it is not running.

        Only a first start (or a start after the server stopped) is waited for, by the run
        that makes it. A run that finds a start in flight, or the back-off after failed
        starts, goes on at once without the server's tools (a failed start is tried again
        after 1 s, then 2, 4… up to START_BACKOFF_MAX, in the background): it is offered one
        tool named after the server that says why, and its call tries again. The model and
        the user see the error; the run goes on.
        """
        if self._current() is not None:
            assert self._tools is not None
            return list(self._tools)
        starting = self._start_in_flight()
        if starting is None and not self._failures:
            try:
                await asyncio.shield(self._begin_start())
            except ToolError as exc:
                return [self._stand_in(str(exc))]
            assert self._tools is not None
            return list(self._tools)
        if starting is not None:
            why = (f"MCP server {self.name!r} is starting (for {self._age():.0f}s, begun by "
                   "another task); its tools can be used once it has started")
        else:
            why = self._backoff_story()
            if time.monotonic() >= self._retry_at:
                self._begin_start()
                why = f"{self._last_error}; it is being started again"
        if self._warned != self._failures:
            self._warned = self._failures
            log.warning("%s; runs go on without its tools meanwhile", why)
        return [self._stand_in(why)]

    async def aclose(self) -> None:
        """Stop the server (a stdio server's process is ended, with every process it
        started); never raises. Failed starts are forgotten."""
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done() and (
            starting.get_loop() is asyncio.get_running_loop()
        ):
            starting.cancel()
            await asyncio.wait([starting])
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        if self._closing:
            await asyncio.wait(list(self._closing))
        self._failures, self._retry_at, self._warned = 0, 0.0, -1

    # -- calls -------------------------------------------------------------------------------

    async def _call(self, remote_name: str, args: dict[str, Any], timeout: float) -> str:
        """Call a tool by its name on the server; the result as text, failures as ToolError."""
        import mcp_types
        from mcp.shared.exceptions import MCPError

        connection = await self._ensure_started()
        connection.calls += 1
        try:
            result = await connection.client.call_tool(
                remote_name, args, read_timeout_seconds=timeout
            )
        except asyncio.CancelledError:  # timed out (see _caller), or the run was cancelled
            # The server may still be at it, or be stuck: the next call gets a fresh one.
            connection.retired = True
            raise
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED or not connection.alive:
                story = connection.exit_story()  # before stopping it changes the story
                await self._drop(connection)
                raise ToolError(f"MCP server {self.name!r} {story}") from exc
            raise ToolError(f"MCP server {self.name!r}: {remote_name}: {exc.message}") from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:
            connection.retired = True
            raise ToolError(f"MCP server {self.name!r}: {remote_name} did not answer within "
                            f"{timeout:g}s; {_RESTARTED}") from exc
        except (OSError, ValueError) as exc:  # transport failures, invalid replies
            await self._drop(connection)
            raise ToolError(f"MCP server {self.name!r}: {remote_name}: "
                            f"{type(exc).__name__}: {exc}") from exc
        finally:
            connection.calls -= 1
            if connection.retired and not connection.calls:
                # Stopped (process group and all) before the error is reported; bounded.
                await self._drop(connection)
        text = await _clean_long(_result_text(result))
        if result.is_error:
            raise ToolError(f"MCP server {self.name!r}: {remote_name} failed: {text}")
        return text

    # -- lifecycle ---------------------------------------------------------------------------

    async def _ensure_started(self) -> _Connection:
        """The running connection; else the start in flight, or a new one, waited for (a call
        needs the server; its own time limit bounds the wait). During the back-off after
        failed starts, a ToolError saying why and until when."""
        connection = self._current()
        if connection is not None:
            return connection
        starting = self._start_in_flight()
        if starting is None:
            if self._failures and time.monotonic() < self._retry_at:
                raise ToolError(self._backoff_story())
            starting = self._begin_start()
        return await asyncio.shield(starting)

    def _current(self) -> _Connection | None:
        """The running connection, if it can take calls. A dead one, or one opened in an event
        loop that has ended (run_sync), is stopped in the background; a retired one (a call
        timed out on it) is stopped by its last call in flight."""
        connection = self._connection
        if connection is None:
            return None
        if connection.retired or not connection.alive or (
            connection.loop is not asyncio.get_running_loop()
        ):
            self._connection = None
            if not connection.retired:
                task = asyncio.get_running_loop().create_task(connection.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            return None
        return connection

    def _start_in_flight(self) -> asyncio.Task[_Connection] | None:
        starting = self._starting
        if starting is None or starting.done() or (
            starting.get_loop() is not asyncio.get_running_loop()
        ):
            return None
        return starting

    def _begin_start(self) -> asyncio.Task[_Connection]:
        """Start the server in a task of its own: whoever waits for it may be cancelled (or
        not wait at all) without stopping it."""
        starting = asyncio.get_running_loop().create_task(self._start())
        starting.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._starting, self._started_at = starting, time.monotonic()
        return starting

    async def _start(self) -> _Connection:
        connection = _Connection(self)
        try:
            listing = await connection.open()  # within start_timeout; a ToolError says why not
            tools = self._make_tools(listing)
        except ToolError as exc:
            self._failures += 1
            delay = min(START_BACKOFF * 2 ** (self._failures - 1), START_BACKOFF_MAX)
            self._retry_at, self._last_error = time.monotonic() + delay, str(exc)
            log.warning("%s; it is started again in %gs at the earliest", exc, delay)
            raise
        except BaseException:
            await asyncio.shield(connection.close())
            raise
        finally:
            if self._starting is asyncio.current_task():
                self._starting = None
        self._failures, self._warned = 0, -1
        self._connection, self._tools = connection, tools
        return connection

    def _age(self) -> float:
        return time.monotonic() - self._started_at

    def _backoff_story(self) -> str:
        left = max(0.0, self._retry_at - time.monotonic())
        times = "once" if self._failures == 1 else f"{self._failures} times in a row"
        return (f"{self._last_error}; it failed to start {times}, and is started again in "
                f"{left:.0f}s at the earliest")

    async def _drop(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None
        await connection.close()

    def _make_tools(self, listing: Sequence[Any]) -> list[Tool]:
        """Tools of the listing; one whose schema is over its budget (or the server's) is
        offered as a stand-in that says why, so the model and the user can see it."""
        tools: list[Tool] = []
        names: set[str] = set()
        spent = 0  # schema nodes of the tools taken
        if len(listing) > MAX_TOOLS:
            log.warning("MCP server %r offers more than %d tools; only the first %d are used",
                        self.name, MAX_TOOLS, MAX_TOOLS)
        for remote in listing[:MAX_TOOLS]:
            name = _tool_name(self.prefix + remote.name[:128], names)
            names.add(name)
            raw = remote.input_schema if isinstance(remote.input_schema, dict) else {}
            try:
                parameters, nodes = inline_refs(raw, budget=MAX_SCHEMA_NODES, strict=False,
                                                max_depth=MAX_DEPTH)
            except SchemaTooLarge:
                tools.append(self._refused(name, remote.name, f"has an input schema over "
                                           f"{MAX_SCHEMA_NODES:,} nodes once its $refs are "
                                           "inlined (MAX_SCHEMA_NODES)"))
                continue
            except SchemaError as exc:
                tools.append(self._refused(name, remote.name, f"has an unusable input schema "
                                                              f"({exc})"))
                continue
            if spent + nodes > MAX_SERVER_SCHEMA_NODES:
                tools.append(self._refused(
                    name, remote.name, f"would take its tools' schemas over "
                    f"{MAX_SERVER_SCHEMA_NODES:,} nodes in all (MAX_SERVER_SCHEMA_NODES)"))
                continue
            spent += nodes
            text = remote.description or remote.title or remote.name
            description = _clean(text[:8 * MAX_DESCRIPTION_CHARS])  # bounded work: cut first
            if len(description) > MAX_DESCRIPTION_CHARS:
                description = description[:MAX_DESCRIPTION_CHARS] + "…"
            tool = MCPTool(
                name=name,
                description=description,
                parameters={**parameters, "type": "object"},
                func=self._caller(remote.name),
                timeout=self.timeout + 5,
                needs_approval=self._approval_needed(remote.name),
                server=self,
                remote_name=remote.name,
            )
            tools.append(tool)
        return tools

    def _refused(self, name: str, remote_name: str, why: str) -> Tool:
        """A stand-in for a tool left out: its calls are a tool error saying why."""
        error = (f"MCP server {self.name!r}: tool {_clean(remote_name[:64])!r} {why}; it is "
                 "left out (its server's author can make the schema smaller)")
        log.warning("%s", error)

        async def refuse(**_: Any) -> str:
            raise ToolError(error)

        return Tool(name=name, description=f"UNAVAILABLE: {error}",
                    parameters={"type": "object", "properties": {}, "additionalProperties": False},
                    func=refuse, needs_approval=False)

    def _caller(self, remote_name: str) -> Any:
        async def call(**args: Any) -> str:
            # Bounded here, so the error names the server; the Tool's own limit is a backstop.
            try:
                return await asyncio.wait_for(self._call(remote_name, args, self.timeout + 1),
                                              self.timeout)
            except asyncio.TimeoutError:
                raise ToolError(f"MCP server {self.name!r}: {remote_name} did not answer "
                                f"within {self.timeout:g}s; {_RESTARTED}") from None

        return call

    def _stand_in(self, error: str) -> Tool:
        async def start_again() -> str:
            connection = await self._ensure_started()  # or the start error, or the back-off
            names = ", ".join(t.name for t in self._tools or [])
            return (f"MCP server {self.name!r} started (pid {connection.pid}); its tools "
                    f"({names}) can be used in the next task")

        return Tool(
            name=_tool_name(self.name, set()),
            description=(f"UNAVAILABLE: {_clean(error)[:500]}. Its tools cannot be used in "
                         "this task; calling this starts the server (once its back-off is "
                         "over) or waits for its start."),
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
            func=start_again,
            timeout=self.start_timeout + 5,
            needs_approval=False,  # starting the server calls none of its tools
        )


class _Connection:
    """One running session with the server. The SDK's client lives in its own task: its
    context managers must be entered and left by one task, while calls come from any."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.stderr: deque[bytes] = deque()
        self.pid: int | None = None
        self.returncode: int | None = None
        self.alive = False
        self.calls = 0  # in flight
        self.retired = False  # a call was abandoned: no new ones, stopped when calls is 0
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def client(self) -> Client:
        if self._client is None or not self.alive:
            raise ToolError(f"MCP server {self.server.name!r} {self.exit_story()}")
        return self._client

    async def open(self) -> list[Any]:
        """Start the server and list its tools; ToolError names the server and says why not."""
        listed: asyncio.Future[list[Any]] = self.loop.create_future()
        # Read even when nobody waits any more (a start that timed out): no "never retrieved".
        listed.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._task = asyncio.create_task(self._serve(listed))
        try:
            return await asyncio.wait_for(asyncio.shield(listed), self.server.start_timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise ToolError(f"MCP server {self.server.name!r} did not start within "
                            f"{self.server.start_timeout:g}s{self._stderr_note()}") from None
        except ToolError:
            await self.close()
            raise
        except asyncio.CancelledError:
            await asyncio.shield(self.close())
            raise

    async def close(self) -> None:
        self.alive = False
        if self.loop.is_closed():
            return  # its loop ended (run_sync), and stopped the server as it did
        self._stop.set()
        task = self._task
        if task is not None and not task.done() and self._client is None:
            task.cancel()  # still starting (maybe hung): nothing to leave gracefully
        if task is not None and not task.done():
            # Leaving the SDK's context stops the process (stdin closed, SIGTERM, SIGKILL).
            done, _ = await asyncio.wait([task], timeout=4 * _STOP_GRACE + 2)
            if not done:
                task.cancel()
                await asyncio.wait([task], timeout=2)

    def exit_story(self) -> str:
        """Why the connection is gone, for an error message."""
        if self.returncode is not None:
            story = f"exited (status {self.returncode})"
        else:
            story = "closed the connection"
        return story + self._stderr_note() + "; " + _RESTARTED

    def _stderr_note(self) -> str:
        tail = b"".join(self.stderr).decode("utf-8", "replace").strip()
        if not tail:
            return ""
        from .._redact import redact

        return f"; its stderr ends: {_clean(redact(tail))[-500:]}"

    async def _serve(self, listed: asyncio.Future[list[Any]]) -> None:
        from mcp import Client
        from mcp_types import Implementation

        server = self.server
        try:
            if server.command is not None:
                transport: Any = _stdio(self, server.command, server.env, server.cwd)
            else:
                transport = _http(server.url or "", server.headers, server.start_timeout)
            client = Client(
                transport,
                read_timeout_seconds=server.timeout,
                client_info=Implementation(name="cogency", version=cogency_version()),
                cache=None,
            )
            async with client:
                tools = await _list_all(client)
                self._client = client
                self.alive = True
                listed.set_result(tools)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not listed.done():
                listed.set_exception(ToolError(f"MCP server {server.name!r} was stopped"))
            raise
        except Exception as exc:  # every way a start can fail becomes one clear ToolError
            if not listed.done():
                listed.set_exception(ToolError(
                    f"MCP server {server.name!r} failed to start: {_describe(exc)}"
                    f"{self._stderr_note()}"
                ))
            else:
                log.warning("MCP server %r: %s", server.name, _describe(exc))
        finally:
            self.alive = False


async def _list_all(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(20):  # a server that pages forever cannot hold the start
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None or len(tools) > MAX_TOOLS:
            break
    return tools


@contextlib.asynccontextmanager
async def _stdio(
    connection: _Connection, command: list[str], env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
) -> AsyncIterator[Any]:
    """The SDK's stdio transport, bounded: a message longer than MAX_MESSAGE_BYTES ends the
    connection instead of filling memory, one over the other budgets is refused before it is
    parsed (:func:`_read_message`), stderr is kept (its tail only) for error messages, and
    the server and every process it started are stopped on the way out."""
    import anyio
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    marker = uuid.uuid4().hex  # found in the environment of what it starts, wherever it goes
    try:
        process = await anyio.open_process(
            command, env={**get_default_environment(), **env, _RUN_MARKER: marker},
            cwd=cwd, start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from exc
    connection.pid = process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async with read_writer:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     anyio.EndOfStream, OSError):
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:  # each byte looked at once
                        buffer += chunk[start:end]
                        line = bytes(buffer)
                        buffer.clear()
                        start = end + 1
                        if not line.strip():
                            continue
                        message = await _read_message(line, connection)
                        if message is None:  # refused, and no call to tell: the end
                            return
                        await read_writer.send(message)
                    buffer += chunk[start:]
                    if len(buffer) > MAX_MESSAGE_BYTES:
                        connection.stderr.append(
                            f"\n[cogency: it sent a message over {MAX_MESSAGE_BYTES} bytes]"
                            .encode()
                        )
                        return
            # Stdout ended: the server is probably exiting; say how, when it does so promptly.
            with anyio.move_on_after(0.5):
                connection.returncode = await process.wait()

    async def read_stderr() -> None:
        assert process.stderr is not None
        kept = 0
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 anyio.EndOfStream, OSError):
            async for chunk in process.stderr:
                connection.stderr.append(chunk[-_STDERR_BYTES:])
                kept += len(connection.stderr[-1])
                while kept > _STDERR_BYTES and len(connection.stderr) > 1:
                    kept -= len(connection.stderr.popleft())

    async def write_stdin() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")

    async def watch() -> None:
        # EOF on stdout does not tell the session the process died: waiting for it does.
        connection.returncode = await process.wait()
        connection.alive = False
        await asyncio.sleep(0.05)  # let the reader deliver what was already written
        await read_writer.aclose()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read_stdout)
            group.start_soon(read_stderr)
            group.start_soon(write_stdin)
            group.start_soon(watch)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop_process(process, marker, connection.server._threads)
                group.cancel_scope.cancel()
    finally:
        connection.returncode = process.returncode


async def _stop_process(process: Any, marker: str, threads: threading.BoundedSemaphore) -> None:
    """Close stdin, then SIGTERM, then SIGKILL the server's process group; bounded waits.
    Then every process it started goes too, as the shell tool ends a command's: its session
    and group, its descendants, what carries its marker in the environment, and what was its
    descendant when the stop began (held by pidfd: found even after it left the session,
    cleared its environment and was orphaned by the server's exit)."""
    import anyio

    held = await in_thread(functools.partial(_hold_descendants, process.pid), threads,
                           "cogency-mcp-stop")
    try:
        with contextlib.suppress(Exception):
            await process.stdin.aclose()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
            with anyio.move_on_after(_STOP_GRACE):
                await process.wait()
            if process.returncode is not None:
                break
        _kill_group(process.pid)
        await in_thread(functools.partial(_kill_tree, process.pid, marker), threads,
                        "cogency-mcp-stop")
    finally:
        for handle in held:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            os.close(handle)
    # asyncio's transport would otherwise be closed at garbage collection, maybe after its loop.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    with contextlib.suppress(Exception):
        transport.close()  # type: ignore[union-attr]


def _hold_descendants(leader: int) -> list[int]:
    """A pidfd of each process descended from ``leader`` now: signals through it reach that
    process or none (never one that reused its pid). Empty where there are no pidfds."""
    if not hasattr(os, "pidfd_open"):
        return []
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in _processes().items():
        children.setdefault(parent, []).append(pid)
    held: list[int] = []
    todo = [leader]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, ()):
            todo.append(child)
            try:
                handle = os.pidfd_open(child)
            except OSError:
                continue
            if _processes_parent(child) == parent:  # still the process that was listed
                held.append(handle)
            else:
                os.close(handle)
    return held


def _processes_parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def _http(url: str, headers: Mapping[str, str], timeout: float) -> Any:
    import httpx2  # the SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    # Reads may idle while a server streams a long call (each call has its own time limit);
    # SSE events are bounded by the SDK (max_sse_event_size), other replies here.
    sent = httpx2.Headers(dict(headers))
    sent["accept-encoding"] = "identity"  # a compressed reply could be a zip bomb

    class BoundedBody(httpx2.AsyncByteStream):
        """A reply's body, read up to MAX_MESSAGE_BYTES (an event stream's events are bounded
        one by one instead), uncompressed, each message in it (the body, or an event) within
        MAX_MESSAGE_ITEMS before the SDK parses it. The SDK turns a StreamError into the
        call's error; an event over the budget becomes an error for the call it answers."""

        def __init__(self, response: httpx2.Response) -> None:
            assert isinstance(response.stream, httpx2.AsyncByteStream)  # an AsyncClient's
            self.stream = response.stream
            self.encoding = response.headers.get("content-encoding", "identity").lower()
            self.events = response.headers.get("content-type", "").lower().startswith(
                "text/event-stream")
            self.limit = None if self.events else MAX_MESSAGE_BYTES

        async def __aiter__(self) -> AsyncIterator[bytes]:
            if self.encoding not in ("", "identity"):
                raise httpx2.StreamError(f"the reply is compressed ({self.encoding[:40]}), "
                                         "which was not asked for")
            total = 0
            pending = bytearray()  # the body read so far; in an event stream, the event
            async for chunk in self.stream:
                total += len(chunk)
                if self.limit is not None and total > self.limit:
                    raise httpx2.StreamError(f"the reply is over {self.limit} bytes "
                                             "(MAX_MESSAGE_BYTES); it was not read further")
                pending += chunk
                if not self.events:
                    yield chunk
                elif end := _events_end(pending, len(pending) - len(chunk)):
                    # Whole events only: one over the budget can still be answered for.
                    events = bytes(pending[:end])
                    del pending[:end]
                    yield await _admit_events(events)
                elif len(pending) > MAX_MESSAGE_BYTES:
                    raise httpx2.SSEError(f"an event of over {MAX_MESSAGE_BYTES} bytes "
                                          "(MAX_MESSAGE_BYTES); it was not read further")
            if self.events:
                if pending:
                    yield await _admit_events(bytes(pending))
            elif len(pending) > MAX_MESSAGE_ITEMS:
                items = json_items(bytes(pending))
                await asyncio.sleep(0)  # the count and the parse: two short stalls, not one
                if items > MAX_MESSAGE_ITEMS:
                    raise httpx2.StreamError(f"the server sent {_REFUSED}")

        async def aclose(self) -> None:
            await self.stream.aclose()

    async def bound(response: httpx2.Response) -> None:
        response.stream = BoundedBody(response)

    client = httpx2.AsyncClient(headers=sent, follow_redirects=False,
                                timeout=httpx2.Timeout(timeout, read=300.0),
                                event_hooks={"response": [bound]})

    @contextlib.asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        async with client, _admitted(streamable_http_client(url, http_client=client)) as streams:
            yield streams

    return transport()


# -- messages ----------------------------------------------------------------------------------

_REFUSED = (f"a message of over {MAX_MESSAGE_ITEMS:,} JSON items (MAX_MESSAGE_ITEMS); it was "
            "not read")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def _events_end(data: bytearray, new: int) -> int:
    """Where the last complete server-sent event in ``data`` ends (0: none), looking at the
    bytes from ``new`` on (and the three before, where a separator may have begun)."""
    start = max(0, new - 3)
    ends = [at + len(sep) for sep in (b"\r\n\r\n", b"\n\n", b"\r\r")
            if (at := data.rfind(sep, start)) >= 0]
    return max(ends, default=0)

_HEAD_ID = re.compile(
    rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")\s*[,}]')
_TAIL_ID = re.compile(
    rb',\s*"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z')


async def _admit_events(data: bytes) -> bytes:
    """Whole server-sent events, each within MAX_MESSAGE_ITEMS or replaced by an error for
    the call it answers (an SSEError when that cannot be told: the stream fails)."""
    import httpx2

    events = _EVENT_END.split(data)
    for index, event in enumerate(events):
        if len(event) > MAX_MESSAGE_ITEMS:
            items = json_items(event)
            await asyncio.sleep(0)  # the count and the parse: two short stalls, not one
            if items > MAX_MESSAGE_ITEMS:
                lines = event.splitlines()
                request_id = _message_id(b"\n".join(
                    line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")))
                if request_id is None:
                    raise httpx2.SSEError(f"the server sent {_REFUSED}")
                reply = _error(request_id, f"the server sent {_REFUSED}")
                events[index] = b"event: message\ndata: " + reply.model_dump_json(
                    by_alias=True, exclude_none=True).encode()
    return b"\n\n".join(events)


async def _read_message(line: bytes, connection: _Connection) -> Any:
    """One line from a stdio server as the session's message (or the error it holds), parsed
    only when its work is within the budgets; None when it is refused and no call can be told
    (then the connection ends, as for an over-long line)."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    if len(line) > MAX_MESSAGE_ITEMS:
        items = json_items(line)
        await anyio.sleep(0)  # the count and the parse are two short stalls, not one long one
        if items > MAX_MESSAGE_ITEMS:
            request_id = _message_id(line)
            if request_id is None:
                connection.stderr.append(f"\n[cogency: it sent {_REFUSED}]".encode())
                return None
            return SessionMessage(_error(request_id, f"the server sent {_REFUSED}"))
    try:
        # json's parser and a check of the envelope: a fifth of pydantic's parse of the same.
        message = mcp_types.jsonrpc_message_adapter.validate_python(json.loads(line),
                                                                   by_name=False)
    except (ValueError, RecursionError) as exc:
        return exc
    return SessionMessage(_admit(message))


def _message_id(line: bytes) -> Any:
    """The id of a response not parsed, where it can be told from its first or last bytes
    (the Python SDK writes it first, the TypeScript SDK last); else None."""
    match = _HEAD_ID.match(line) or _TAIL_ID.search(line[-300:])
    return json.loads(match.group(1)) if match else None


def _admit(message: Any) -> Any:
    """A parsed message, less what would take unbounded work after it: more content blocks
    than MAX_CONTENT_BLOCKS (the SDK makes an object of each) refuse the result; a listing
    keeps MAX_TOOLS + 1 tools, without output schemas (the SDK would check each result's
    ``structuredContent`` against one, without bound; nothing here uses them)."""
    import mcp_types

    if not isinstance(message, mcp_types.JSONRPCResponse) or not isinstance(message.result, dict):
        return message
    result = message.result
    tools = result.get("tools")
    if isinstance(tools, list):
        del tools[MAX_TOOLS + 1:]
        for item in tools:
            if isinstance(item, dict):
                item.pop("outputSchema", None)
    content = result.get("content")
    if isinstance(content, list) and len(content) > MAX_CONTENT_BLOCKS:
        return _error(message.id, f"the server sent a result of {len(content):,} content "
                                  f"blocks, over {MAX_CONTENT_BLOCKS:,} (MAX_CONTENT_BLOCKS); "
                                  "it was not read")
    return message


def _error(request_id: Any, text: str) -> Any:
    import mcp_types

    return mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(
        code=mcp_types.INTERNAL_ERROR, message=text))


@contextlib.asynccontextmanager
async def _admitted(transport: Any) -> AsyncIterator[Any]:
    """``transport``'s streams, with each message from the server through :func:`_admit`."""
    import anyio
    from mcp.shared.message import SessionMessage

    async with transport as streams:
        read_stream, write_stream = streams[0], streams[1]
        sender, receiver = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def pump() -> None:
            async with sender:
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                         anyio.EndOfStream):
                    async for item in read_stream:
                        if isinstance(item, SessionMessage):
                            item = SessionMessage(_admit(item.message), metadata=item.metadata)
                        await sender.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            try:
                yield receiver, write_stream
            finally:
                group.cancel_scope.cancel()


# -- results -----------------------------------------------------------------------------------


def _result_text(result: Any) -> str:
    """A tool result as text: text content as is, other content described in brackets
    (control codes not yet removed)."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data or "") * 3 // 4
            parts.append(f"[{kind}: {block.mime_type}, about {size} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.name} <{block.uri}>"
                         f"{', ' + block.mime_type if block.mime_type else ''}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            mime = f", {resource.mime_type}" if resource.mime_type else ""
            if text is not None:
                parts.append(f"[resource <{resource.uri}>{mime}]\n{text}")
            else:
                size = len(getattr(resource, "blob", "") or "") * 3 // 4
                parts.append(f"[resource <{resource.uri}>{mime}: about {size} bytes, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if result.structured_content is not None and not any(
        getattr(block, "type", "") == "text" for block in result.content or []
    ):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


# -- names and schemas -------------------------------------------------------------------------


def _server_name(name: str | None, command: list[str] | None, url: str | None) -> str:
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise UsageError("MCPServer name must be a non-empty string")
        return name
    if url is not None:
        return urlsplit(url).hostname or url
    assert command is not None
    words = [Path(command[0]).name]
    if words[0] in _LAUNCHERS:
        words = [w for w in command[1:] if not w.startswith("-")][:1] or words
    word = words[0].rsplit("/", 1)[-1]
    word = re.sub(r"@[^@]*$", "", word) if not word.startswith("@") else word
    return re.sub(r"\.(py|js|mjs|ts)$", "", word) or "mcp"


def _tool_name(wanted: str, taken: set[str]) -> str:
    """A valid, unused Tool name: MCP allows dots and 128 characters, the contract does not."""
    name = _INVALID_NAME_CHARS.sub("_", wanted)[:64]
    if not re.match(r"[A-Za-z_]", name):
        name = ("_" + name)[:64]
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name[:60]}_{n}"
    return candidate


def _clean(text: str) -> str:
    """Text from a server without terminal control codes (newlines and tabs are kept)."""
    return _CONTROL.sub("", text)


async def _clean_long(text: str) -> str:
    """:func:`_clean` of megabytes, a slice at a time, letting the loop run between slices
    (a thread would not help: the regex holds the GIL throughout). A code cut in two by a
    slice's end loses its escape character: nothing of it can act on a terminal."""
    if len(text) <= _CLEAN_SLICE:
        return _clean(text)
    parts = []
    for start in range(0, len(text), _CLEAN_SLICE):
        parts.append(_clean(text[start:start + _CLEAN_SLICE]))
        await asyncio.sleep(0)
    return "".join(parts)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in _leaves(exc)]
        exc = next((e for e in leaves if isinstance(e, ToolError)), leaves[0] if leaves else exc)
    if isinstance(exc, ToolError):
        return str(exc)
    text = getattr(exc, "message", None) or str(exc)
    if type(exc).__name__ == "MCPError" and "closed" in text.lower():
        return "the server closed the connection before it was ready"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def cogency_version() -> str:
    """The installed cogency's version (for the MCP handshake)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cogency")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def require_sdk() -> None:
    """Raise ConfigurationError unless the ``mcp`` SDK is installed."""
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "MCP needs the official SDK: pip install 'cogency[mcp]'"
        ) from exc
