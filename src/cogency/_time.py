"""Timestamps: timezone-aware UTC, stored as ISO strings."""

from __future__ import annotations

from datetime import datetime, timezone


def now() -> datetime:
    return datetime.now(timezone.utc)


def parse(value: str | datetime) -> datetime:
    """Read an ISO timestamp; naive values are taken as UTC."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
