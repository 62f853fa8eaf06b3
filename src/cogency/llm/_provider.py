"""What every provider adapter shares: retries with backoff, a time limit, error mapping.

An adapter implements one attempt (``_attempt``: the SDK call, yielding text pieces and then
the :class:`Completion`) and says what an SDK exception means (``_failure``); this module
retries rate limits, server errors and timeouts with exponential backoff, honouring
``Retry-After``, under a per-attempt time limit and a total one, and reports each retry
(:func:`~cogency.llm.base.report_retry`, the agent's ``retry`` event). Errors leave here as
:mod:`cogency.errors` types with ``retried=True``, so the agent does not retry them again.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import logging
import copy
import random
import re
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import (
    AuthenticationError,
    ConfigurationError,
    ContextLengthError,
    LLMError,
    LLMTimeoutError,
    ModelNotFoundError,
    RateLimitError,
    UsageError,
)
from .base import LLM, Completion, Message, check_options, report_retry

log = logging.getLogger("cogency.llm")

DEFAULT_TIMEOUT = 120.0
"""Seconds one attempt may take (all of it, streamed or not) before it counts as timed out."""
DEFAULT_TOTAL_TIMEOUT = 180.0
"""Seconds a call may take over all its attempts and waits: a server that hangs costs at most
this, not ``timeout`` × attempts."""
DEFAULT_RETRIES = 3
MAX_RETRY_DELAY = 30.0
"""A ``Retry-After`` longer than this fails at once instead of blocking the run."""


def require(module: str, extra: str) -> Any:
    """Import a provider SDK, or say which pip extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"this model needs the {module!r} package: pip install 'cogency[{extra}]'"
        ) from exc


@dataclass
class Failure:
    """What an SDK exception means for the retry loop."""

    error: LLMError
    retryable: bool = False
    retry_after: float | None = None
    schema_rejected: bool = False
    """The provider refused the structured-output schema: retry once without it."""
    shown: bool = False
    """Part of the reply had already been streamed (an error inside a stream after a 200)."""


class ProviderLLM(LLM):
    """An LLM reached through a provider SDK (see the module docstring).

    ``timeout`` bounds each attempt (seconds) and ``total_timeout`` the whole call, waits
    included; ``max_retries`` counts retries after the first attempt, ``retry_delay`` is the
    first backoff (doubled each time, with jitter). ``context_window`` is the model's window in
    tokens (adapters that can ask the server do so in :meth:`start` when it is not given).
    ``structured=False`` never sends the JSON schema (the agent still validates replies).
    """

    provider = "llm"
    key_hint = ""
    """What to set when the provider rejects the credentials."""
    _sdk: Any = None
    """The provider's SDK module, imported when the adapter is made."""

    def __init__(
        self,
        model: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
        max_retries: int = DEFAULT_RETRIES,
        retry_delay: float = 0.5,
        max_retry_delay: float = MAX_RETRY_DELAY,
        max_tokens: int | None = None,
        temperature: float | None = None,
        context_window: int | None = None,
        structured: bool = True,
    ) -> None:
        if not model:
            raise ConfigurationError(f"{self.provider}: name a model, e.g. '{self.provider}:…'")
        if timeout <= 0 or total_timeout <= 0 or max_retries < 0 or retry_delay < 0:
            raise ConfigurationError(
                "timeout and total_timeout must be > 0; max_retries and retry_delay >= 0"
            )
        if max_tokens is not None and max_tokens < 1:
            raise ConfigurationError("max_tokens must be a positive number of tokens")
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.timeout = timeout
        self.total_timeout = max(total_timeout, timeout)
        self.max_retries = max_retries
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.structured = structured
        self.options: dict[str, Any] = {}
        """Set by :meth:`with_options` (the temperature lives in :attr:`temperature`)."""
        self.window_given = context_window is not None
        """The caller named the window: it is never replaced by what a server says."""
        if context_window is not None:
            self.context_window = context_window

    def with_options(self, **options: Any) -> ProviderLLM:
        """A shallow copy (same client and connections) that sends these sampling options
        with every call; an option its provider cannot honour raises ``UsageError``."""
        checked = check_options(options)
        for name, value in checked.items():
            why = self._cannot(name, value)
            if why:
                raise UsageError(f"{self.name} cannot honour {name}={value!r}: {why}")
        more = copy.copy(self)
        more.temperature = checked.pop("temperature", self.temperature)
        more.options = {**self.options, **checked}
        return more

    def _cannot(self, option: str, value: Any) -> str | None:
        """Why this adapter cannot send ``option`` with ``value`` (``None``: it can)."""
        return None

    def with_output_limit(self, max_tokens: int) -> ProviderLLM:
        """A shallow copy (same client and connections) whose replies may be ``max_tokens`` long."""
        more = copy.copy(self)
        more.max_tokens = max_tokens
        return more

    # -- what an adapter implements ---------------------------------------------------

    @abstractmethod
    def _attempt(
        self, messages: list[Message], schema: dict[str, Any] | None, stream: bool
    ) -> AsyncIterator[str | Completion]:
        """One SDK call: text pieces as they arrive (when streaming), then the Completion."""

    @abstractmethod
    def _failure(self, exc: Exception) -> Failure | None:
        """What an SDK exception means, or ``None`` if it is not the SDK's."""

    def _sdk_failure(self, exc: Exception, where: str) -> Failure | None:
        """The mapping shared by the OpenAI and Anthropic SDKs (same exception classes)."""
        sdk = self._sdk
        if isinstance(exc, sdk.APITimeoutError):
            return self._timeout_failure()
        if isinstance(exc, sdk.APIConnectionError):
            return self._status_failure(None, f"cannot connect to {where} ({exc})")
        if isinstance(exc, sdk.APIError):
            status = getattr(exc, "status_code", None)
            body = getattr(exc, "body", None)
            if status is None or 200 <= status < 300:
                # An error event inside a stream that began with 200 OK (Anthropic's
                # `event: error`, OpenAI's `data: {"error": …}`): its type says which status
                # it stands for, so it is mapped and retried like its HTTP twin.
                status = _status_of_error_body(body)
            response = getattr(exc, "response", None)
            return self._status_failure(
                status, sdk_message(exc), getattr(response, "headers", None), body
            )
        return None

    # -- the LLM interface --------------------------------------------------------------

    async def generate(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> Completion:
        async for piece in self._call(messages, schema, stream=False):
            if isinstance(piece, Completion):
                return piece
        raise LLMError(f"{self.name}: the reply ended without a completion")

    async def stream(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> AsyncIterator[str | Completion]:
        async for piece in self._call(messages, schema, stream=True):
            yield piece

    # -- retries --------------------------------------------------------------------------

    async def _call(
        self, messages: list[Message], schema: dict[str, Any] | None, *, stream: bool
    ) -> AsyncIterator[str | Completion]:
        loop = asyncio.get_running_loop()
        end = loop.time() + self.total_timeout
        attempt = 0
        while True:
            sent_schema = schema if self.structured else None
            deadline = min(loop.time() + self.timeout, end)
            started = False
            pieces = self._attempt(messages, sent_schema, stream).__aiter__()
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            piece = await anext(pieces)
                    except StopAsyncIteration:
                        return
                    started = started or isinstance(piece, str)
                    yield piece
            except LLMError as exc:
                exc.retried = True
                raise
            except Exception as exc:  # mapped below; anything unknown propagates as is
                cause = exc
                failure = self._timeout_failure() if isinstance(exc, TimeoutError) else None
                failure = failure or self._failure(exc)
                if failure is None:
                    raise
            finally:
                await _aclose(pieces)
            if failure.schema_rejected and sent_schema is not None:
                # e.g. an older model or an OpenAI-compatible server without JSON-schema mode
                log.warning("%s rejected the JSON schema; continuing without structured "
                            "output (%s)", self.name, failure.error)
                self.structured = False
                continue
            failure.error.retried = True
            if started:
                # Text already reached the user: a second attempt would show a second reply.
                failure.error.args = (f"{failure.error} (after part of the reply was shown)",)
                raise failure.error from cause
            if not failure.retryable or attempt >= self.max_retries:
                if failure.retryable and attempt:
                    failure.error.args = (f"{failure.error} (after {attempt + 1} attempts)",)
                raise failure.error from cause
            delay = self._backoff(attempt, failure.retry_after)
            if delay is None:
                failure.error.args = (
                    f"{failure.error}; the provider asks to wait {failure.retry_after:g} s, "
                    f"longer than max_retry_delay={self.max_retry_delay:g}",
                )
                raise failure.error from cause
            if loop.time() + delay >= end:
                failure.error.args = (
                    f"{failure.error} (after {attempt + 1} attempts; no time left within "
                    f"total_timeout={self.total_timeout:g} s)",
                )
                raise failure.error from cause
            log.info("%s: %s; retrying in %.2f s", self.name, failure.error, delay)
            report_retry(attempt + 1, delay, str(failure.error))
            await asyncio.sleep(delay)
            attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None) -> float | None:
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_delay else None
        delay = min(self.max_retry_delay, self.retry_delay * 2**attempt)
        return delay * random.uniform(0.5, 1.0)

    def _timeout_failure(self) -> Failure:
        return Failure(
            LLMTimeoutError(
                f"{self.name}: no complete reply within {self.timeout:g} s "
                f"(timeout=; all attempts together within total_timeout="
                f"{self.total_timeout:g} s); pass larger values or check the server"
            ),
            retryable=True,
        )

    # -- mapping HTTP statuses, shared by the adapters -------------------------------------

    def _status_failure(
        self, status: int | None, message: str, headers: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> Failure:
        """The failure an HTTP status means (same meaning at every provider)."""
        detail = f"{self.name}: {message}" if message else self.name
        if status in (400, 413, 422) and _CONTEXT_FULL.search(message):
            error = ContextLengthError(
                f"{detail} (HTTP {status}): the prompt is longer than the model's context "
                "window; pass a smaller context_window= or shorten the input"
            )
            error.window = _window_of(message, body)
            return Failure(error)
        if status == 404 or (status in (400, 422) and _NO_MODEL.search(message)):
            # LiteLLM answers 400 "Invalid model name"; others word it their own way
            return Failure(ModelNotFoundError(
                f"{detail} (HTTP {status}): no model {self.model!r} at this provider; "
                "check the model name"
            ))
        if status in (401, 403):
            return Failure(AuthenticationError(
                f"{detail} (HTTP {status}): the provider rejected the credentials; "
                f"{self.key_hint or 'check the API key'}"
            ))
        if status == 429:
            return Failure(
                RateLimitError(f"{detail} (HTTP 429): rate limited; wait or lower the rate"),
                retryable=True,
                retry_after=retry_after(headers),
            )
        if status == 408:
            return Failure(LLMTimeoutError(f"{detail} (HTTP 408)"), retryable=True)
        if status is not None and status >= 500:
            return Failure(
                LLMError(f"{detail} (HTTP {status}): the provider failed"),
                retryable=True,
                retry_after=retry_after(headers),
            )
        if status in (400, 422):
            return Failure(
                LLMError(f"{detail} (HTTP {status}): the provider rejected the request"),
                schema_rejected=_mentions_schema(message),
            )
        if status is None:  # no HTTP answer at all: connection refused, reset, DNS…
            return Failure(LLMError(f"{detail}: cannot reach the provider"), retryable=True)
        return Failure(LLMError(f"{detail} (HTTP {status})"))


def sdk_message(exc: Any) -> str:
    """The provider's own error message from an SDK exception's body, else its text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(exc, "message", "") or exc)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


_CONTEXT_FULL = re.compile(
    r"context (length|size|window)|maximum context|prompt is too long|too many tokens"
    r"|exceed_context|context_length_exceeded", re.I)
_NO_MODEL = re.compile(
    r"invalid model|unknown model|no such model|model\b.{0,80}\b(does not exist|not found"
    r"|is not supported|not available)", re.I)


def _window_of(message: str, body: Any) -> int | None:
    """The context window an error states: llama.cpp's ``n_ctx``, else the message's number."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("n_ctx"), int):
        return int(error["n_ctx"])
    found = re.search(r"maximum context length is (\d+)|> (\d+) maximum|context "
                      r"(?:size|window|length) (?:is |of )?(\d+)", message)
    if found:
        return int(next(group for group in found.groups() if group))
    return None


_ERROR_TYPES = {
    "overloaded": 529, "api_error": 500, "server_error": 500, "internal": 500,
    "rate_limit": 429, "timeout": 504, "authentication": 401, "permission": 403,
    "not_found": 404, "invalid_request": 400, "request_too_large": 413,
}


def _status_of_error_body(body: Any) -> int | None:
    """The HTTP status an error object from inside a stream stands for (by its ``type``)."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return 500
    if isinstance(error.get("code"), int):
        return int(error["code"])
    kind = f"{error.get('type', '')} {error.get('code', '')}".lower()
    for word, status in _ERROR_TYPES.items():
        if word in kind:
            return status
    return 500  # an unknown failure reported mid-reply: the provider failed


def _mentions_schema(message: str) -> bool:
    text = message.lower()
    return any(word in text for word in ("schema", "response_format", "output_config",
                                         "output_format", "structured", "json mode",
                                         "tool_choice", "tool use", "tools are not"))


async def _aclose(iterator: Any) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()
