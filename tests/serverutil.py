"""Service test support: real `cogency serve` processes, API keys, and an SSE reader."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

TESTS = Path(__file__).parent
LLM = "server_models:agent"


def env(**extra: str) -> dict[str, str]:
    """The environment of a server process: tests/ on the path (for ``server_models``)."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", **extra}


class Server:
    """One ``cogency serve`` process on a free loopback port; its log goes to ``log_path``."""

    def __init__(self, db: str, tmp: Path, *args: str, name: str = "server",
                 extra_env: dict[str, str] | None = None) -> None:
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "w")
        command = [sys.executable, "-m", "cogency.cli", "serve", "--db", db, "--llm", LLM,
                   "--port", "0", "--root", str(tmp), *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env(**(extra_env or {})), cwd=tmp)
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The server's base URL, once it listens (servers started together start in parallel)."""
        if self._url is None:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            found = re.search(r"listening on (http://\S+)", line)
            if not found:
                self.proc.kill()
                raise AssertionError(f"the server did not start: {line!r}\n{self.log()}")
            self._url = found.group(1)
        return self._url

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def client(self, key: str | None = None, **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **options)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        return code


def create_key(db: str, user: str) -> str:
    """A key for ``user`` made in this process (the CLI path has its own tests)."""
    from cogency.server.keys import create_key as make
    from cogency.storage import open_store

    async def work() -> str:
        store = open_store(db)
        try:
            return (await make(store, user))[1]
        finally:
            await store.close()

    return asyncio.run(work())


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of an SSE response, checking each record's ``event:`` names its type."""
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            assert event["type"] == name
            yield event


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for a condition")
        time.sleep(0.02)


def rows(db: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows straight from a SQLite database file, outside the server."""
    connection = sqlite3.connect(db)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()
