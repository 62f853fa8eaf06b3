"""Models: the ``LLM`` interface and the adapters for providers.

The adapters import their SDK (an optional extra) only when one is created:
``OpenAILLM`` (``cogency[openai]``; also any OpenAI-compatible server by ``base_url``),
``AnthropicLLM`` (``cogency[anthropic]``), ``GeminiLLM`` (``cogency[gemini]``) and
``LocalLLM``, the offline model (``cogency[local]``).
"""

from typing import Any

from .base import LLM, Completion, Message, Usage
from .resolve import resolve_llm

_ADAPTERS = {
    "OpenAILLM": "._openai",
    "AnthropicLLM": "._anthropic",
    "GeminiLLM": "._gemini",
    "LocalLLM": "._local",
}


def __getattr__(name: str) -> Any:
    if name in _ADAPTERS:
        from importlib import import_module

        return getattr(import_module(_ADAPTERS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LLM",
    "AnthropicLLM",
    "Completion",
    "GeminiLLM",
    "LocalLLM",
    "Message",
    "OpenAILLM",
    "Usage",
    "resolve_llm",
]
