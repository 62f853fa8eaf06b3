"""At ``synchronous="full"``, flushing writes that wait for the store's worker together share
one transaction and one disk flush (``SQLiteStore._join``): concurrent completions no longer
queue for a flush each. Each write keeps its own outcome: one that fails is rolled back alone
and raises to its own caller; each caller hears only once the flush is over.

To make "together" certain rather than likely, these tests hold the worker with a job that
waits on an event while the writes are handed (the store's private ``_hand``), and count the
commits on the store's own connection. tests/test_sqlite_flushes.py counts the flushes
themselves with strace."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from cogency import Agent
from cogency.errors import ConflictError, StorageError
from cogency.storage import SQLiteStore
from cogency.storage.base import SaveBatch, TaskRecord
from cogency.testing import ScriptedLLM

RUNS = 5


def rows(path: str, sql: str, *params: object) -> list[tuple]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


class _Worker:
    """Holds the store's worker thread until released; counts commits on its connection."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.free = threading.Event()
        self.commits = 0

    async def watch(self) -> None:
        def count(sql: str) -> None:
            if sql == "COMMIT":
                self.commits += 1

        await self.store._run(lambda db: db.set_trace_callback(count))

    def hold(self) -> None:
        self.store._hand(lambda db: self.free.wait(30))

    async def release_when_grouped(self, writes: int) -> None:
        """Release the worker once ``writes`` writes wait for it in one group."""
        for _ in range(3000):
            if len(self.store._group or ()) >= writes:
                break
            await asyncio.sleep(0.001)
        assert len(self.store._group or ()) == writes
        self.commits = 0
        self.free.set()


async def test_concurrent_completions_share_one_commit_and_each_is_stored(tmp_path: Path):
    store = SQLiteStore(tmp_path / "group.db", synchronous="full")
    worker = _Worker(store)
    await worker.watch()
    arrived, gate = asyncio.Event(), asyncio.Event()
    waiting = 0

    async def answer(messages: list[dict[str, str]]) -> dict[str, str]:
        nonlocal waiting
        waiting += 1
        if waiting == RUNS:
            arrived.set()
        await gate.wait()
        return {"response": f"answer to {messages[-1]['content']}"}

    agent = Agent(ScriptedLLM([answer] * RUNS), store=store)
    runs = [asyncio.create_task(agent.run(f"question {n}", f"user{n}")) for n in range(RUNS)]
    await asyncio.wait_for(arrived.wait(), 30)  # every task begun, every model call waiting
    worker.hold()
    gate.set()
    await worker.release_when_grouped(RUNS)
    results = await asyncio.gather(*runs)

    assert worker.commits == 1  # five completions, one transaction (one flush)
    for n, result in enumerate(results):
        assert result.response == f"answer to question {n}"
        assert rows(store.path, "SELECT role, content FROM conversation_messages WHERE "
                    "conversation_id = ? ORDER BY seq", result.conversation_id) == [
            ("user", f"question {n}"), ("assistant", f"answer to question {n}")]
    assert rows(store.path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    assert rows(store.path, "SELECT SUM(message_count) FROM conversations") == [(2 * RUNS,)]
    await agent.close()
    await store.close()


async def _begun(store: SQLiteStore, user: str) -> TaskRecord:
    task = TaskRecord(str(uuid.uuid4()), user, str(uuid.uuid4()), "q", {})
    await store.begin_task(task, {}, [{"role": "user", "content": "q", "id": uuid.uuid4().hex}])
    return task


def _completion(task: TaskRecord, text: str, version: int = 1) -> SaveBatch:
    return SaveBatch(task.user_id, task.task_id, task.conversation_id, version,
                     [{"role": "assistant", "content": text, "id": uuid.uuid4().hex}],
                     complete=True)


async def test_a_write_that_fails_in_a_group_is_rolled_back_alone(tmp_path: Path):
    store = SQLiteStore(tmp_path / "group.db", synchronous="full")
    first, stale, last = [await _begun(store, user) for user in ("ann", "bob", "cy")]
    worker = _Worker(store)
    await worker.watch()
    worker.hold()
    saves = [asyncio.create_task(store.save(_completion(first, "one"))),
             asyncio.create_task(store.save(_completion(stale, "two", version=7))),
             asyncio.create_task(store.save(_completion(last, "three")))]
    await worker.release_when_grouped(3)
    outcomes = await asyncio.gather(*saves, return_exceptions=True)

    assert worker.commits == 1
    assert outcomes[0] == 1 and outcomes[2] == 1
    assert isinstance(outcomes[1], ConflictError)
    stored = rows(store.path, "SELECT conversation_id, content FROM conversation_messages "
                  "WHERE role = 'assistant'")
    assert sorted(stored) == sorted([(first.conversation_id, "one"),
                                     (last.conversation_id, "three")])
    # The refused completion kept its task, whole and resumable; the others are done.
    assert rows(store.path, "SELECT task_id, version FROM task_workspaces") == [
        (stale.task_id, 1)]
    assert rows(store.path, "SELECT message_count FROM conversations WHERE "
                "conversation_id = ?", stale.conversation_id) == [(1,)]
    await store.close()


async def test_a_caller_that_stops_waiting_does_not_stop_the_others(tmp_path: Path):
    store = SQLiteStore(tmp_path / "group.db", synchronous="full")
    tasks = [await _begun(store, user) for user in ("ann", "bob")]
    worker = _Worker(store)
    worker.hold()
    gone = asyncio.create_task(store.save(_completion(tasks[0], "gone")))
    kept = asyncio.create_task(store.save(_completion(tasks[1], "kept")))
    for _ in range(3000):
        if len(store._group or ()) == 2:
            break
        await asyncio.sleep(0.001)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    worker.free.set()
    assert await kept == 1
    # The write itself was handed over before its caller left: it lands, as any would.
    assert sorted(rows(store.path, "SELECT content FROM conversation_messages "
                       "WHERE role = 'assistant'")) == [("gone",), ("kept",)]
    await store.close()


async def test_a_group_whose_connection_cannot_open_tells_its_callers(tmp_path: Path):
    # The first call of this store is a flushing write: the group's job fails before it
    # could tell anyone, and its caller hears why instead of waiting for ever.
    store = SQLiteStore(tmp_path / "missing" / "dir" / "x.db", synchronous="full")
    with pytest.raises(StorageError, match="missing"):
        await asyncio.wait_for(store.update_profile("ann", lambda profile: None), 30)
    await store.close()
