"""Models: the ``LLM`` interface and the adapters for providers."""

from .base import LLM, Completion, Message, Usage

__all__ = ["LLM", "Completion", "Message", "Usage"]
