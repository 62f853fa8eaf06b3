"""The issue-12 scenario with the real offline model: reading notes.txt never changes it unasked.

    python scripts/offline_approval.py [--runs 3]

Each run makes a fresh directory holding notes.txt and runs, with no terminal on stdin,
``cogency run "Use the read_file tool to read notes.txt" --tools files --llm local``. The small
model often calls file_write; the task must then pause (exit 3, a pending call in the
database) and notes.txt must be byte-for-byte unchanged. Too slow for the test suite (about
40 s a run on a busy machine); the deterministic version is in tests/test_approvals_cli.py.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTES = "the secret number is 42\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    failures = 0
    for run in range(1, options.runs + 1):
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            (root / "notes.txt").write_text(NOTES)
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "cogency.cli", "run",
                 "Use the read_file tool to read notes.txt", "--tools", "files", "--llm",
                 "local", "--max-iterations", "4", "--db", str(root / "c.db")],
                cwd=root, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                env={**os.environ, "NO_COLOR": "1"}, timeout=600,
            )
            seconds = time.monotonic() - started
            connection = sqlite3.connect(root / "c.db")
            waiting = connection.execute(
                "SELECT call_data FROM task_approvals WHERE status = 'pending'"
            ).fetchall()
            connection.close()
            untouched = (root / "notes.txt").read_text() == NOTES
            paused_right = (done.returncode == 3) == bool(waiting)
            ok = untouched and paused_right and done.returncode in (0, 1, 3)
            failures += not ok
            print(f"run {run}: exit {done.returncode}, {len(waiting)} call(s) waiting, "
                  f"notes.txt {'unchanged' if untouched else 'CHANGED'}, {seconds:.0f}s"
                  f"{'' if ok else '  FAIL'}")
            if not ok:
                print(done.stdout, done.stderr, sep="\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
