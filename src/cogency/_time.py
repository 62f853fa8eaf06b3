"""Timestamps: timezone-aware UTC, stored as ISO strings."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from functools import lru_cache


def now() -> datetime:
    return datetime.now(timezone.utc)


def stamp(later: float = 0.0) -> str:
    """The time ``later`` seconds from now as stored: the text ``now().isoformat()`` gives
    (microseconds, omitted when 0, and ``+00:00``), made without a ``datetime`` (a turn
    stamps several rows)."""
    seconds, micro = divmod(time.time_ns() // 1000 + round(later * 1_000_000), 1_000_000)
    second = _second(seconds)
    return f"{second}.{micro:06d}+00:00" if micro else f"{second}+00:00"


@lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def parse(value: str | datetime) -> datetime:
    """Read an ISO timestamp; naive values are taken as UTC."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
