"""Learning is durable work in the store: queued with the task's completion, claimed with a
lease by any process with memory on, learned exactly once. Real processes, SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from cli_run import COMMAND
from memory_replies import answer, insights

from cogency import Agent
from cogency.memory import Memory
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM

TESTS = Path(__file__).parent


def location(store: Any) -> str:
    return str(store.path) if isinstance(store, SQLiteStore) else store.dsn


def cogency(store: Any, *args: str, **env: str) -> subprocess.Popen[str]:
    """``cogency ARGS --db STORE --llm memory_models:agent`` as a child process."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [*COMMAND, *args, "--db", location(store), "--llm", "memory_models:agent"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", **env},
    )


async def wait_until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("timed out waiting")


async def test_a_worker_killed_between_the_answer_and_its_learning_loses_nothing(
    any_store, raw, tmp_path
):
    await any_store.list_tasks()  # the schema, for the raw reads below
    calls = tmp_path / "calls.jsonl"
    worker = cogency(any_store, "run", "remember: ship v2", "--user", "alice",
                     COGENCY_TEST_HANG_LEARNING="1", COGENCY_TEST_CALLS=str(calls))
    try:
        assert worker.stdout is not None
        line = await asyncio.to_thread(worker.stdout.readline)
        while "noted: remember: ship v2" not in line:  # the answer, shown: it is stored
            assert line, worker.stderr.read() if worker.stderr else ""
            line = await asyncio.to_thread(worker.stdout.readline)

        async def claimed() -> Any:
            rows = await raw("SELECT claimed, holder FROM learning_queue WHERE user_id = ?",
                             "alice")
            asking = calls.exists() and calls.read_text().count("\n") == 1
            return rows if rows and rows[0][1] and asking else None

        (row,) = await wait_until(claimed)  # the worker is learning it: mid-call
        task = json.loads(row[0])[0]["task_id"]
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        await asyncio.to_thread(worker.wait)  # reaped: its pid is gone, and so its claim
    assert worker.returncode == -signal.SIGKILL
    assert await raw("SELECT content FROM conversation_messages WHERE task_id = ? "
                     "ORDER BY seq", task) == [("remember: ship v2",),
                                               ("noted: remember: ship v2",)]
    profile = await raw("SELECT profile_data FROM user_profiles WHERE user_id = 'alice'")
    assert '"interaction_count":0' in str(profile[0][0]).replace(" ", "")
    assert len(calls.read_text().splitlines()) == 1  # the killed call: nothing came of it

    # The next `cogency run` on this store, by another user, finishes alice's learning.
    later = cogency(any_store, "run", "hello", "--user", "bob", COGENCY_TEST_CALLS=str(calls))
    out, err = await asyncio.to_thread(later.communicate, timeout=60)
    assert later.returncode == 0, err
    assert "noted: hello" in out

    stored = await raw("SELECT value, sources FROM profile_entries WHERE user_id = 'alice'")
    assert [value for value, _ in stored] == ["ship v2"]  # once
    (source,) = json.loads(stored[0][1])
    assert source["task_id"] == task
    profile = await raw("SELECT profile_data FROM user_profiles WHERE user_id = 'alice'")
    data = profile[0][0] if isinstance(profile[0][0], dict) else json.loads(profile[0][0])
    assert data["goals"] == ["ship v2"] and data["interaction_count"] == 1
    assert await raw("SELECT COUNT(*) FROM learning_queue") == [(0,)]
    asked = [json.loads(line) for line in calls.read_text().splitlines()]
    assert sum("Query: remember: ship v2" in prompt for prompt in asked) == 2  # killed, done


async def test_a_lapsed_claim_is_taken_over_and_its_late_result_is_fenced_out(any_store, raw):
    gate, arrived = asyncio.Event(), asyncio.Event()

    async def slow(messages: list[dict[str, Any]]) -> dict[str, Any]:
        arrived.set()
        await gate.wait()
        return insights(goals=["written too late"])

    first = Agent(llm=ScriptedLLM([answer()]), store=any_store,
                  memory=Memory(llm=ScriptedLLM([slow]), learn_lease=0.3))
    result = await first.run("remember this", "alice")
    await asyncio.wait_for(arrived.wait(), 10)  # claimed, and stuck in the model call
    await asyncio.sleep(0.4)  # its lease lapses (its process lives on)

    def learn(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return insights(goals=["learned once"] if "remember this" in messages[0]["content"]
                        else [])

    second = Agent(llm=ScriptedLLM([answer()]), store=any_store,
                   memory=Memory(llm=ScriptedLLM([learn, learn])))
    await second.run("hi", "bob")  # its sweep takes alice's lapsed claim over
    await second.close()
    gate.set()
    await first.close()  # the late result: fenced out, nothing written

    rows = await raw("SELECT value, sources FROM profile_entries WHERE user_id = 'alice'")
    assert [value for value, _ in rows] == ["learned once"]
    assert json.loads(rows[0][1])[0]["task_id"] == result.task_id
    data = await raw("SELECT profile_data FROM user_profiles WHERE user_id = 'alice'")
    profile = data[0][0] if isinstance(data[0][0], dict) else json.loads(data[0][0])
    assert profile["interaction_count"] == 1 and profile["goals"] == ["learned once"]


async def test_a_claim_cancelled_in_flight_is_free_to_take_at_once(db_path):
    """Learning cancelled while its claim is on the way to the store (a settle that timed
    out, a shutdown) lets the claim go if it lands: another Memory of this process takes it
    at once, not after its lease (10 minutes) lapses."""
    landed = asyncio.Event()

    class Slow(SQLiteStore):
        async def claim_learning(self, holder: str, **which: Any) -> Any:
            claims = await super().claim_learning(holder, **which)
            landed.set()
            await asyncio.Event().wait()  # cancelled here: the claim is stored, not handed back
            return claims

    slow = Slow(db_path)
    async with Agent(llm=ScriptedLLM([answer()]), store=slow,
                     memory=Memory(llm=ScriptedLLM([]), settle_timeout=0)) as agent:
        await agent.run("remember this", "alice")  # queued; its learning claims it
        await asyncio.wait_for(landed.wait(), 10)
    # closed: the learning in flight was cancelled
    store = SQLiteStore(db_path)
    other = Memory(store=store, llm=ScriptedLLM([insights(goals=["learned"])]))
    try:
        assert await other.catch_up() == 1
        assert await other.settle()
        assert (await store.load_profile("alice")).goals == ["learned"]
    finally:
        await other.close()
        await store.close()
        await slow.close()


async def test_failed_learning_waits_its_back_off_and_is_visible(any_store, raw):
    down = RuntimeError("provider down")
    learner = ScriptedLLM([down, down, insights(goals=["finally"])])
    memory = Memory(llm=learner, retry_delay=0, learn_retries=1, retry_backoff=600)
    async with Agent(llm=ScriptedLLM([answer()] * 2), store=any_store, memory=memory) as agent:
        first = await agent.run("remember", "alice")
        await agent.memory.settle()
        status = await agent.memory.status("alice")
        assert status.pending == 1 and status.attempts == 1 and not status.claimed
        assert status.last_error == "RuntimeError: provider down"
        wait = (status.next_attempt_at - status.since).total_seconds()
        assert 590 < wait < 610  # its back-off
        assert await agent.memory.catch_up() == 0  # not due: a sweep leaves it
        assert len(learner.calls) == 2
        # the user's next interaction makes it due at once, learned with it
        await agent.run("and remember this", "alice")
    assert len(learner.calls) == 3 and "remember" in learner.calls[2][0]["content"]
    assert await raw("SELECT COUNT(*) FROM learning_queue") == [(0,)]
    rows = await raw("SELECT sources FROM profile_entries WHERE user_id = 'alice'")
    assert {s["task_id"] for s in json.loads(rows[0][0])} >= {first.task_id}
