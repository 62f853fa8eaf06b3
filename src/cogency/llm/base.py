"""The one interface every model implements: complete a list of chat messages."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .. import _telemetry

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

    def with_output_limit(self, max_tokens: int) -> LLM | None:
        """This model with a reply cap of ``max_tokens``, or ``None`` if it has no cap to raise.

        The agent asks for it when a reply was cut off at the limit; ``self`` is unchanged.
        """
        return None

    async def close(self) -> None:
        """Release connections (no-op unless the adapter holds some)."""


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
