"""The one interface every model implements: complete a list of chat messages."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

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


class LLM(ABC):
    """A chat model. Implement :meth:`generate`; override :meth:`stream` if the model streams.

    ``schema`` is the JSON schema the reply must match; adapters whose provider supports
    structured output pass it on, others may ignore it (the agent validates every reply).
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

    async def close(self) -> None:
        """Release connections (no-op unless the adapter holds some)."""
