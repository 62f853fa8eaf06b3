"""Running the real ``cogency`` command in tests: a subprocess, a fresh database, a script.

``Cli(tmp_path, db_path)("run", "hi", script=[...])`` runs the installed console script (or
``python -m cogency.cli`` where it is not installed) with ``tests/`` on the path, so
``--llm cli_models:scripted`` replays ``script``. Output is decoded as strict UTF-8: a test
fails if the command ever prints bytes that are not valid UTF-8.
"""

from __future__ import annotations

import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
_SCRIPT = Path(sys.executable).with_name("cogency")
COMMAND = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "cogency.cli"]


def step(response=None, actions=(), objective="the goal", **fields):
    """One model reply of the JSON contract."""
    return {"secure": True, "objective": objective, "understanding": fields.get("u", ""),
            "approach": fields.get("a", ""), "discoveries": fields.get("d", ""),
            "response": response, "actions": list(actions)}


def learned(**fields: Any) -> dict[str, Any]:
    """A memory extraction reply (what learning asks the model for)."""
    reply = {"preferences": [], "goals": [], "expertise": [], "communication_style": "",
             "project_context": [], "interests": [], "constraints": [], "success_pattern": "",
             "failure_pattern": ""}
    return {**reply, **fields}


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    raw: bytes


@dataclass
class Cli:
    tmp: Path
    db: Path

    def env(self, script: list[Any] | None = None, **extra: str) -> dict[str, str]:
        script_file = self.tmp / f"script-{time.monotonic_ns()}.json"
        script_file.write_text(json.dumps(script or []))
        path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH", "")] if p)
        return {**os.environ, "PYTHONPATH": path, "COGENCY_TEST_SCRIPT": str(script_file),
                "NO_COLOR": "1", **extra}

    def argv(self, args: tuple[str, ...], llm: str | None, memory: bool, db: bool) -> list[str]:
        command = [*COMMAND, *args]
        if db:
            command += ["--db", str(self.db)]
        if args and args[0] in ("run", "resume"):
            command += ["--llm", llm] if llm else []
            command += [] if memory else ["--no-memory"]
        return command

    def __call__(self, *args: str, script: list[Any] | None = None,
                 llm: str | None = "cli_models:scripted", memory: bool = False, db: bool = True,
                 input: bytes | None = None, cwd: Path | None = None, timeout: float = 60,
                 **env: str) -> Done:
        done = subprocess.run(
            self.argv(args, llm, memory, db), input=input if input is not None else b"",
            capture_output=True, env=self.env(script, **env), timeout=timeout,
            cwd=cwd or self.tmp,
        )
        return Done(done.returncode, done.stdout.decode(), done.stderr.decode(), done.stdout)

    def tty(self, *args: str, answer: bytes = b"", script: list[Any] | None = None,
            llm: str | None = "cli_models:scripted", timeout: float = 30) -> tuple[int, str]:
        """Run with a pseudo-terminal as stdin, stdout and stderr (colours on); type ``answer``
        once the command has printed something. Returns the exit status and all it printed."""
        parent, child = pty.openpty()
        env = self.env(script)
        env.pop("NO_COLOR")
        process = subprocess.Popen(self.argv(args, llm, False, True), stdin=child,
                                   stdout=child, stderr=child, env=env,
                                   cwd=self.tmp, close_fds=True)
        os.close(child)
        seen = b""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([parent], [], [], 0.1)
                if ready:
                    try:
                        chunk = os.read(parent, 4096)
                    except OSError:  # the command exited and closed the terminal
                        break
                    if not chunk:
                        break
                    if not seen and answer:
                        os.write(parent, answer)
                    seen += chunk
                elif process.poll() is not None:
                    break
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if process.poll() is None:
                process.kill()
            os.close(parent)
        return process.returncode, seen.decode().replace("\r\n", "\n")


def rows(db_path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(db_path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()
