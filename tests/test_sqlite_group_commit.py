"""At ``synchronous="full"``, a write that records an outcome is committed without a flush
and its caller told once a flush of the log made it durable. The event loop flushes itself
only while the store has nothing else under way and its flushes are fast
(``SQLiteStore._flush_here``); else the flush is the worker thread's
(``SQLiteStore._owe_flush``), the loop goes on, and commits that owe a flush while one waits
to begin share it. Each write keeps its own outcome: one that fails raises to its own caller
alone.

These tests count and hold the store's own flushes in this process: the store calls
``os.fdatasync`` for them (SQLite's own, for checkpoints, are C calls this does not see).
To make "together" certain rather than likely, some hold the worker with a job that waits on
an event while the writes are handed (the store's private ``_hand``).
tests/test_sqlite_flushes.py counts every flush of the process with strace."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from cogency import Agent
from cogency.errors import ConflictError, StorageError
from cogency.storage import SQLiteStore
from cogency.storage import sqlite as backend
from cogency.storage.base import SaveBatch, TaskRecord
from cogency.testing import ScriptedLLM

RUNS = 5


def rows(path: str, sql: str, *params: object) -> list[tuple]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


class Flushes:
    """``os.fdatasync`` of a log counted, with the thread each ran on; ``hold()`` makes the
    next ones wait until ``release()``; ``fail()`` makes the next one fail as a disk would;
    while ``slow``, each takes 10 ms by the clock the store times its flushes with (a clock of
    this test's: the others take no time by it, however busy the machine), and while
    ``stalled``, 1 s. (The one flush of a
    new file made of the schema's image, before it is named, is not counted:
    ``test_sqlite_schema.py`` counts it.)"""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = os.fdatasync
        self.threads: list[str] = []
        self.files: list[str] = []
        self.entered = threading.Event()
        self.free = threading.Event()
        self.free.set()
        self.failing = False
        self.slow = False
        self.stalled = False
        self.now = 0.0
        monkeypatch.setattr(os, "fdatasync", self)
        monkeypatch.setattr(backend, "_clock", lambda: self.now)

    def __call__(self, fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(" (deleted)"):  # a new file's, before it is named
            return self.real(fd)
        self.threads.append(threading.current_thread().name)
        self.files.append(name)
        self.entered.set()
        assert self.free.wait(30)
        if self.failing:
            self.failing = False
            raise OSError(errno.EIO, "Input/output error")
        self.real(fd)
        if self.slow:
            self.now += 0.010
        if self.stalled:
            self.now += 1.0

    def hold(self) -> None:
        self.entered.clear()
        self.free.clear()

    def release(self) -> None:
        self.free.set()

    def fail(self) -> None:
        self.failing = True


class _Worker:
    """Holds the store's worker thread until released."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.free = threading.Event()

    def hold(self) -> None:
        self.store._hand(lambda db: self.free.wait(30))

    async def release_when_waiting(self, writes: int) -> None:
        """Release the worker once ``writes`` writes were handed to it behind the hold."""
        for _ in range(3000):
            if self.store._handed - self.store._finished >= writes + 1:
                break
            await asyncio.sleep(0.001)
        assert self.store._handed - self.store._finished == writes + 1
        self.free.set()


async def test_concurrent_completions_share_one_flush_and_each_is_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    flushes = Flushes(monkeypatch)
    store = SQLiteStore(tmp_path / "group.db", synchronous="full")
    worker = _Worker(store)
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
    before = len(flushes.threads)
    worker.hold()
    gate.set()
    await worker.release_when_waiting(RUNS)
    results = await asyncio.gather(*runs)

    assert len(flushes.threads) - before == 1  # five completions, one flush
    assert flushes.files[-1] == str(tmp_path / "group.db") + "-wal"  # the log, made durable
    assert set(flushes.threads) == {"cogency-sqlite"}  # never the event loop's thread
    for n, result in enumerate(results):
        assert result.response == f"answer to question {n}"
        assert rows(store.path, "SELECT role, content FROM conversation_messages WHERE "
                    "conversation_id = ? ORDER BY seq", result.conversation_id) == [
            ("user", f"question {n}"), ("assistant", f"answer to question {n}")]
    assert rows(store.path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    assert rows(store.path, "SELECT SUM(message_count) FROM conversations") == [(2 * RUNS,)]
    await agent.close()
    await store.close()


async def _answered(tmp_path: Path, *answers: str) -> tuple[Agent, SQLiteStore, str]:
    """An agent at "full" on a fresh file that gave its first answer ("one", of ann's):
    the agent, its store and the conversation."""
    store = SQLiteStore(tmp_path / "agent.db", synchronous="full")
    agent = Agent(ScriptedLLM([{"response": answer} for answer in answers]), store=store)
    return agent, store, (await agent.run("one", "ann")).conversation_id


async def test_a_run_hears_its_answer_only_once_the_flush_is_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    flushes = Flushes(monkeypatch)
    most = backend.FLUSH_SLOW_MOST
    agent, store, conversation = await _answered(tmp_path, "first", *["slow"] * most, "second")
    flushes.slow = True  # FLUSH_SLOW_MOST slow flushes: the next ones are the worker's
    for _ in range(most):
        assert (await agent.run("slow", "ann", conversation)).response == "slow"
    flushes.hold()
    run = asyncio.create_task(agent.run("two", "ann", conversation))
    for _ in range(3000):  # the completion committed, its flush begun
        if flushes.entered.is_set():
            break
        await asyncio.sleep(0.001)
    assert flushes.entered.is_set()
    ticks = 0
    for _ in range(20):  # the loop goes on meanwhile: the flush waits on the worker thread
        await asyncio.sleep(0.001)
        ticks += 1
    assert ticks == 20 and not run.done()
    # Committed, not yet told: another connection reads the answer already.
    assert rows(store.path, "SELECT content FROM conversation_messages WHERE conversation_id "
                "= ? ORDER BY seq", conversation)[-1] == ("second",)
    flushes.release()
    assert (await asyncio.wait_for(run, 30)).response == "second"
    assert flushes.threads[-1] == "cogency-sqlite"
    await agent.close()
    await store.close()


async def test_the_loop_flushes_itself_unless_a_quarter_of_its_last_flushes_were_slow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A flush on the loop wakes no thread: a lone turn's answer is told sooner. A slow flush
    # now and then (a disk's tail) leaves the flushes there; a disk that turns slow holds the
    # loop for FLUSH_SLOW_MOST flushes, then the worker makes them until fewer than that many
    # of the last FLUSH_WINDOW were slow.
    flushes = Flushes(monkeypatch)
    store = SQLiteStore(tmp_path / "agent.db", synchronous="full")
    agent = Agent(ScriptedLLM(itertools.repeat({"response": "ok"})), store=store)
    loop, worker = threading.current_thread().name, "cogency-sqlite"
    window, most = backend.FLUSH_WINDOW, backend.FLUSH_SLOW_MOST
    conversation: str | None = None

    async def turns(count: int, *, slow: bool = False) -> list[str]:
        nonlocal conversation
        flushes.slow = slow
        before = len(flushes.threads)
        for _ in range(count):
            conversation = (await agent.run("hi", "ann", conversation)).conversation_id
        return flushes.threads[before:]  # one flush per turn: where each ran

    # A new store's first flush is the worker's.
    assert await turns(window) == [worker] + [loop] * (window - 1)
    # Slow ones among fast ones stay on the loop.
    for _ in range(2):
        assert await turns(most - 1, slow=True) == [loop] * (most - 1)
        assert await turns(window) == [loop] * window
    # A disk that turns slow holds the loop for FLUSH_SLOW_MOST flushes, no more.
    assert await turns(most + 3, slow=True) == [loop] * most + [worker] * 3
    # The worker makes the flushes until fewer than FLUSH_SLOW_MOST of the last window were
    # slow: after window - most + 1 fast ones, most - 1 of the slow ones are left in it.
    back = window - most + 1
    assert await turns(back + 1) == [worker] * back + [loop]
    # A stall (over FLUSH_STALL_SECONDS) holds the loop once: the next flushes, stalled or
    # not, are the worker's until as many fast ones as above have pushed it out.
    flushes.stalled = True
    assert await turns(2) == [loop, worker]
    flushes.stalled = False
    assert await turns(back + 1) == [worker] * back + [loop]
    # Every answer was stored, each by the flush that told it.
    assert rows(store.path, "SELECT COUNT(*) FROM conversation_messages WHERE role = "
                "'assistant'") == [(len(flushes.threads),)]
    await agent.close()
    await store.close()


async def test_a_run_among_others_leaves_its_flush_to_the_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Two runs under way: the first to finish may not hold the loop for its flush (the other
    # may finish meanwhile and share it); the last, alone, flushes on the loop.
    flushes = Flushes(monkeypatch)
    agent, store, _ = await _answered(tmp_path, "first")
    gates = {"ann": asyncio.Event(), "bob": asyncio.Event()}
    waiting: list[str] = []

    async def answer(messages: list[dict[str, str]]) -> dict[str, str]:
        user = messages[-1]["content"]
        waiting.append(user)
        await gates[user].wait()
        return {"response": f"to {user}"}

    agent.llm = ScriptedLLM([answer, answer])
    runs = {user: asyncio.create_task(agent.run(user, user)) for user in gates}
    for _ in range(3000):  # both tasks begun, both model calls waiting
        if len(waiting) == 2:
            break
        await asyncio.sleep(0.001)
    assert len(waiting) == 2
    before = len(flushes.threads)
    gates["ann"].set()
    ann = await runs["ann"]
    gates["bob"].set()
    bob = await runs["bob"]
    assert (ann.response, bob.response) == ("to ann", "to bob")
    assert flushes.threads[before:] == ["cogency-sqlite", threading.current_thread().name]
    # Each answer is stored in its own conversation, each task done (its row gone).
    for run, user in ((ann, "ann"), (bob, "bob")):
        assert rows(store.path, "SELECT role, content FROM conversation_messages WHERE "
                    "conversation_id = ? ORDER BY seq", run.conversation_id) == [
            ("user", user), ("assistant", f"to {user}")]
    assert rows(store.path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    await agent.close()
    await store.close()


async def test_a_failed_flush_is_told_to_its_caller_and_the_next_turn_flushes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    flushes = Flushes(monkeypatch)
    agent, store, conversation = await _answered(tmp_path, "first", "second", "third")
    flushes.fail()
    with pytest.raises(StorageError, match="flushing the database .* failed .*power loss"):
        await agent.run("two", "ann", conversation)
    # Nothing is lost: the answer was written, and the conversation goes on.
    third = await agent.run("three", "ann", conversation)
    assert third.response == "third"
    assert [content for (content,) in rows(
        store.path, "SELECT content FROM conversation_messages WHERE conversation_id = ? "
        "ORDER BY seq", conversation)] == ["one", "first", "two", "second", "three",
                                                    "third"]
    assert len(flushes.threads) == 3
    await agent.close()
    await store.close()


async def test_normal_durability_never_flushes_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    flushes = Flushes(monkeypatch)
    store = SQLiteStore(tmp_path / "normal.db")
    agent = Agent(ScriptedLLM([{"response": "ok"}] * 3), store=store)
    for _ in range(3):
        await agent.run("hello", "ann")
    assert flushes.threads == []
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


async def test_a_write_that_fails_among_others_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    flushes = Flushes(monkeypatch)
    store = SQLiteStore(tmp_path / "group.db", synchronous="full")
    first, stale, last = [await _begun(store, user) for user in ("ann", "bob", "cy")]
    worker = _Worker(store)
    worker.hold()
    saves = [asyncio.create_task(store.save(_completion(first, "one"))),
             asyncio.create_task(store.save(_completion(stale, "two", version=7))),
             asyncio.create_task(store.save(_completion(last, "three")))]
    await worker.release_when_waiting(3)
    outcomes: list[Any] = await asyncio.gather(*saves, return_exceptions=True)

    assert len(flushes.threads) == 1
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
        if store._handed - store._finished == 3:
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


async def test_a_flushing_write_whose_connection_cannot_open_tells_its_caller(tmp_path: Path):
    # The first call of this store is a flushing write: its job fails before it could
    # commit, and its caller hears why instead of waiting for ever.
    store = SQLiteStore(tmp_path / "missing" / "dir" / "x.db", synchronous="full")
    with pytest.raises(StorageError, match="missing"):
        await asyncio.wait_for(store.update_profile("ann", lambda profile: None), 30)
    await store.close()


async def test_closing_the_store_flushes_what_is_owed_before_the_connection_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A completion committed on the worker as the store closes: its flush is handed after
    # the close's, and would find the log gone with the connection.
    flushes = Flushes(monkeypatch)
    began = SQLiteStore(tmp_path / "closing.db", synchronous="full")
    task = await _begun(began, "ann")  # (begun elsewhere: this store holds nothing to let go)
    await began.close()
    store = SQLiteStore(tmp_path / "closing.db", synchronous="full")
    committed, go = threading.Event(), threading.Event()
    note = store._windows.note

    def noted(*args: Any) -> None:  # run on the worker once the completion is committed
        committed.set()
        assert go.wait(30)
        note(*args)

    monkeypatch.setattr(store._windows, "note", noted)
    worker = _Worker(store)
    worker.hold()  # so that the completion is committed on the worker
    save = asyncio.create_task(store.save(_completion(task, "last words")))
    await worker.release_when_waiting(1)
    for _ in range(3000):
        if committed.is_set():
            break
        await asyncio.sleep(0.001)
    closing = asyncio.create_task(store.close())
    for _ in range(3000):  # the close's job queued behind the completion's
        if store._closed:
            break
        await asyncio.sleep(0.001)
    go.set()
    await closing
    assert await save == 1  # told, with no error
    assert flushes.files == [str(tmp_path / "closing.db") + "-wal"]
    assert rows(str(tmp_path / "closing.db"), "SELECT content FROM conversation_messages "
                "WHERE role = 'assistant'") == [("last words",)]


async def test_a_store_opened_through_a_symbolic_link_flushes_the_log_sqlite_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # SQLite keeps the log beside the file the link names, not beside the link.
    flushes = Flushes(monkeypatch)
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "agent.db").symlink_to(tmp_path / "real" / "agent.db")
    store = SQLiteStore(tmp_path / "links" / "agent.db", synchronous="full")
    agent = Agent(ScriptedLLM([{"response": "ok"}, {"response": "again"}]), store=store)
    first = await agent.run("hello", "ann")
    assert (await agent.run("more", "ann", first.conversation_id)).response == "again"
    assert flushes.files == [str(tmp_path / "real" / "agent.db") + "-wal"] * 2
    await agent.close()
    await store.close()
    assert rows(str(tmp_path / "real" / "agent.db"), "SELECT content FROM conversation_messages "
                "WHERE conversation_id = ? ORDER BY seq", first.conversation_id) == [
        ("hello",), ("ok",), ("more",), ("again",)]
