"""The benchmark harness itself: `python -m bench --quick` on Cogency's own cases (the peers
are not installed in CI), and the per-iteration assertions that keep every figure honest."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import __main__ as runner  # noqa: E402
from bench.peers import _harness  # noqa: E402
from bench.peers import cogency as cogency_adapter  # noqa: E402


def test_quick_run_of_cogency_writes_table_and_raw_results(tmp_path: Path) -> None:
    doc, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--frameworks", "cogency", "--long-turns", "40",
         "--output", str(doc), "--plot", str(tmp_path / "plot.png"), "--json", str(raw)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(raw.read_text())
    results = data["results"]["cogency"]
    expected = {"import", "construct", "construct_mem", "one_step", "tool_call", "long",
                "durable@full", "durable@normal", "first@full", "first@normal",
                "replay@full", "replay@normal", "service@full", "service@normal", "flush"}
    if shutil.which("strace"):
        expected |= {"fsync@full", "fsync@normal"}
    assert set(results) == expected
    assert len(results["one_step"]["samples"]) == 20
    assert len(results["tool_call"]["samples"]) == 20
    assert all(s > 0 for s in results["tool_call"]["samples"])
    for setting in ("full", "normal"):
        durable = results[f"durable@{setting}"]
        assert durable["turns"] == 25 and len(durable["samples"]) == 3
        assert durable["synchronous"] == setting  # read back from the store's connection
        first = results[f"first@{setting}"]
        assert first["median"] > 0 and first["rss_kib"] > 0
        replay = results[f"replay@{setting}"]
        # The replay is checked against the trace; a one-step turn sends the store statements.
        assert replay["statements_per_turn"] > 0 and replay["cpu_ratio_literal"] > 0
        for clients in ("1", "10"):
            service = results[f"service@{setting}"]["clients"][clients]
            # Each client against the bare server, as many times as against the service
            # (the lean client, then httpx), and as many times as Agent.run
            counts = {way: service[way]["n"] for way in ("direct", "http", "bare", "httpx",
                                                         "httpx_bare")}
            assert counts["http"] > 0 and len(set(counts.values())) == 1, counts
            for prefix, http in (("", "http"), ("httpx_", "httpx")):
                assert service[f"{prefix}overhead"]["p50"] == pytest.approx(
                    service[http]["p50"] - service["direct"]["p50"])
                assert service[f"{prefix}own"]["p50"] == pytest.approx(
                    service[f"{prefix}overhead"]["p50"] - service[f"{prefix}bare"]["p50"])
    if shutil.which("strace"):
        # FULL flushes at every commit; NORMAL (WAL) only at checkpoints.
        # (Counted on the long conversation alone: the fresh conversations the flatness goal
        # alternates with, as many as the turns up to 10, would not cancel out.)
        assert 1 <= results["fsync@full"]["per_turn"] <= 1.25
        assert results["fsync@normal"]["per_turn"] < results["fsync@full"]["per_turn"]
    long = results["long"]
    assert long["turns"] == 40 and len(long["per_turn"]) == 40
    # Every turn stored the user message and the answer as rows, and nothing else.
    assert long["rows"] == 80
    assert long["raw_bytes"] == _harness.raw_text_bytes(40)
    assert long["db_bytes"] > long["raw_bytes"]  # the text really is in the file
    # The last 10 turns, each against turn 10 of a fresh conversation, alternated.
    assert long["late"] == long["per_turn"][-10:]
    assert len(long["turn10"]) == 10 and all(t > 0 for t in long["turn10"])
    assert results["construct_mem"]["median"] > 0
    assert data["info"]["versions"]["cogency"]["cogency"]

    text = doc.read_text()
    assert "| Construct an agent with one tool (µs) |" in text
    assert "| NORMAL: per-turn time at turn 10 (ms) |" in text
    assert "| NORMAL: per-turn growth, the last 10 turns ÷ turn 10 (alternated) (×) |" in text
    assert "| **FULL**: durable 25-turn conversation, per turn (ms) |" in text
    assert "### Cogency ÷ its own SQL" in text and "### `cogency serve` over HTTP" in text
    assert "### What a FULL turn's flush costs here" in text and "| on the worker |" in text
    assert "bare HTTP p50" in text and "a lean client's round trip to a bare HTTP server" in text
    assert "httpx: added p50" in text and "with httpx as the client: +" in text
    assert "## Goals" in text and "Cold import faster than every peer" not in text  # no peers
    assert "Database size ≤ 2 × the raw text" in text
    median_ms = f"{results['one_step']['median'] * 1e3:.2f}"
    assert median_ms in text or f"{results['one_step']['median'] * 1e3:.1f}" in text


def test_runner_names_missing_peers_and_how_to_install_them() -> None:
    for name in ("langgraph", "agno", "openai_agents"):
        adapter = runner._adapter(name)
        expected = []
        for dist in adapter.DISTRIBUTIONS:
            try:
                importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                expected.append(dist)
        assert runner.missing(name) == expected
    assert "pip install -r bench/requirements-peers.txt" in runner.INSTALL
    pins = (ROOT / "bench" / "requirements-peers.txt").read_text().split()
    for dist in ("langgraph", "langgraph-checkpoint-sqlite", "agno", "sqlalchemy", "greenlet",
                 "openai-agents", "matplotlib"):
        assert any(p.startswith(f"{dist}==") for p in pins), dist


class _Liar:
    """A Cogency session that answers without running its tool or keeping the conversation."""

    def __init__(self, script: _harness.Script) -> None:
        self.script = script

    async def turn(self, text: str) -> str:
        item = self.script.plan[-1]
        self.script.next(1)
        return item[1]

    async def close(self) -> None:
        pass

    def stored(self, db: sqlite3.Connection) -> int:
        return 0


class _LiarAdapter:
    NAME = "liar"

    @staticmethod
    async def open_session(script: _harness.Script, db_path: str | None,
                           synchronous: str = "normal") -> Any:
        return _Liar(script)


def test_a_tool_call_run_that_skips_the_tool_fails() -> None:
    with pytest.raises(AssertionError, match="the tool did not run"):
        _harness.run_case(_LiarAdapter, "tool_call", 2, 0, 0)  # type: ignore[arg-type]


def test_a_durable_conversation_that_stores_nothing_fails() -> None:
    with pytest.raises(AssertionError, match="turn 1: no new row"):
        _harness.run_case(_LiarAdapter, "durable", 1, 0, 3)  # type: ignore[arg-type]


def test_cogency_durable_turns_grow_history_and_rows() -> None:
    result = _harness.run_case(cogency_adapter, "long", 0, 0, 12)  # type: ignore[arg-type]
    assert result["rows"] == 24 and len(result["per_turn"]) == 12


async def test_quick_postgres_benchmark_runs_both_stores_and_counts_two_round_trips():
    import pgutil

    await (await pgutil.admin_connect()).close()  # PostgreSQL is up (or a skip outside CI)
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_postgres", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for workers in (1, 2, 4):
        assert f"{workers} worker(s):" in out
    for store in ("postgres ", "postgres-async-commit", "sqlite "):
        assert f"   {store}" in out
    assert "late/early on postgres: x" in out and "postgres/sqlite: x" in out
    assert "memory off: 2 in all; by store call: begin_task 1, save 1" in out
    # With memory on the turn reads the profile, and its completion queues its learning in
    # the same statement: still one round trip.
    assert "memory on: 3 in all; by store call: begin_task 1, load_profile 1, save 1" in out


async def test_quick_pgbouncer_benchmark_compares_routes_and_counts_server_connections():
    import pgutil

    await (await pgutil.admin_connect()).close()  # PostgreSQL is up (or a skip outside CI)
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_pgbouncer", "--quick", "--workers", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "through PgBouncer / direct: x" in out
    assert "round trips of a one-step turn: 2 direct, 2 through PgBouncer" in out
    for workers in (1, 4):
        line = next(x for x in out.splitlines() if f" {workers} worker(s):" in x)
        seen = int(line.split("at most ")[1].split()[0])
        assert 1 <= seen <= 10, line  # never more server connections than PgBouncer's pool


def _valgrind() -> None:
    import os

    if shutil.which("valgrind") is None:
        if os.environ.get("CI"):
            pytest.fail("valgrind is not installed (.ci/run installs it)")
        pytest.skip("valgrind is not installed (apt-get install valgrind)")


def test_instructions_per_turn_repeat_so_an_a_b_measures_the_change() -> None:
    """`python -m bench.instructions` counts a durable turn's instructions under valgrind: the
    same checkout measured against itself comes out the same, to well within a change worth
    measuring (the drift that times show between runs is not there)."""
    _valgrind()
    done = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--warmup", "1", "--conversations", "1",
         "--turns", "4", "--against", str(ROOT / "src")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    figures = [float(line.split()[0]) for line in done.stdout.splitlines()
               if line.split()[1:2] == ["M"]]
    assert len(figures) == 2 and figures[0] > 0.5, done.stdout  # millions per turn
    ratio = float(done.stdout.split("that one: ")[1].split()[0])
    assert abs(ratio - 1) < 0.01, done.stdout  # timed runs drift by up to 25%


@pytest.mark.parametrize("case, said", [("served", "per served POST /api/runs"),
                                        ("http", "per POST /api/runs over HTTP")],
                         ids=["served", "http"])
def test_instructions_per_served_request(case: str, said: str) -> None:
    """`python -m bench.instructions --case served` counts a `POST /api/runs` answered by
    `cogency serve`'s app in process, `--case http` one answered by a `cogency serve` process
    over loopback HTTP (each answered 200, or the run fails): more than a turn of the agent
    alone."""
    _valgrind()
    done = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--case", case, "--warmup", "1",
         "--conversations", "1", "--turns", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert said in done.stdout, done.stdout
    [figure] = [float(line.split()[0]) for line in done.stdout.splitlines()
                if line.split()[1:2] == ["M"]]
    assert 1 < figure < 50, done.stdout  # millions per request


def test_flush_benchmark_times_each_way_and_flushes_where_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m bench.bench_flush`: every way of flushing and of handing the flush off is
    measured, each flush really made (on the worker thread where it says so, none in the
    worker's bare round trip), a lone run's flushes are each counted where they ran, and
    nothing is left in the directory measured."""
    from bench import bench_flush

    real, flushed = os.fdatasync, []

    def counted(fd: int) -> None:
        flushed.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    ops = 7
    for way in bench_flush.HAND_OFFS:
        flushed.clear()
        figures = asyncio.run(bench_flush.hand_offs(tmp_path / "log", way, ops, 1024))
        assert figures["wall"] > 0 and set(figures) == {"wall", "user", "system", "switches"}
        expected = {"inline": [threading.current_thread().name] * ops,
                    "on the worker": ["bench-flush"] * ops}.get(way, [])
        assert flushed == expected, way
    monkeypatch.setattr(os, "fdatasync", real)

    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_flush", "--rounds", "1", "--ops", "5",
         "--turns", "30", "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert list(result["flush"]) == list(bench_flush.FLUSHES)
    assert list(result["hand_off"]) == list(bench_flush.HAND_OFFS)
    assert all(f["wall"] > 0 for f in [*result["flush"].values(), *result["hand_off"].values()])
    assert "| over written blocks |" in done.stdout and "| on the worker |" in done.stdout
    where = result["where"]  # one flush per turn (and one as the store closes, if any)
    assert where["turns"] == 30 and 30 <= where["flushes"] <= 31
    assert where["on_the_loop"] + where["on_the_worker"] == where["flushes"]
    assert where["on_the_worker"] >= 1  # a new store's first flush is the worker's
    assert 0 <= where["slow"] <= where["flushes"] and set(where["percentiles"]) == {
        "50", "90", "99", "100"}
    assert f"{where['on_the_loop']} of {where['flushes']} on the event loop" in done.stdout
    assert list(tmp_path.iterdir()) == []  # its files and its temporary directory are gone

    wrong = subprocess.run([sys.executable, "-m", "bench.bench_flush", "--dir",
                            str(tmp_path / "missing")],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "is not a directory" in wrong.stderr
    assert "Traceback" not in wrong.stderr


async def test_the_literal_replay_runs_each_statement_of_a_turn_once(tmp_path: Path) -> None:
    # SQLite's trace fires again for a statement's subprograms (the completion's DELETE
    # cascades to task_approvals): the literal replay must not run that statement twice.
    from bench import replay

    setup, per_turn, traces, traced = await replay.capture(tmp_path / "c.db", 4, "full")
    for statements, texts in zip(per_turn, traced):
        sent = sum(len(parameters) if kind == "many" else 1
                   for kind, _, parameters, _ in statements)
        assert len(texts) == sent
        deletes = [sql for _, sql in texts if sql.startswith("DELETE FROM task_workspaces")]
        assert len(deletes) == 1
    # The whole trace keeps what the statements' subprograms fired (the replay's check).
    assert sum(sql.startswith("DELETE FROM task_workspaces") for _, sql in traces) == 2 * 4
