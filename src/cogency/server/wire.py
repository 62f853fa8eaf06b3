"""How the service writes JSON: UTF-8 with non-ASCII text as itself, and a lone surrogate (a
model can emit one: ``"\\ud800"`` in its JSON reply) as its JSON escape, never a failure to
encode after a run ran."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse


def dumps(payload: Any) -> str:
    """``payload`` as one line of JSON that always encodes as UTF-8."""
    text = json.dumps(payload, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, as JSON allows
        return json.dumps(payload)
    return text


class Json(JSONResponse):
    """The service's JSON responses (see the module)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()
