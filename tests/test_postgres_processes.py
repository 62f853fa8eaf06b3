"""Many OS processes on one PostgreSQL database: nothing lost, nothing doubled, crashes recover.

Workers are real processes (tests/pg_worker.py) running agent tasks on the same conversations
of the same users; the database is then read back row by row.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pgutil
import pytest

from cogency import Agent
from cogency.errors import TaskRunningError
from cogency.memory import Profile
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

WORKER = Path(__file__).with_name("pg_worker.py")


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with pgutil.fresh_database() as url:
        yield url


def start_worker(dsn: str, worker: int, tasks: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), dsn, str(worker), str(tasks), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


async def finish(process: subprocess.Popen[str], timeout: float = 60) -> list[dict]:
    out, err = await asyncio.to_thread(process.communicate, timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def assert_database_consistent(store: PostgresStore, finished: list[dict]) -> None:
    """Every finished task's four messages exactly once, in order, in its conversation."""
    raw = pgutil.raw_rows(store)
    rows = await raw(
        "SELECT conversation_id, seq, role, content FROM conversation_messages "
        "ORDER BY conversation_id, seq"
    )
    by_conversation: dict[str, list[tuple[int, str, str]]] = {}
    for conversation, seq, role, content in rows:
        by_conversation.setdefault(conversation, []).append((seq, role, content))
    counts = dict(await raw("SELECT conversation_id, message_count FROM conversations"))
    for conversation, messages in by_conversation.items():
        assert [seq for seq, _, _ in messages] == list(range(1, len(messages) + 1)), conversation
        assert counts[conversation] == len(messages)
    seen: dict[str, list[tuple[str, int, str]]] = {}
    for conversation, messages in by_conversation.items():
        for seq, role, content in messages:
            seen.setdefault(_marker(role, content), []).append((conversation, seq, role))
    for task in finished:
        # This task's four messages, once each, in order, in its own conversation.
        found = seen.get(task["marker"], [])
        assert [role for _, _, role in found] == ["user", "assistant", "tool", "assistant"], (
            task, found,
        )
        assert {conversation for conversation, _, _ in found} == {task["conversation"]}
        assert [seq for _, seq, _ in found] == sorted(seq for _, seq, _ in found)


def _marker(role: str, content: str) -> str:
    """The task marker a message carries (the query, the call, its result, the answer)."""
    if role == "user":
        return content.removeprefix("task ")
    if role == "tool":
        return json.loads(content)["output"].removeprefix("noted ")
    if content.startswith('{"actions"'):
        return json.loads(content)["actions"][0]["args"]["marker"]
    return content.removeprefix("done ")


async def test_four_processes_fifty_tasks_each_lose_and_double_nothing(dsn):
    workers = [start_worker(dsn, w, 50) for w in range(4)]
    finished = [task for process in workers for task in await finish(process)]
    assert len(finished) == 200
    assert len({t["task_id"] for t in finished}) == 200

    store = PostgresStore(dsn)
    try:
        await assert_database_consistent(store, finished)
        raw = pgutil.raw_rows(store)
        assert (await raw("SELECT count(*) FROM conversation_messages"))[0][0] == 800
        assert len(await raw("SELECT conversation_id FROM conversations")) == 4
        assert await raw("SELECT task_id FROM task_workspaces") == []
        per_user = Counter(t["user"] for t in finished)
        for user_id, text in await raw("SELECT user_id, profile_data FROM user_profiles"):
            profile = Profile.from_dict(json.loads(text))  # valid JSON, a loadable profile
            # Read-modify-write under the row lock: not one of 100 concurrent bumps lost.
            assert profile.interaction_count == per_user[user_id] == 100
        # Every run let go of its task: no row names a runner.
        assert await raw("SELECT runner FROM task_workspaces WHERE runner IS NOT NULL") == []
    finally:
        await store.close()


async def test_a_sigkilled_worker_leaves_resumable_tasks_and_the_others_finish(dsn, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    others = [start_worker(dsn, w, 30) for w in (0, 1)]
    victim = start_worker(dsn, 2, 5, "--block", "3", "--block-dir", str(blocked))
    store = PostgresStore(dsn)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(list(blocked.glob("*.started"))) < 3:  # the victim is mid-task in 3 tasks
            assert victim.poll() is None, victim.communicate()[1][-3000:]
            assert loop.time() < deadline, "the victim never reached its blocking tool"
            await asyncio.sleep(0.02)
        running = await store.list_tasks()
        mine = [t for t in running if t.query.startswith("task block")]
        assert len(mine) == 3 and all(f"|{victim.pid}|" in (t.runner or "") for t in mine)
        with pytest.raises(TaskRunningError, match="is running"):  # held by another process
            await Agent(llm=ScriptedLLM([{"response": "no"}]), store=store).resume(
                mine[0].task_id, mine[0].user_id
            )

        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        assert victim.returncode == -signal.SIGKILL
        survivors = [task for process in others for task in await finish(process)]
        assert len(survivors) == 60
        victims_done = [json.loads(x) for x in victim.stdout.read().splitlines() if x.strip()]
        assert len(victims_done) == 5  # its plain tasks finished before the kill

        unfinished = await store.list_tasks()
        assert {t.task_id for t in unfinished} == {t.task_id for t in mine}
        # The dead process's runners still name its tasks, and their leases have not lapsed:
        # its process is gone from this host, so they hold nothing (no wait for the lease).
        assert all(task.runner and f"|{victim.pid}|" in task.runner for task in unfinished)
        for task in unfinished:
            marker = task.query.removeprefix("task ")
            resumed = await Agent(
                llm=ScriptedLLM([{"response": f"done {marker}", "actions": []}]), store=store
            ).resume(task.task_id, task.user_id)
            assert (resumed.stop_reason, resumed.response) == ("completed", f"done {marker}")
        assert await store.list_tasks() == []

        raw = pgutil.raw_rows(store)
        await assert_database_consistent(store, survivors + victims_done)
        for task in unfinished:
            marker = task.query.removeprefix("task ")
            contents = [r[0] for r in await raw(
                "SELECT content FROM conversation_messages WHERE task_id = ? ORDER BY seq",
                task.task_id,
            )]
            assert contents == [f"task {marker}", f"done {marker}"]
    finally:
        for process in (*others, victim):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        await store.close()
