"""The web page at ``/``: a key, a chat with live steps, approvals, the profile. No build step:
one HTML file and one script, served with a Content-Security-Policy that allows nothing else.

Also ``/docs`` (Swagger UI, served from the package: it works without internet) and
``/favicon.ico``.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from ..errors import NotFoundError

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


@router.get("/favicon.ico")
async def favicon() -> Response:
    return Response((_STATIC / "favicon.ico").read_bytes(), media_type="image/x-icon",
                    headers={"Cache-Control": "max-age=86400"})


SWAGGER_UI = "5.35.0"
"""The version of Swagger UI in static/swagger-ui (from npm's swagger-ui-dist)."""
_SWAGGER_FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "LICENSE": "text/plain; charset=utf-8",
    "NOTICE": "text/plain; charset=utf-8",
}


@router.get("/docs")
async def docs() -> HTMLResponse:
    """Swagger UI over ``/openapi.json``, its script and style served from here."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Cogency API",
        swagger_js_url=f"/docs/swagger-ui/swagger-ui-bundle.js?v={SWAGGER_UI}",
        swagger_css_url=f"/docs/swagger-ui/swagger-ui.css?v={SWAGGER_UI}",
        swagger_favicon_url="/favicon.ico",
    )


@router.get("/docs/swagger-ui/{name}")
async def swagger_asset(name: str) -> Response:
    media_type = _SWAGGER_FILES.get(name)
    if media_type is None:  # only the files listed: never a path of the client's choosing
        raise NotFoundError(f"no file {name!r} here")
    return Response((_STATIC / "swagger-ui" / name).read_bytes(), media_type=media_type,
                    headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options":
                             "nosniff"})
