"""Real MCP servers for the tests: the npm reference servers, pinned, installed into a cache
directory (``python tests/mcp_servers.py`` does it; ``.ci/run`` calls that), and PyPI's
``mcp-server-time`` (pinned in the ``test`` extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

NPM_SERVERS = {
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
}
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cogency-tests" / "npm"


def npm_bin(name: str) -> str:
    """The path of an installed npm server's command (``mcp-server-everything``…)."""
    return str(CACHE / "node_modules" / ".bin" / name)


def installed() -> bool:
    for package, version in NPM_SERVERS.items():
        manifest = CACHE / "node_modules" / package / "package.json"
        if not manifest.exists() or f'"version": "{version}"' not in manifest.read_text():
            return False
    return True


def install() -> None:
    """Install the pinned npm servers into the cache directory (quietly; once)."""
    if installed():
        return
    if shutil.which("npm") is None:
        raise RuntimeError("the MCP tests need Node.js and npm (apt-get install nodejs npm)")
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", "--silent",
         *(f"{package}@{version}" for package, version in NPM_SERVERS.items())],
        check=True, stdout=subprocess.DEVNULL, timeout=300,
    )


if __name__ == "__main__":
    install()
    sys.exit(0 if installed() else 1)
