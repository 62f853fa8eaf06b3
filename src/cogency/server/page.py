"""The web page at ``/``: a key, a chat with live steps, approvals, the profile. No build step:
one HTML file and one script, served with a Content-Security-Policy that allows nothing else."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

_STATIC = files(__package__) / "static"
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _asset(name: str, media_type: str) -> Response:
    return Response((_STATIC / name).read_bytes(), media_type=media_type, headers=_HEADERS)


@router.get("/")
async def index() -> Response:
    return _asset("index.html", "text/html; charset=utf-8")


@router.get("/app.js")
async def script() -> Response:
    return _asset("app.js", "text/javascript; charset=utf-8")


@router.get("/app.css")
async def style() -> Response:
    return _asset("app.css", "text/css; charset=utf-8")
