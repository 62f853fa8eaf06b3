"""Server-Sent Events: a run's events, one ``event:``/``data:`` record each."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .runs import Run

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def record(event: dict[str, Any], event_id: int | None = None) -> bytes:
    """One SSE record. ``data`` is one line of JSON (newlines inside strings are escaped)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def _records(run: Run) -> AsyncIterator[bytes]:
    number = 0
    async for event in run.follow():
        if event is None:
            yield b": keep-alive\n\n"
            continue
        yield record(event, number)
        number += 1


def response(run: Run) -> StreamingResponse:
    """The run's events from its first, live, ending after ``end`` (or a fatal ``error``)."""
    return StreamingResponse(_records(run), media_type="text/event-stream", headers=HEADERS)
