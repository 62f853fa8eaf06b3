"""How ``cogency serve`` listens: uvicorn, with what a server open to the public needs around it.

- **A request arrives in time or not at all.** Its head (request line and headers) within
  ``header_timeout`` seconds (from the connection's start, or from the first byte of a later
  request on a kept-alive one; a request pipelined behind another is timed from when that one
  is answered), its body within ``body_timeout`` seconds of its head: otherwise the client
  gets 408 and the connection is closed. uvicorn alone waits for ever for a client that sends
  half a request, or nothing, and a slow client that trickles bytes never resets the budget.
- **A request's head is at most** ``MAX_HEAD_BYTES`` (64 KiB), its URL included: a larger one
  gets 431 and the connection is closed. httptools, the parser, sets no bound at all.
  A request httptools cannot parse gets 400 and the connection is closed.
- **A bounded number of connections**: at most ``max_connections_per_client`` from one
  address (one more is answered 503 and closed at once, before anything of it is read), and
  ``max_connections`` in all: when they are taken, a new connection closes the one that has
  waited longest for its request's headers (a slow client's: 408), or is refused (503) when
  every connection has a request in hand. A client that opens connections and sends
  nothing cannot keep anyone else out. Refusals and cut-offs are logged at most once per kind
  every 10 seconds, with their count.
- **No protocol switch**: the service has no WebSockets; a request asking to upgrade is
  answered as a plain one, and its connection closed after the answer.
- **One budget for a shutdown.** On SIGTERM (or Ctrl-C) the server stops listening, runs in
  flight get ``grace`` seconds to finish, then the rest are saved as resumable tasks and each
  follower gets its final ``error`` event saying so; then the responses end and the process
  exits. (uvicorn's own graceful shutdown would wait ``grace`` for the connections first and
  cut the followers off before the runs were saved, then wait again.)

An answer of this layer's own (400, 408, 431) is written only when it is the next one the
client expects: while an earlier request on the connection is still being answered, the
connection is closed without one (any more bytes would corrupt that answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .app import Settings
from .errors import error_body

log = logging.getLogger("cogency.server")

FLUSH_SECONDS = 5
"""After the runs of a shutdown are over (finished or saved), how long the responses that
follow them may take to deliver their last events before their connections are closed."""
BACKLOG = 128
"""Connections the kernel queues for the server, and so the most asyncio accepts at once
before any is turned away (``cogency serve`` keeps file descriptors spare for such bursts)."""
MAX_HEAD_BYTES = 64 * 1024
"""The most a request's head (request line and headers) may take; more is answered 431.
Four times what h11 allowed, far more than any browser or SDK sends."""


def _answer(status: int, reason: str, kind: str, message: str) -> bytes:
    """A whole HTTP response that closes the connection, for a request never handed to the
    app (the one place this layer answers by itself)."""
    body = json.dumps(error_body(kind, message)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop httptools at a head over ``MAX_HEAD_BYTES``."""


class _Notes:
    """Log lines about refused and cut-off connections, at most one per kind every
    ``every`` seconds (with how many there were): a flood of connections must not become a
    flood of log lines."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._kinds: dict[str, tuple[int, float]] = {}

    def note(self, level: int, text: str) -> None:
        count, last = self._kinds.get(text, (0, float("-inf")))
        count += 1
        now = time.monotonic()
        if now - last < self.every:
            self._kinds[text] = (count, last)
            return
        log.log(level, "%s%s", text, f" ({count} times since the last such line)"
                if count > 1 else "")
        self._kinds[text] = (0, now)


def protocol_class(settings: Settings) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (httptools) with the time limits, the head bound and the
    connection caps of ``settings`` (one class per server: its connections share the counts)."""
    per_address: Counter[str] = Counter()
    waiting: OrderedDict[Any, None] = OrderedDict()
    """Connections waiting for a request's headers, the longest waiting first."""
    notes = _Notes()

    class Guarded(HttpToolsProtocol):
        _address: str | None = None
        _phase: str | None = None
        _timer: asyncio.TimerHandle | None = None
        _head: int | None = 0
        """Bytes received of the request head awaited (the first one's from the connection's
        start), or None while none is: a body is being read, or nothing has come since the
        last head."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._address = self.client[0] if self.client else None
            if self._address is not None:
                per_address[self._address] += 1
            if (self._address is not None
                    and per_address[self._address] > settings.max_connections_per_client):
                self._refuse("too many connections from your address; close some, then retry")
                return
            if len(self.connections) > settings.max_connections:
                # Full: the connection that has waited longest for its request's headers
                # (a slow client's) makes room; if none waits, this one is refused.
                slowest = next(iter(waiting), None)
                if slowest is None:
                    self._refuse("the server has as many connections as it takes; retry later")
                    return
                slowest._cut("headers", "in time (the server was full and needed the "
                                        "connection)")
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set_phase(None)
            if self._address is not None:
                per_address[self._address] -= 1
                if per_address[self._address] <= 0:
                    del per_address[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # In place of uvicorn's, which answers 400 (in text) to any parser error, ours
            # included, and has no WebSocket protocol here to hand an upgrade to.
            if self._head is None and not self.cycle.more_body:
                self._head = 0  # the last request is all read: these bytes begin the next
                # one's head (even a blank line, which httptools skips without a callback)
            if self._head is not None:
                self._head += len(data)  # all the head's, unless it ends in this chunk
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass  # no WebSockets here: answered as a plain request (see on_headers_complete)
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _HeadTooLarge):
                    self._too_large()
                else:
                    notes.note(logging.INFO, "closed connections that sent invalid HTTP")
                    self._close(400, "Bad Request", "invalid_request",
                                "the request is not valid HTTP/1.1")
                return
            if self._head is not None and self._head > MAX_HEAD_BYTES:
                self._too_large()
                return
            self._watch()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head is None:  # begun after another request within one chunk: its
                self._head = 0  # bytes count from the next chunk, its whole size at its end

        def on_headers_complete(self) -> None:
            # the least the head took on the wire: "name:value\r\n" for each header
            size = len(self.url) + sum(len(name) + len(value) + 3 for name, value in self.headers)
            if size > MAX_HEAD_BYTES:
                raise _HeadTooLarge  # stops the parser; data_received answers 431
            self._head = None
            super().on_headers_complete()
            if self.parser.should_upgrade():
                # httptools parses nothing after a request that asks to switch protocols
                self.cycle.keep_alive = False

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def _wanted(self) -> str | None:
            """What the connection waits for from its client now: a request's headers, or
            its body. While the app answers (a request queued behind another waits for it
            too, its reading paused), or between requests (uvicorn's keep-alive time-out),
            nothing is timed here."""
            cycle = self.cycle
            if self.transport.is_closing() or self.pipeline:
                return None
            if cycle is not None and not cycle.response_complete:
                reading = cycle.more_body and not cycle.disconnected
                return "body" if reading and not cycle.response_started else None
            return None if self._head is None else "headers"

        def _watch(self) -> None:
            self._set_phase(self._wanted())

        def _set_phase(self, phase: str | None) -> None:
            if phase == self._phase:
                return  # the same wait goes on: its budget runs from when it began
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._phase == "headers":
                waiting.pop(self, None)
            self._phase = phase
            if phase is not None:
                seconds = (settings.header_timeout if phase == "headers"
                           else settings.body_timeout)
                self._timer = self.loop.call_later(seconds, self._expired, phase)
                if phase == "headers":
                    waiting[self] = None

        def _expired(self, phase: str) -> None:
            self._timer = None
            if self._wanted() != phase:  # the wait ended without an event telling so
                self._watch()
                return
            seconds = settings.header_timeout if phase == "headers" else settings.body_timeout
            self._cut(phase, f"within {seconds:g} s")

        def _cut(self, phase: str, why: str) -> None:
            """Close the connection, telling the client (408) that its request came too late."""
            notes.note(logging.INFO,
                       f"closed connections whose request's {phase} did not arrive {why}")
            self._close(408, "Request Timeout", "timeout",
                        f"the request's {phase} did not arrive {why}")

        def _too_large(self) -> None:
            notes.note(logging.INFO, "closed connections whose request's head was over "
                                     f"{MAX_HEAD_BYTES} bytes")
            self._close(431, "Request Header Fields Too Large", "too_large",
                        f"the request's line and headers are over {MAX_HEAD_BYTES} bytes")

        def _refuse(self, message: str) -> None:
            notes.note(logging.WARNING, f"refused connections: {message}")
            self._close(503, "Service Unavailable", "unavailable", message)

        def _close(self, status: int, reason: str, kind: str, message: str) -> None:
            """Answer ``status`` if it is the answer the client waits for next, and close."""
            self._set_phase(None)
            cycle = self.cycle
            # Not while an earlier request waits for its answer, or gets it: the client
            # would take this one for it, or find it in the middle of it.
            earlier = bool(self.pipeline) or (
                cycle is not None and not cycle.response_complete
                and not (cycle.more_body and not cycle.response_started))
            if not earlier:
                self.transport.write(_answer(status, reason, kind, message))
            self.transport.close()

    return Guarded


class _Server(uvicorn.Server):
    """uvicorn's server that runs ``drain`` (the one budget for runs in flight) as soon as it
    stops listening, before it waits for the connections; and that stops on SIGTERM/SIGINT
    without re-raising the signal afterwards, so the agent and the store still close and the
    exit status is 0."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        drain = asyncio.ensure_future(self._drain())
        while not drain.done():  # a second signal (force_exit) cuts the wait short: the
            await asyncio.wait([drain], timeout=0.1)  # agent's close() then saves the runs
            if self.force_exit:
                drain.cancel()
                await asyncio.wait([drain])
        if not drain.cancelled() and drain.exception() is not None:
            log.error("finishing the runs in flight failed", exc_info=drain.exception())
        await super().shutdown(sockets)


async def serve(app: Any, settings: Settings, listener: socket.socket,
                drain: Callable[[], Awaitable[None]]) -> None:
    """Serve ``app`` on ``listener`` until SIGTERM or SIGINT; ``drain`` finishes or saves the
    runs in flight (within ``settings.grace``) once the server stops listening."""
    config = uvicorn.Config(
        app, log_config=None, access_log=False, server_header=False,
        http=protocol_class(settings), ws="none", backlog=BACKLOG,
        timeout_graceful_shutdown=FLUSH_SECONDS,
    )
    await _Server(config, drain).serve(sockets=[listener])
