"""Tools from MCP servers: ``MCPServer(command=[...])`` or ``MCPServer(url=...)`` in ``Agent(tools=[...])``.

Built on the official ``mcp`` SDK (extra ``mcp``). An MCP server is hostile like any tool
output: every message it sends is bounded in size, every start and call in time, its text is
redacted and cut like other tool output, and its failures (it cannot start, dies mid-call,
hangs, answers with an error) become tool errors that name the server, so the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import signal
from collections import deque
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._jsonschema import SchemaError, inline_refs
from ..errors import ConfigurationError, ToolArgumentError, ToolError, UsageError
from .base import DEFAULT_TIMEOUT, Tool

if TYPE_CHECKING:
    from mcp import Client

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
"""Seconds a server has to start and list its tools."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""One message from a server: a longer stdio line closes the connection, a longer HTTP reply is
not read further (either way the call fails)."""
MAX_TOOLS = 200
"""Tools taken from one server; the rest are left out (and logged)."""
MAX_DESCRIPTION_CHARS = 1000
"""A tool description longer than this is cut: it goes into every prompt."""
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
    """A tool of an MCP server. Arguments are checked against the server's own JSON schema
    (the full schema, with jsonschema); ``parameters`` is that schema with local ``$ref``s
    inlined, so it can be embedded in a provider's structured-output schema."""

    server: MCPServer | None = None
    remote_name: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    def validate(self, args: Any) -> dict[str, Any]:
        if args is None:
            args = {}
        from jsonschema import validators
        from jsonschema.exceptions import SchemaError

        try:
            cls = validators.validator_for(self.input_schema)
            errors = sorted(cls(self.input_schema).iter_errors(args), key=lambda e: e.path)
        except (SchemaError, RecursionError) as exc:
            raise ToolArgumentError(
                f"tool {self.name!r}: the MCP server's input schema is unusable ({exc})"
            ) from exc
        if errors:
            error = errors[0]
            where = "args" + "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
            )
            raise ToolArgumentError(f"tool {self.name!r}: {where}: {error.message[:300]}")
        return dict(args)


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
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def __repr__(self) -> str:
        where = shlex.join(self.command) if self.command else self.url
        return f"MCPServer({self.name!r}: {where})"

    def _approval_needed(self, remote_name: str) -> bool:
        if isinstance(self.trusted, bool):
            return not self.trusted
        return remote_name not in self.trusted

    async def list_tools(self) -> list[Tool]:
        """The server's tools, starting it if it is not running.

        A server that cannot start is offered as one tool named after it, whose call tries
        again and reports why it failed: the model and the user see the error, the run goes on.
        """
        try:
            await self._ensure_started()
        except ToolError as exc:
            log.warning("%s", exc)
            return [self._stand_in(str(exc))]
        assert self._tools is not None
        return list(self._tools)

    async def aclose(self) -> None:
        """Stop the server (a stdio server's process is ended); never raises."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

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
        text = _result_text(result)
        # Off the event loop when big: a server may send megabytes of text.
        text = _clean(text) if len(text) < 50_000 else await asyncio.to_thread(_clean, text)
        if result.is_error:
            raise ToolError(f"MCP server {self.name!r}: {remote_name} failed: {text}")
        return text

    # -- lifecycle ---------------------------------------------------------------------------

    async def _ensure_started(self) -> _Connection:
        # One lock per event loop: an agent used through run_sync gets a new loop each time.
        loop = asyncio.get_running_loop()
        self._locks = {k: v for k, v in self._locks.items() if not k.is_closed()}
        async with self._locks.setdefault(loop, asyncio.Lock()):
            connection = self._connection
            if connection is not None and connection.retired:
                # A call timed out on it: its last call in flight stops it.
                self._connection = connection = None
            if connection is not None and (
                not connection.alive or connection.loop is not asyncio.get_running_loop()
            ):
                # Dead, or opened in an event loop that has ended (run_sync): start anew.
                await self._drop(connection)
                connection = None
            if connection is None:
                connection = _Connection(self)
                listing = await connection.open()
                self._connection = connection
                self._tools = self._make_tools(listing)
            return connection

    async def _drop(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None
        await connection.close()

    def _make_tools(self, listing: Sequence[Any]) -> list[Tool]:
        tools: list[Tool] = []
        names: set[str] = set()
        if len(listing) > MAX_TOOLS:
            log.warning("MCP server %r offers %d tools; only the first %d are used",
                        self.name, len(listing), MAX_TOOLS)
        for remote in listing[:MAX_TOOLS]:
            name = _tool_name(self.prefix + remote.name, names)
            names.add(name)
            schema = remote.input_schema if isinstance(remote.input_schema, dict) else {}
            schema = {**schema, "type": "object"}
            description = _clean(remote.description or remote.title or remote.name)
            if len(description) > MAX_DESCRIPTION_CHARS:
                description = description[:MAX_DESCRIPTION_CHARS] + "…"
            tool = MCPTool(
                name=name,
                description=description,
                parameters=_inline_refs(schema),
                func=self._caller(remote.name),
                timeout=self.timeout + 5,
                needs_approval=self._approval_needed(remote.name),
                server=self,
                remote_name=remote.name,
                input_schema=_without_patterns(schema),
            )
            tools.append(tool)
        return tools

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
            connection = await self._ensure_started()  # raises the start error again
            names = ", ".join(t.name for t in self._tools or [])
            return (f"MCP server {self.name!r} started (pid {connection.pid}); its tools "
                    f"({names}) can be used in the next task")

        return Tool(
            name=_tool_name(self.name, set()),
            description=(f"UNAVAILABLE: {_clean(error)[:500]}. Its tools cannot be used; "
                         "calling this tries to start the server again."),
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
    connection instead of filling memory, stderr is kept (its tail only) for error messages,
    and the server's whole process group is stopped on the way out."""
    import anyio
    import mcp_types
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    try:
        process = await anyio.open_process(
            command, env={**get_default_environment(), **env},
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
                        try:
                            message: SessionMessage | Exception = SessionMessage(
                                mcp_types.jsonrpc_message_adapter.validate_json(line)
                            )
                        except ValueError as exc:
                            message = exc
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
                    await _stop_process(process)
                group.cancel_scope.cancel()
    finally:
        connection.returncode = process.returncode


async def _stop_process(process: Any) -> None:
    """Close stdin, then SIGTERM, then SIGKILL the server's process group; bounded waits."""
    import anyio

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
    # Children the server left in its group go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    # asyncio's transport would otherwise be closed at garbage collection, maybe after its loop.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    with contextlib.suppress(Exception):
        transport.close()  # type: ignore[union-attr]


def _http(url: str, headers: Mapping[str, str], timeout: float) -> Any:
    import httpx2  # the SDK's HTTP client
    from mcp.client.streamable_http import streamable_http_client

    # Reads may idle while a server streams a long call (each call has its own time limit);
    # SSE events are bounded by the SDK (max_sse_event_size), other replies here.
    sent = httpx2.Headers(dict(headers))
    sent["accept-encoding"] = "identity"  # a compressed reply could be a zip bomb

    class BoundedBody(httpx2.AsyncByteStream):
        """A reply's body, read up to MAX_MESSAGE_BYTES (an event stream's events are bounded
        one by one instead), uncompressed. The SDK turns a StreamError into the call's error."""

        def __init__(self, response: httpx2.Response) -> None:
            assert isinstance(response.stream, httpx2.AsyncByteStream)  # an AsyncClient's
            self.stream = response.stream
            self.encoding = response.headers.get("content-encoding", "identity").lower()
            events = response.headers.get("content-type", "").lower().startswith(
                "text/event-stream")
            self.limit = None if events else MAX_MESSAGE_BYTES

        async def __aiter__(self) -> AsyncIterator[bytes]:
            if self.encoding not in ("", "identity"):
                raise httpx2.StreamError(f"the reply is compressed ({self.encoding[:40]}), "
                                         "which was not asked for")
            total = 0
            async for chunk in self.stream:
                total += len(chunk)
                if self.limit is not None and total > self.limit:
                    raise httpx2.StreamError(f"the reply is over {self.limit} bytes "
                                             "(MAX_MESSAGE_BYTES); it was not read further")
                yield chunk

        async def aclose(self) -> None:
            await self.stream.aclose()

    async def bound(response: httpx2.Response) -> None:
        response.stream = BoundedBody(response)

    client = httpx2.AsyncClient(headers=sent, follow_redirects=False,
                                timeout=httpx2.Timeout(timeout, read=300.0),
                                event_hooks={"response": [bound]})

    @contextlib.asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        async with client, streamable_http_client(url, http_client=client) as streams:
            yield streams

    return transport()


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


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with local ``$ref`` entries inlined (a recursive or unknown one becomes ``{}``,
    a schema too large once inlined accepts any arguments): a tool's parameters are embedded
    in the step schema, where ``#/...`` would point elsewhere."""
    try:
        result = inline_refs(schema, lenient=True)
    except SchemaError:
        result = {}
    return {**result, "type": "object"}


def _without_patterns(schema: Any) -> Any:
    """The schema for validation, minus ``pattern``s: a server's regex run on the model's
    text on the event loop could take forever (Python's re has no time limit). The server
    checks its own patterns."""
    if isinstance(schema, list):
        return [_without_patterns(item) for item in schema]
    if isinstance(schema, dict):
        return {key: _without_patterns(value) for key, value in schema.items()
                if not (key == "pattern" and isinstance(value, str))}
    return schema


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
