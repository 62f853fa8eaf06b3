"""Crashes: workers killed with SIGKILL mid-task lose nothing committed and resume to completion
without repeating a tool call whose result was stored. The full run is
``python scripts/crash_harness.py --kills 500``; CI runs ``COGENCY_CRASH_KILLS`` (default 30) on
SQLite (and a third of them with three jobs at once per worker, at ``synchronous="full"``), and
``COGENCY_CRASH_PG_KILLS`` (default 12) on PostgreSQL, directly and through PgBouncer in
transaction mode."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from cogency import Agent, tool
from cogency.errors import LLMError
from cogency.testing import ScriptedLLM

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "crash_harness.py"
_spec = importlib.util.spec_from_file_location("crash_harness", _PATH)
assert _spec and _spec.loader
harness = importlib.util.module_from_spec(_spec)
sys.modules["crash_harness"] = harness
_spec.loader.exec_module(harness)

KILLS = int(os.environ.get("COGENCY_CRASH_KILLS", "30"))
PG_KILLS = int(os.environ.get("COGENCY_CRASH_PG_KILLS", "12"))


async def test_sigkilled_workers_lose_nothing_and_resume_without_repeating_calls(tmp_path) -> None:
    figures = await harness.run_rounds(tmp_path, KILLS, seed=int(os.environ.get("COGENCY_CRASH_SEED", "7")))
    assert figures.failures == [], figures.failures[:10]
    assert figures.kills == KILLS
    # The kills really landed inside tasks, and resumes really had stored calls to skip.
    assert figures.kills_mid_task >= KILLS // 2, figures.summary()
    assert figures.tasks_resumed == figures.kills_mid_task
    assert figures.recorded_not_rerun > 0, figures.summary()
    assert figures.committed_checked > KILLS, figures.summary()


async def test_parallel_jobs_at_full_durability_lose_nothing_and_resume(tmp_path) -> None:
    # Three jobs at once per worker, at synchronous="full": their saves reach the store's
    # worker together and share transactions and flushes (each in a savepoint of its own);
    # checkpoints every 64 KiB of log, so kills land in them too (the copier's and the
    # worker's).
    kills = max(10, KILLS // 3)
    figures = await harness.run_rounds(tmp_path, kills, seed=23, parallel=3,
                                       synchronous="full", checkpoint_bytes=64 * 1024)
    assert figures.failures == [], figures.failures[:10]
    assert figures.kills == kills
    assert figures.kills_mid_task >= kills // 2, figures.summary()
    assert figures.tasks_resumed >= figures.kills_mid_task, figures.summary()
    assert figures.committed_checked > kills, figures.summary()


@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
async def test_sigkilled_workers_on_postgres_lose_nothing_and_resume(tmp_path, route) -> None:
    import pgutil

    port = pgutil.pgbouncer("transaction").port if route == "pgbouncer" else None
    async with pgutil.fresh_database(port=port) as dsn:
        # Workers on PostgreSQL start slower: up to 0.6 s before each kill lets them commit.
        figures = await harness.run_rounds(tmp_path, PG_KILLS, seed=11, db=dsn, max_delay=0.6)
    assert figures.failures == [], figures.failures[:10]
    assert figures.kills == PG_KILLS
    assert figures.kills_mid_task >= PG_KILLS // 3, figures.summary()
    assert figures.tasks_resumed == figures.kills_mid_task
    assert figures.committed_checked > PG_KILLS, figures.summary()


async def test_resume_reuses_stored_results_instead_of_running_the_tool_again(
    tmp_path, store, db_path
) -> None:
    runs: list[str] = []

    @tool
    def charge(order: str) -> str:
        """Charge an order (a side effect that must happen once)."""
        runs.append(order)
        return f"charged {order}"

    steps = [
        {"secure": True, "actions": [{"name": "charge", "args": {"order": "A"}},
                                     {"name": "charge", "args": {"order": "B"}}]},
        {"actions": [{"name": "charge", "args": {"order": "C"}}]},
        {"response": "all charged", "actions": []},
    ]
    # The first run stores A and B, then the model fails: the task stays unfinished.
    first = Agent(llm=ScriptedLLM([steps[0], LLMError("provider down")]), tools=[charge],
                  store=store, llm_retries=0)
    stopped = await first.run("charge A, B, C", user_id="shop")
    assert stopped.stop_reason == "error" and runs == ["A", "B"]
    # A model that starts over asks for A and B again: their stored results are reused.
    again = Agent(llm=ScriptedLLM(steps), tools=[charge], store=store)
    events = [e async for e in again.resume_stream(stopped.task_id, user_id="shop")]
    assert runs == ["A", "B", "C"]
    assert [e.output for e in events if e.type == "result"] == [
        "charged A", "charged B", "charged C",
    ]
    assert events[-1].stop_reason == "completed"
    db = sqlite3.connect(db_path)
    rows = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    db.close()
    tools = [json.loads(c)["output"] for r, c in rows if r == "tool"]
    assert tools == ["charged A", "charged B", "charged C"]
    assert [r for r, _ in rows] == ["user", "assistant", "tool", "tool", "assistant", "tool",
                                    "assistant"]
    # The same call made again later in the same run is a new call and does run.
    runs.clear()
    repeat = Agent(llm=ScriptedLLM([
        {"secure": True, "actions": [{"name": "charge", "args": {"order": "A"}}]},
        {"actions": [{"name": "charge", "args": {"order": "A"}}]},
        {"response": "twice", "actions": []},
    ]), tools=[charge], store=store)
    assert (await repeat.run("charge A twice", user_id="shop")).stop_reason == "completed"
    assert runs == ["A", "A"]
