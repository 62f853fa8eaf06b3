"""``cogency serve``: an agent as a multi-tenant HTTP service (extra ``serve``).

API keys map to users (:mod:`.keys`); every request is scoped to its key's user in one place
(:mod:`.auth`); runs go through :class:`~cogency.Agent` and are followed live over
Server-Sent Events (:mod:`.runs`, :mod:`.sse`); the native API is :mod:`.routes`, the
OpenAI-compatible one :mod:`.openai_api` (what each of its request fields does:
:mod:`.openai_requests`), the web page :mod:`.page`; every error becomes a
status and a JSON body in :mod:`.errors` (written by :mod:`.wire`); ``cogency serve`` listens
with the time limits and connection caps of :mod:`.transport`. Replicas are stateless:
everything lives in the store (idempotency keys too), so many of them can serve one
PostgreSQL database.

    from cogency.server import create_app       # an ASGI app (FastAPI)
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Imported on use: the web stack is an optional extra, and `cogency keys` needs none of it.
    if name in ("create_app", "Settings"):
        from . import app

        return getattr(app, name)
    raise AttributeError(name)


__all__ = ["Settings", "create_app"]
