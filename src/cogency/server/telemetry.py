"""``/metrics``: the service's OpenTelemetry metrics in Prometheus text (``serve --metrics``)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response


def serve_metrics(app: FastAPI, registry: Any) -> None:
    """Add ``GET /metrics`` rendering ``registry`` (a ``prometheus_client`` registry fed by the
    OpenTelemetry SDK's Prometheus reader). No key: no metric has a label naming a user."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    @app.get("/metrics", summary="Metrics in Prometheus text (no key needed)",
             tags=["service"], response_class=Response)
    async def metrics() -> Response:
        # Collecting walks every series: off the event loop, like any CPU-bound work here.
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
