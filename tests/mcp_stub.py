"""An MCP server that misbehaves on request, for the failure tests (built on the SDK).

``die`` exits mid-call, ``hang`` never answers, ``flood`` sends one message bigger than a
client should hold; ``echo`` works (to show the server is started again after ``die``).
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer(name="stub")
PROTOCOL_OUT = os.dup(1)  # the SDK moves fd 1 away while it serves; this stays the pipe


@server.tool()
async def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text} (pid {os.getpid()})"


@server.tool()
async def die() -> str:
    """Exit in the middle of the call."""
    sys.stderr.write("stub: dying on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.sleep(3600)
    return "never"


@server.tool()
async def flood() -> str:
    """Write a 6 MB line to stdout (no newline), then wait."""
    os.write(PROTOCOL_OUT, b"x" * 6_000_000)
    await asyncio.sleep(3600)
    return "never"


if __name__ == "__main__":
    server.run()
