"""JSON encoding for stored data: compact, unicode kept, datetimes as ISO strings."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# Made once: ``json.dumps`` with options builds an encoder on every call.
_UNICODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_default).encode
_ASCII = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=_default).encode


def dumps(value: Any) -> str:
    text = _UNICODE(value)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates cannot be stored as UTF-8; escaped, they read back exactly.
        text = _ASCII(value)
    return text


loads = json.loads
