"""Tools named on a command line: the built-in sets of ``--tools`` and the servers of
``--mcp``, as ``cogency run``, ``mcp`` and ``serve`` take them (one place for all three)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, UsageError
from .base import Tool

TOOL_SETS = ("files", "shell", "http")


def builtin_tools(spec: str | None, root: Path, *, read_only: bool = False,
                  many_users: bool = False) -> list[Tool]:
    """The built-in tool sets named in ``spec`` ("files,shell,http"), confined to ``root``.

    ``read_only`` keeps only tools that change nothing (no file writes; the shell is refused).
    ``many_users`` (a server of many users) requires the shell's sandbox: without it a command
    could read and change every user's directory.
    """
    tools: list[Tool] = []
    for name in [part.strip() for part in (spec or "").split(",") if part.strip()]:
        if name not in TOOL_SETS:
            raise UsageError(f"unknown tool set {name!r}: choose from {', '.join(TOOL_SETS)}")
        if name == "shell" and read_only:
            raise UsageError("--read-only cannot include the shell tool (a command can change "
                             "anything); leave shell out of --tools")
        if name == "files":
            from .files import files_tools

            tools.extend(files_tools(root, read_only=read_only))
        elif name == "shell":
            tools.append(_shell(root, many_users))
        else:
            from .http import http_tool

            tools.append(http_tool())
    return tools


def _shell(root: Path, many_users: bool) -> Tool:
    from .shell import shell_tool

    if not many_users:
        return shell_tool(root)
    try:
        return shell_tool(root, sandbox=True)
    except ConfigurationError as exc:
        raise ConfigurationError(
            "serving the shell tool to many users needs its bubblewrap sandbox, which does "
            "not work here (without it a command could read and change every user's files): "
            "install bubblewrap and allow user namespaces, or leave shell out of --tools"
        ) from exc


def mcp_servers(specs: Sequence[str] | None, *, read_only: bool = False) -> list[Any]:
    """An ``MCPServer`` for each ``--mcp``: a command line (stdio) or an http(s) URL."""
    if not specs:
        return []
    if read_only:
        raise UsageError("--read-only cannot include --mcp servers (their tools may change "
                         "anything); leave --mcp out")
    from .mcp import MCPServer

    return [
        MCPServer(url=spec.strip()) if spec.strip().startswith(("http://", "https://"))
        else MCPServer(spec)
        for spec in specs
    ]
