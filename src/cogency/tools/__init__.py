"""Tools the model can call: ``Tool``, the ``@tool`` decorator, and opt-in built-ins."""

from typing import TYPE_CHECKING, Any

from .base import DEFAULT_TIMEOUT, Tool, Toolset, run_tools, tool

if TYPE_CHECKING:  # what __getattr__ imports on use, as type checkers should see it
    from .files import files_tools
    from .http import http_tool
    from .mcp import MCPServer
    from .shell import sandbox_available, shell_tool

_BUILTINS = {
    "MCPServer": "mcp",
    "files_tools": "files",
    "http_tool": "http",
    "sandbox_available": "shell",
    "shell_tool": "shell",
}


def __getattr__(name: str) -> Any:
    # The built-ins are imported on use: http.client, ssl, subprocess and the MCP SDK are
    # not cheap.
    if name in _BUILTINS:
        from importlib import import_module

        return getattr(import_module(f".{_BUILTINS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_TIMEOUT",
    "MCPServer",
    "Tool",
    "Toolset",
    "files_tools",
    "http_tool",
    "run_tools",
    "sandbox_available",
    "shell_tool",
    "tool",
]
