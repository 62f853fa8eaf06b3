"""Every error the service answers with, mapped to an HTTP status in one place.

The body is always ``{"error": {"type": …, "message": …}}``; the package's own errors keep
their message, anything else is a 500 whose details stay in the server's log.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from .wire import Json
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    CogencyError,
    ConflictError,
    LLMError,
    NotFoundError,
    StorageError,
    StoreUnavailableError,
    ToolError,
    UsageError,
)

log = logging.getLogger("cogency.server")


NOT_APPLIED = "X-Cogency-Not-Applied"
"""The header naming the fields of an OpenAI request that were accepted but changed nothing
(a penalty, or an option the agent's model cannot take): never ignored silently."""
NO_RETRY = {"x-should-retry": "false"}
"""On every error told after a run started: the OpenAI SDKs (and others built on Stainless)
obey it, where they would retry a 409 or 5xx twice and so run the agent twice more."""


class ServiceError(CogencyError):
    """An error of the HTTP layer itself, with its status."""

    status = 400
    kind = "invalid_request"
    default_headers: dict[str, str] | None = None

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers if headers is not None else self.default_headers


class Unsupported(ServiceError):
    """A request field Cogency cannot honour (never silently ignored)."""

    kind = "unsupported_parameter"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidValue(Unsupported):
    """A request field whose value is out of its range."""

    kind = "invalid_value"


class Unauthorized(ServiceError):
    status, kind = 401, "unauthorized"


class TooManyRuns(ServiceError):
    status, kind = 429, "too_many_runs"


class ShuttingDown(ServiceError):
    status, kind = 503, "unavailable"


class RequestTooLarge(ServiceError):
    status, kind = 413, "too_large"


class ModelNotFound(ServiceError):
    status, kind = 404, "model_not_found"


class RunFailed(ServiceError):
    """A run over without an answer (one that can be resumed) where one was required."""

    status, kind = 502, "run_failed"
    default_headers = NO_RETRY


class AwaitingApproval(ServiceError):
    """A run paused for a person's decision where an answer was required."""

    status, kind = 409, "awaiting_approval"
    default_headers = NO_RETRY


class RunError(ServiceError):
    """A run's failure (``status``, ``kind``: as :func:`status_of` told it), reported after
    the run started: never to be retried into a second run."""

    default_headers = NO_RETRY

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class StillRunning(ServiceError):
    """A request with an idempotency key whose first request's run has not ended yet (here
    or on another replica): retrying is safe, and gets that run's outcome once it is over."""

    status, kind = 409, "in_progress"
    default_headers = {"x-should-retry": "true", "Retry-After": "2"}


class KeyReused(ServiceError):
    """An idempotency key sent again with another request."""

    status, kind = 422, "idempotency_key_reused"
    default_headers = NO_RETRY


# Most specific first: the first class that matches decides.
_STATUS: tuple[tuple[type[CogencyError], int, str], ...] = (
    (NotFoundError, 404, "not_found"),
    (ConflictError, 409, "conflict"),
    (UsageError, 400, "invalid_request"),
    (ToolError, 400, "invalid_request"),
    (StoreUnavailableError, 503, "unavailable"),
    (StorageError, 500, "storage_error"),
    (LLMError, 502, "model_error"),
)


def shown_path(path: str) -> str:
    """A request's path for the log: percent-encoded as on the wire (controls, spaces,
    newlines and non-ASCII included), so one request is one line whatever it asked for."""
    shown = quote(path[:1000], safe="/:@!$&'()*+,;=-._~")
    return shown if len(path) <= 1000 else f"{shown}…({len(path)} characters)"


def status_of(exc: CogencyError) -> tuple[int, str]:
    """The HTTP status and error type for one of the package's errors."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.kind
    for kind, status, name in _STATUS:
        if isinstance(exc, kind):
            return status, name
    return 500, "error"


def error_body(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message, **extra}}


def openai_body(status: int, kind: str, message: str, param: str | None = None
                ) -> dict[str, Any]:
    """OpenAI's error shape, for the ``/v1`` routes that its clients call (and their streams)."""
    family = ("authentication_error" if status == 401 else "rate_limit_error" if status == 429
              else "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": family, "param": param, "code": kind}}


def respond(request: Request, status: int, kind: str, message: str, *,
            param: str | None = None, headers: dict[str, str] | None = None,
            **extra: Any) -> Json:
    """The error response: OpenAI's shape under ``/v1``, the service's own elsewhere."""
    if request.url.path.startswith("/v1/"):
        return Json(openai_body(status, kind, message, param), status, headers=headers)
    if param is not None:
        extra["param"] = param
    return Json(error_body(kind, message, **extra), status, headers=headers)


def install(app: Any) -> None:
    """Register the handlers that turn every error into a JSON body."""

    @app.exception_handler(CogencyError)
    async def cogency_error(request: Request, exc: CogencyError) -> Json:
        status, kind = status_of(exc)
        if status >= 500:
            log.warning("%s %s failed: %s", request.method, shown_path(request.url.path),
                        type(exc).__name__)
        headers = exc.headers if isinstance(exc, ServiceError) else None
        return respond(request, status, kind, str(exc), headers=headers,
                       param=getattr(exc, "param", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Json:
        problems = [
            {"where": ".".join(str(part) for part in error.get("loc", ())),
             "problem": str(error.get("msg", ""))}
            for error in exc.errors()
        ]
        first = problems[0] if problems else {"where": "body", "problem": "invalid"}
        message = f"{first['where']}: {first['problem']}"
        if request.url.path.startswith("/v1/"):  # OpenAI answers 400 to a malformed request
            return respond(request, 400, "invalid_request", message,
                           param=first["where"].removeprefix("body."))
        return respond(request, 422, "invalid_request", message, details=problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Json:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return respond(request, exc.status_code, kind, str(exc.detail),
                       headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Json:
        log.error("%s %s: unexpected %s", request.method, shown_path(request.url.path),
                  type(exc).__name__, exc_info=exc)
        return respond(request, 500, "internal", "internal server error")
