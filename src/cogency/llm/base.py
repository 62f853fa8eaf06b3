"""The one interface every model implements: complete a list of chat messages."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .. import _telemetry
from ..errors import UsageError

Message = dict[str, Any]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""


@dataclass
class Usage:
    """Tokens spent; summed over every call of a run into ``AgentResult.usage``."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.calls + other.calls,
        )


@dataclass
class Completion:
    """A model's whole reply and what it cost."""

    text: str
    usage: Usage
    truncated: bool = False
    """The reply stopped at the output token limit (``finish_reason: length``,
    ``stop_reason: max_tokens``, ``MAX_TOKENS``): it is probably cut off mid-JSON."""
    model: str | None = None
    """The model that answered, as the provider names it (``gpt-4o-mini-2024-07-18``), where
    it says (traces record it as ``gen_ai.response.model``)."""


class AnswerText(str):
    """A streamed piece that is the answer's own text, not part of a JSON step.

    An adapter that has the model write a step's answer as plain text (the local model, for
    a step that can only answer) yields its pieces as ``AnswerText``, so the agent can stream
    them as the answer; its :class:`Completion` is still the whole step as JSON.
    """


class LLM(ABC):
    """A chat model. Implement :meth:`generate`; override :meth:`stream` if the model streams.

    ``schema`` is the JSON schema the reply must match; adapters whose provider supports
    structured output pass it on, others may ignore it (the agent validates every reply).
    The message dicts are the agent's, reused by its later calls: read them, never change
    them (build your own to send).
    """

    name: str = "llm"
    context_window: int = 128_000
    """Tokens the model accepts; the agent keeps every prompt within it."""

    @abstractmethod
    async def generate(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> Completion: ...

    async def stream(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> AsyncIterator[str | Completion]:
        """Yield text pieces as they arrive, then the whole :class:`Completion` last."""
        completion = await self.generate(messages, schema=schema)
        yield completion

    async def start(self) -> None:
        """Get ready before the first call (the agent awaits it once per run).

        Adapters that learn their :attr:`context_window` from the server, or start one,
        do it here; the default does nothing.
        """

    def with_options(self, **options: Any) -> LLM:
        """This model with sampling options for each call it makes (see :data:`OPTIONS`):
        a copy sharing its connections; ``self`` is unchanged. An option left ``None`` is
        not set. Raises :class:`~cogency.errors.UsageError` for an option it cannot honour
        (this default honours none, so any option set is refused).
        """
        checked = check_options(options)
        if checked:
            raise UsageError(f"{self.name} cannot honour {', '.join(checked)}: this model "
                             "takes no sampling options")
        return self

    def with_output_limit(self, max_tokens: int) -> LLM | None:
        """This model with a reply cap of ``max_tokens``, or ``None`` if it has no cap to raise.

        The agent asks for it when a reply was cut off at the limit; ``self`` is unchanged.
        """
        return None

    async def close(self) -> None:
        """Release connections (no-op unless the adapter holds some)."""


OPTIONS = ("temperature", "top_p", "seed", "reasoning_effort")
"""What :meth:`LLM.with_options` may set: ``temperature`` (0 to 2), ``top_p`` (0 to 1),
``seed`` (an integer: repeatable sampling where the provider offers it) and
``reasoning_effort`` (one of :data:`REASONING_EFFORTS`, for models that reason)."""
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without the ``None`` ones, or a :class:`UsageError` naming one that is
    unknown or out of range."""
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name not in OPTIONS:
            raise UsageError(f"unknown model option {name!r}: the options are "
                             f"{', '.join(OPTIONS)}")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in ("temperature", "top_p"):
            top = 2 if name == "temperature" else 1
            if not number or not 0 <= value <= top:
                raise UsageError(f"{name} must be a number from 0 to {top}, not {value!r}")
            value = float(value)
        elif name == "seed" and (not isinstance(value, int) or isinstance(value, bool)
                                 or not -2**63 <= value < 2**63):
            raise UsageError(f"seed must be a 64-bit integer, not {value!r}")
        elif name == "reasoning_effort" and value not in REASONING_EFFORTS:
            raise UsageError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                             f"not {value!r}")
        checked[name] = value
    return checked


RetryListener = Callable[[int, float, str], None]
"""Called before each retry with the attempt number (1 for the first retry), the seconds it
will wait, and why."""

_retry_listener: ContextVar[RetryListener | None] = ContextVar("cogency_retry", default=None)


@contextmanager
def retries_reported_to(listener: RetryListener) -> Iterator[None]:
    """Within this block, every retry of a model call (in this task) is reported to ``listener``.

    A context variable, not an argument: the :class:`LLM` interface stays two methods, and
    concurrent runs sharing one model each hear only their own retries.
    """
    token = _retry_listener.set(listener)
    try:
        yield
    finally:
        _retry_listener.reset(token)


def report_retry(attempt: int, delay: float, reason: str) -> None:
    """Tell the current listener (if any) that a call is about to be retried."""
    _telemetry.retry(attempt, delay, reason)
    listener = _retry_listener.get()
    if listener is not None:
        listener(attempt, delay, reason)
