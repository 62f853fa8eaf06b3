"""Turn what the user passed as ``llm=`` into a model."""

from __future__ import annotations

from ..errors import ConfigurationError, UsageError
from .base import LLM


def resolve_llm(spec: LLM | str | None) -> tuple[LLM, bool]:
    """The model for ``spec`` and whether the caller owns it (and must close it)."""
    if isinstance(spec, LLM):
        return spec, False
    if spec is None:
        raise ConfigurationError(
            "no model configured: pass llm=… (an LLM instance or a string such as "
            "'openai:gpt-4o-mini')"
        )
    if not isinstance(spec, str):
        raise UsageError(f"llm must be an LLM instance or a string, not {type(spec).__name__}")
    raise ConfigurationError(f"unknown model {spec!r}")
