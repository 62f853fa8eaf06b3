"""The ASGI application: the native API, its limits, its errors, and a graceful shutdown."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..agent import Agent
from . import errors, openai_api, page, routes, telemetry
from .errors import RequestTooLarge, error_body, shown_path
from .runs import Runs
from .wire import Json

log = logging.getLogger("cogency.server")


@dataclass(frozen=True)
class Settings:
    """The service's limits and options (``cogency serve --help`` names them)."""

    max_body: int = 1_000_000
    """Bytes a request body may have; a larger one gets 413."""
    max_query: int = 32_000
    """Characters a query may have; a longer one gets 413."""
    max_runs_per_key: int = 4
    """Runs one key may have in flight on one replica; another gets 429."""
    cors_origins: tuple[str, ...] = ()
    """Origins a browser may call the API from; none (CORS off) unless configured."""
    grace: float = 30.0
    """Seconds a shutdown waits for runs in flight before saving them as resumable."""
    header_timeout: float = 10.0
    """Seconds a request's headers may take to arrive (``cogency serve``); then 408."""
    body_timeout: float = 30.0
    """Seconds a request's body may take to arrive after its headers; then 408."""
    max_connections: int = 1000
    """Connections ``cogency serve`` holds at once; one more gets 503 and is closed."""
    max_connections_per_client: int = 100
    """Connections from one address at once; one more gets 503 and is closed."""


def create_app(agent: Agent, settings: Settings = Settings(), *, metrics: Any = None) -> FastAPI:
    """The service for ``agent`` (and its store). The caller closes the agent afterwards.

    ``metrics``, a ``prometheus_client`` registry, is served as text at ``/metrics``."""
    runs = Runs(agent, max_per_key=settings.max_runs_per_key, max_query=settings.max_query)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if agent.memory is not None:
            agent.memory.start()  # learn what was left queued (by any replica), from now on
        yield
        await runs.shutdown(settings.grace)

    app = FastAPI(
        title="Cogency",
        version=__version__,
        summary="A stateful agent for many users: each key acts as its user only.",
        lifespan=lifespan,
        docs_url=None,  # page.py serves /docs with Swagger UI from the package, not a CDN
        redoc_url=None,
        default_response_class=Json,
        # FastAPI traces each request (continuing a W3C traceparent) once a provider is set;
        # a run started by a request is inside its span. Its logs would carry the input
        # values of a rejected body (a query): off, as no content is recorded by default.
        telemetry={"logs": False},
    )
    app.state.store = agent.store
    app.state.runs = runs
    app.state.settings = settings
    errors.install(app)
    app.include_router(routes.router)
    app.include_router(openai_api.router)
    app.include_router(page.router)

    @app.get("/health", summary="Liveness (no key needed)", tags=["service"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "runs": len(runs)}

    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    if metrics is not None:
        telemetry.serve_metrics(app, metrics)
    app.add_middleware(_Limits, max_body=settings.max_body)
    return app


class _Limits:
    """Refuses bodies over ``max_body`` bytes (413) and logs one line per request: method,
    path (percent-encoded: no character of it can break the line or drive a terminal),
    status and time. Never the query string, a header, or a body: no key, query or answer
    reaches the log."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 0
        received = 0
        tripped = False

        async def counted_receive() -> Message:
            nonlocal received, tripped
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:  # a chunked body: stop reading it here
                    tripped = True
                    raise RequestTooLarge(self._too_large)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal status
            if tripped:
                return  # the app's answer to the broken read; the 413 below replaces it
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if length.isdigit() and int(length) <= self.max_body:
                try:
                    await self.app(scope, counted_receive, watched_send)
                except RequestTooLarge:
                    if not tripped:
                        raise
                if not tripped:
                    return
            status = 413
            body = json.dumps(error_body("too_large", self._too_large)).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        finally:
            log.info("%s %s %d %.1fms", scope["method"], shown_path(scope["path"]), status,
                     (time.perf_counter() - began) * 1000)

    @property
    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_body} bytes, this server's limit"
