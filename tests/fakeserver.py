"""A scripted HTTP server on 127.0.0.1 for provider adapter tests.

Each request takes the next :class:`Reply` from the script (JSON, server-sent events, an
error status with headers, or a delay first) and is recorded, so a test can assert both on
what the adapter did and on what it sent over the wire.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """A dict/list is sent as JSON; a str as is."""
    events: list[str] | None = None
    """Server-sent event blocks, each sent and flushed on its own (``data: …`` lines)."""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds to wait before answering (a slow provider)."""
    hang: float = 0.0
    """Seconds to keep a stream open after its events (a provider that stalls)."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event carrying ``data`` as JSON (or a raw string)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


class FakeServer:
    """``with FakeServer() as server: server.script(Reply(...)); … server.url``"""

    def __init__(self) -> None:
        self._replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._handle(self)

            def do_POST(self) -> None:
                owner._handle(self)

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(
                Request(handler.command, handler.path, {k.lower(): v for k, v in
                                                        handler.headers.items()}, body)
            )
            reply = self._replies.popleft() if self._replies else Reply(
                500, {"error": {"message": "the fake server's script ran out"}}
            )
        if reply.delay and self._stop.wait(reply.delay):
            return
        try:
            self._send(handler, reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _send(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        handler.send_response(reply.status)
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        if reply.events is not None:
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Cache-Control", "no-cache")
            handler.end_headers()
            for block in reply.events:
                handler.wfile.write(block.encode())
                handler.wfile.flush()
            if reply.hang:
                self._stop.wait(reply.hang)
            return
        body = reply.body
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


async def stream_hi(llm: Any, store: Any) -> tuple[Any, list[Any]]:
    """Stream "hi" of user "eve" through a real ``Agent``, then close ``llm``: (result, events)."""
    from cogency import Agent

    async with Agent(llm=llm, store=store) as agent:
        stream = agent.stream("hi", user_id="eve")
        events = [event async for event in stream]
    await llm.close()
    return stream.result, events
