"""Tools the model can call: ``Tool``, the ``@tool`` decorator, and opt-in built-ins."""

from .base import DEFAULT_TIMEOUT, Tool, run_tools, tool

__all__ = ["DEFAULT_TIMEOUT", "Tool", "run_tools", "tool"]
