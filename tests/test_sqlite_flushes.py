"""Disk flushes per turn at ``synchronous="full"``, counted for real (strace): a one-step turn
is one flush, its completion; what only prepares it (beginning the task, holding the
conversation, claiming an idempotency key) is made durable by that flush, as the log is
appended in order (SQLiteStore's docstring). Each flush is of the write-ahead log, after the
turn's last write to it; concurrent runs' flushes are never the event loop's (where a lone
run's flush runs, by the disk's speed: test_sqlite_group_commit.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is not installed (apt-get install strace)")


def flushes_per_turn(tmp_path: Path, mode: str, turns: int = 4, *,
                     released: bool = False) -> list[int]:
    """fsync and fdatasync calls of every thread between each turn's two markers; checks
    that each turn's flushes are of the log, each after a write to it that the one before
    did not cover, in ``concurrent`` mode none on the event loop's thread (the process's
    first), and the last after
    the turn's last write to the log (``released``: but the conversation's release, written
    after the outcome's flush without one of its own)."""
    trace = tmp_path / f"{mode}.strace"
    log = str(tmp_path / "t.db-wal")
    done = subprocess.run(
        ["strace", "-f", "-y", "-o", str(trace), "-e", "trace=fsync,fdatasync,pwrite64,access,"
         "faccessat,faccessat2", sys.executable, str(TESTS / "fsync_worker.py"),
         str(tmp_path / "t.db"), mode, str(turns)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts: list[int] = []
    inside, loop_thread = False, None
    for line in trace.read_text().splitlines():
        thread = line.split(None, 1)[0]
        loop_thread = loop_thread or thread
        marker = re.search(r"/cogency-turn-(\d+)-(start|end)", line)
        if marker:
            inside = marker.group(2) == "start"
            if inside:
                counts.append(0)
                unflushed = False
            elif not released:
                assert not unflushed, f"turn {len(counts)}: the log was written after its flush"
        elif inside and re.search(r"\b(fsync|fdatasync)\(", line):
            counts[-1] += 1
            assert f"<{log}>" in line, line  # the log, not another file
            assert mode != "concurrent" or thread != loop_thread, line
            assert unflushed, f"turn {len(counts)}: a flush with nothing written before it"
            unflushed = False
        elif inside and re.search(r"\bpwrite64\(\d+<" + re.escape(log) + ">", line):
            unflushed = True
    assert len(counts) == turns
    return counts


def test_a_one_step_turn_is_one_flush(tmp_path):
    assert flushes_per_turn(tmp_path, "run") == [1, 1, 1, 1]


def test_each_step_of_a_turn_flushes_its_save(tmp_path):
    # The tool's result is stored before the model is asked again: resume never runs it twice.
    assert flushes_per_turn(tmp_path, "tool") == [2, 2, 2, 2]


def test_concurrent_completions_share_one_flush(tmp_path):
    # Five runs answered at once: their completions wait for the worker together, each is
    # committed, and one flush makes them all durable.
    assert flushes_per_turn(tmp_path, "concurrent", turns=3) == [1, 1, 1]


def test_a_served_request_is_one_flush(tmp_path):
    # Hold the conversation, begin, complete (the flush), let the conversation go.
    assert flushes_per_turn(tmp_path, "served", released=True) == [1, 1, 1, 1]


def test_a_served_request_with_an_idempotency_key_flushes_its_outcome_too(tmp_path):
    # A retry is answered from the stored outcome: it flushes as the completion does.
    assert flushes_per_turn(tmp_path, "served-key", released=True) == [2, 2, 2, 2]
