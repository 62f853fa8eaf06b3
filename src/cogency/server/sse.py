"""Server-Sent Events: a run followed live, its events turned into records by each endpoint.

The native API sends one ``event:``/``data:`` record per event; the OpenAI endpoints send
their own chunks. Either way a quiet run gets a keep-alive comment line, and a run that
fails midway ends with its fatal ``error`` event (:meth:`.Run.follow`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

from .runs import Run
from .wire import dumps

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_KEEP_ALIVE = b": keep-alive\n\n"

Format = Callable[[dict[str, Any]], Iterable[bytes]]
"""An endpoint's records for one event of a run (none, one or several)."""
End = Callable[[], Iterable[bytes]]
"""An endpoint's records once the run is over (after its last event)."""


def record(event: dict[str, Any], event_id: int | None = None) -> bytes:
    """One SSE record. ``data`` is one line of JSON (newlines inside strings are escaped)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event['type']}\ndata: {dumps(event)}\n\n".encode()


def _numbered() -> Format:
    """The native records: each event as itself, numbered from 0."""
    numbers = itertools.count()
    return lambda event: (record(event, next(numbers)),)


async def _records(run: Run, each: Format, end: End) -> AsyncIterator[bytes]:
    async for event in run.follow():
        if event is None:
            yield _KEEP_ALIVE
            continue
        for chunk in each(event):
            yield chunk
    for chunk in end():
        yield chunk


def response(run: Run, each: Format | None = None, end: End = tuple,
             headers: dict[str, str] | None = None) -> StreamingResponse:
    """The run's events from its first, live, as ``each`` formats them (by default the
    native records), then what ``end`` adds once the run is over."""
    return StreamingResponse(_records(run, each or _numbered(), end),
                             media_type="text/event-stream", headers={**HEADERS, **(headers or {})})
