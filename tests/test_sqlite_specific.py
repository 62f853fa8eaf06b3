"""What only SQLite has: migrations from the seeds' v3.0 file, PRAGMAs, file locations and
URLs, file locking, and several connections or processes writing one file."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cogency.errors import (
    ConflictError,
    CorruptDataError,
    SchemaTooNewError,
    StorageError,
    StoreUnavailableError,
    UsageError,
)
from cogency.memory import Memory
from cogency.state import State, add_message, autosave
from cogency.storage import SQLiteStore, default_db_path, open_store
from cogency.storage.base import MIGRATION_NAMES

SRC = str(Path(__file__).resolve().parents[1] / "src")


async def on_store_connection(store: SQLiteStore, sql: str, *params: object) -> list[tuple]:
    """Run SQL on the store's own connection (its PRAGMAs are per connection)."""
    return await store._run(lambda db: db.execute(sql, params).fetchall())


def rows(path: Path | str, sql: str, *params: object) -> list[tuple]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


# -- connection settings ---------------------------------------------------------------------


async def test_connection_uses_wal_foreign_keys_and_a_busy_timeout(db_path):
    store = SQLiteStore(db_path, busy_timeout=2.5)
    try:
        assert await on_store_connection(store, "PRAGMA foreign_keys") == [(1,)]
        assert await on_store_connection(store, "PRAGMA busy_timeout") == [(2500,)]
        assert await on_store_connection(store, "PRAGMA journal_mode") == [("wal",)]
        with pytest.raises(StorageError, match="FOREIGN KEY"):
            await on_store_connection(
                store, "INSERT INTO conversations (conversation_id, user_id, conversation_data) "
                "VALUES ('c', 'nobody', '{}')",
            )
    finally:
        await store.close()
    # WAL is a property of the file: every later connection sees it.
    assert rows(db_path, "PRAGMA journal_mode") == [("wal",)]
    assert rows(db_path, "SELECT name FROM schema_migrations ORDER BY name") == [
        (name,) for name in MIGRATION_NAMES
    ]
    # The declared schema: messages cascade with their conversation; workspaces name theirs.
    fks = rows(db_path, "PRAGMA foreign_key_list(conversation_messages)")
    assert [(fk[2], fk[3], fk[6]) for fk in fks] == [
        ("conversations", "conversation_id", "CASCADE")
    ]
    assert {fk[2] for fk in rows(db_path, "PRAGMA foreign_key_list(task_workspaces)")} == {
        "user_profiles", "conversations",
    }


async def test_a_new_file_has_small_pages_and_a_turn_writes_little_log(tmp_path, monkeypatch):
    """A file the store creates uses ``PAGE_BYTES`` pages: a turn's two commits write the
    pages they change whole to the log, 11 each, so a one-step turn of a few hundred bytes
    appends ~23 KB of log, not the ~90 KB of SQLite's default 4 KiB pages. A file that
    exists (made by a Cogency that used the default) keeps its page size, and works."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    answers = [{"response": "An answer of a few hundred bytes. " * 12} for _ in range(4)]
    logged: dict[int, list[int]] = {}
    new, old = tmp_path / "new.db", tmp_path / "old.db"
    with monkeypatch.context() as earlier:
        earlier.setattr(backend, "PAGE_BYTES", 4096)
        made = SQLiteStore(old)
        await made.list_conversations("alice")  # creates the file and its schema
        await made.close()
    for path in (new, old):
        store = SQLiteStore(path)
        try:
            async with Agent(ScriptedLLM(list(answers)), store=store) as agent:
                conversation = None
                for turn in range(4):
                    before = os.path.getsize(f"{path}-wal") if turn else 0
                    result = await agent.run(f"question {turn}: " + "words " * 25, "alice",
                                             conversation)
                    conversation = result.conversation_id
                    if turn:  # (the first creates the conversation and the user's row)
                        logged.setdefault(rows(path, "PRAGMA page_size")[0][0], []).append(
                            os.path.getsize(f"{path}-wal") - before)
        finally:
            await store.close()
        assert len(rows(path, "SELECT 1 FROM conversation_messages")) == 8
    assert backend.PAGE_BYTES == 1024 and set(logged) == {1024, 4096}
    assert max(logged[1024]) < 32 * 1024 < min(logged[4096])


async def test_durability_is_the_callers_choice_and_reaches_the_connection(tmp_path, monkeypatch):
    """synchronous="normal" (the default) or "full", from the constructor, open_store's
    option or the URL, is what the agent's turns are written with: at "full" the store
    flushes the write-ahead log itself (``os.fdatasync``, counted here) before a turn's answer
    is told, the connection committing without SQLite's flush (NORMAL); at "normal" nothing
    is flushed."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    flushed: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not name.endswith(" (deleted)"):  # (a new file made of the schema's image, unnamed)
            flushed.append(name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    normal = 1  # what PRAGMA synchronous reads back, at either setting
    made = {
        "default": (SQLiteStore(tmp_path / "a.db"), "normal"),
        "constructor": (SQLiteStore(tmp_path / "b.db", synchronous="full"), "full"),
        "option": (open_store(tmp_path / "c.db", synchronous="FULL"), "full"),
        "url": (open_store(f"sqlite:///{tmp_path}/d.db?synchronous=full"), "full"),
        "url normal": (open_store(f"sqlite:///{tmp_path}/e.db?synchronous=normal"), "normal"),
    }
    for name, (store, expected) in made.items():
        try:
            assert isinstance(store, SQLiteStore) and store.synchronous == expected, name
            flushed.clear()
            async with Agent(ScriptedLLM([{"response": "hi"}]), store=store) as agent:
                assert (await agent.run("hello", "alice")).response == "hi"
                log = store.path + "-wal"
                assert flushed == ([log] if expected == "full" else []), name
            assert await on_store_connection(store, "PRAGMA synchronous") == [(normal,)], name
        finally:
            await store.close()
    # An agent opening the store itself from a URL.
    url = f"sqlite:///{tmp_path}/f.db?synchronous=full"
    agent = Agent(ScriptedLLM([{"response": "hi"}]), store=url)
    try:
        flushed.clear()
        await agent.run("hello", "alice")
        assert flushed == [str(tmp_path / "f.db") + "-wal"]
    finally:
        await agent.close()
    assert rows(tmp_path / "f.db", "SELECT count(*) FROM conversation_messages") == [(2,)]

    for bad in ("sqlite:///x.db?synchronous=off", "sqlite:///x.db?journal=wal",
                "sqlite:///x.db?synchronous=full&synchronous=normal"):
        with pytest.raises(UsageError, match="synchronous"):
            open_store(bad)
    with pytest.raises(UsageError, match="say it once"):
        open_store("sqlite:///x.db?synchronous=full", synchronous="normal")
    with pytest.raises(UsageError, match="'normal' or 'full'"):
        SQLiteStore(tmp_path / "g.db", synchronous="extra")
    with pytest.raises(UsageError, match="synchronous_commit"):
        open_store("postgresql://localhost/db", synchronous="full")


async def test_a_later_turn_writes_nothing_for_memory_and_reads_back_nothing_it_wrote(tmp_path):
    """With memory off, a turn on an existing conversation sends no statement to
    user_profiles (the conversation shows the user's row exists), and neither it nor the
    turn before reads back the messages they stored (the cached window took them)."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    store = SQLiteStore(tmp_path / "t.db")
    try:
        async with Agent(ScriptedLLM([{"response": "one"}, {"response": "two"}]),
                         store=store) as agent:
            conversation = (await agent.run("hello", "alice")).conversation_id
            traced: list[str] = []
            await store._run(lambda db: db.set_trace_callback(traced.append))
            assert (await agent.run("again", "alice", conversation)).response == "two"
            await store._run(lambda db: db.set_trace_callback(None))
        assert traced and not [sql for sql in traced if "user_profiles" in sql]
        assert not [sql for sql in traced if sql.startswith("SELECT seq, role, content")]
        messages = await store.load_messages(conversation, "alice", token_budget=8000)
        assert [m["content"] for m in messages] == ["hello", "one", "again", "two"]
    finally:
        await store.close()


async def test_a_turn_runs_its_sql_on_the_event_loop_and_waits_for_a_lock_off_it(tmp_path):
    """The short calls of a turn run on the event loop (no hop to the worker thread and
    back); one that meets a lock held by another connection waits for it on the worker
    thread, so the loop goes on meanwhile (it never waits on a lock)."""
    import threading

    from cogency import Agent
    from cogency.testing import ScriptedLLM

    path = tmp_path / "t.db"
    store = SQLiteStore(path, busy_timeout=5)
    try:
        async with Agent(ScriptedLLM([{"response": "one"}, {"response": "two"},
                                      {"response": "three"}]), store=store) as agent:
            conversation = (await agent.run("hello", "alice")).conversation_id
            threads: list[int] = []
            await store._run(lambda db: db.set_trace_callback(
                lambda _: threads.append(threading.get_ident())))
            assert (await agent.run("again", "alice", conversation)).response == "two"
            assert threads and set(threads) == {threading.get_ident()}

            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            try:
                run = asyncio.ensure_future(agent.run("and again", "alice", conversation))
                await asyncio.sleep(0.05)  # the loop runs: the run waits on the worker
                assert not run.done()
            finally:
                other.execute("COMMIT")
                other.close()
            assert (await run).response == "three"
            await store._run(lambda db: db.set_trace_callback(None))
    finally:
        await store.close()


async def test_the_log_is_checkpointed_on_the_worker_never_on_the_event_loop(tmp_path):
    """Turns whose calls all run on the event loop (synchronous=normal) still keep the
    write-ahead log bounded, and every checkpoint (which flushes the file) runs on the
    worker thread: SQLite's automatic one, run by whichever thread committed, is off."""
    import threading

    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    text = "x" * 30_000  # under the text a call may carry on the loop
    turns = 2 * backend.CHECKPOINT_BYTES // (2 * len(text)) + 10
    try:
        async with Agent(ScriptedLLM([{"response": text}] * turns), store=store) as agent:
            conversation = (await agent.run(text, "alice")).conversation_id
            loop_thread = threading.get_ident()
            checkpoints: list[int] = []
            statements: list[int] = []

            def trace(sql: str) -> None:
                statements.append(threading.get_ident())
                if "wal_checkpoint" in sql:
                    checkpoints.append(threading.get_ident())

            assert await store._run(
                lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
            await store._run(lambda db: db.set_trace_callback(trace))
            for _ in range(turns - 1):
                await agent.run(text, "alice", conversation)
            await store._run(lambda db: db.set_trace_callback(None))
            assert statements.count(loop_thread) > len(statements) / 2  # the turns ran here
            assert checkpoints and loop_thread not in checkpoints
            # One per CHECKPOINT_BYTES written, not one per commit once the log was that big
            # (a log SQLite restarts keeps its size: the checkpoint empties the file).
            assert len(checkpoints) <= turns // 10  # ~ a tenth: the log grows 4 MiB per 15
            wal = path.with_name(path.name + "-wal").stat().st_size
            assert wal < 2 * backend.CHECKPOINT_BYTES  # emptied, not grown
    finally:
        await store.close()


async def test_closing_with_a_checkpoint_handed_to_the_worker_runs_it_quietly(tmp_path, caplog):
    """A checkpoint handed to the worker just before ``close`` runs there as handed: closing
    never turns it into a failure logged as a warning ("this store is closed")."""
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store._run(lambda db: db.execute("CREATE TABLE filler (x TEXT)"))
    with caplog.at_level("WARNING", logger="cogency"):
        while store._checkpointing is None:  # inline writes until the log is big enough
            await store._run(store._write(
                lambda db: db.execute("INSERT INTO filler VALUES (?)", ("x" * 60_000,)),
                flush=False), inline=True)
        await store.close()
    assert not [r for r in caplog.records if "checkpointing" in r.getMessage()]
    assert not path.with_name(path.name + "-wal").exists()  # closed: checkpointed and gone


async def test_the_copying_of_a_checkpoint_never_holds_up_a_turn(tmp_path, monkeypatch):
    """The log is copied into the database by a thread and connection of the checkpoint's
    own while the turns go on; the worker, in turn with the calls, only copies the little
    written meanwhile (under ``COPY_ALONE_BYTES``) and starts the log over: a turn no longer
    waits for a whole checkpoint (before: 20-30 ms, once per 4 MiB written).

    A reader, taken again after each turn, keeps the copy from reaching the turn in flight,
    as a copy slower than the commits around it does (on a fast machine a copy ends before
    the next commit, and SQLite starts a log it finds all copied over by itself: the
    worker's part would not come)."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    monkeypatch.setattr(backend, "CHECKPOINT_BYTES", 1024 * 1024)
    copies: list[int] = []
    left: list[int] = []
    path = tmp_path / "t.db"
    store = SQLiteStore(path)

    def copy_log(db: sqlite3.Connection) -> None:
        copies.append(threading.get_ident())
        original_copy(db)

    def checkpoint(db: sqlite3.Connection) -> None:
        held, copied = store._log_state()
        left.append(held - copied)
        original_checkpoint(db)

    original_copy, original_checkpoint = backend._copy_log, backend._checkpoint
    monkeypatch.setattr(backend, "_copy_log", copy_log)
    monkeypatch.setattr(backend, "_checkpoint", checkpoint)
    text = "x" * 20_000  # a turn writes under COPY_ALONE_BYTES of log
    turns = 0
    reader: sqlite3.Connection | None = None
    async with Agent(ScriptedLLM([{"response": text}] * 400), store=store) as agent:
        conversation = (await agent.run(text, "alice")).conversation_id
        loop_thread = threading.get_ident()
        try:
            while len(left) < 3:
                await agent.run(text, "alice", conversation)
                turns += 1
                assert turns < 300
                if reader is not None:
                    reader.close()
                reader = sqlite3.connect(path, isolation_level=None)
                reader.execute("BEGIN")
                reader.execute("SELECT count(*) FROM conversation_messages").fetchone()
        finally:
            if reader is not None:
                reader.close()
        worker_thread = await store._hand(lambda db: threading.get_ident())
    await store.close()
    assert copies and not {loop_thread, worker_thread} & set(copies)
    assert max(left) < backend.COPY_ALONE_BYTES  # the worker copied only what was left
    reopened = SQLiteStore(path)
    assert len(await reopened.load_messages(conversation, "alice")) == 2 * (turns + 1)
    await reopened.close()


async def test_a_checkpoint_that_fails_is_logged_and_the_next_one_runs(
        tmp_path, monkeypatch, caplog):
    """A copy that fails (a disk error, say) is said in the log, holds nothing up, and the
    next commit hands another; the store still closes."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    monkeypatch.setattr(backend, "CHECKPOINT_BYTES", 256 * 1024)
    attempts: list[str] = []

    def copy_log(db: sqlite3.Connection) -> None:
        attempts.append("copy")
        if len(attempts) == 1:
            raise sqlite3.OperationalError("disk I/O error")
        original(db)

    original = backend._copy_log
    monkeypatch.setattr(backend, "_copy_log", copy_log)
    store = SQLiteStore(tmp_path / "t.db")
    text = "x" * 30_000
    with caplog.at_level("WARNING", logger="cogency"):
        async with Agent(ScriptedLLM([{"response": text}] * 100), store=store) as agent:
            conversation = (await agent.run(text, "alice")).conversation_id
            while len(attempts) < 2:
                await agent.run(text, "alice", conversation)
                await _copier_idle(store)
        await asyncio.wait_for(store.close(), 10)
    assert [r for r in caplog.records if "disk I/O error" in r.getMessage()]


async def test_a_checkpoint_that_fails_after_a_call_fails_not_that_call(
        tmp_path, monkeypatch, caplog):
    """The worker's checkpoint after a call that filled the log: if SQLite fails it, the call
    (done, committed) still returns its result; the failure is in the log."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    def checkpoint(db: sqlite3.Connection) -> None:
        failed.append(True)
        raise sqlite3.OperationalError("disk I/O error")

    failed: list[bool] = []
    store = SQLiteStore(tmp_path / "t.db")
    text = "x" * (backend.INLINE_CHARACTERS + 1)  # its save goes to the worker
    with caplog.at_level("WARNING", logger="cogency"):
        async with Agent(ScriptedLLM([{"response": "hi"}, {"response": text}]),
                         store=store) as agent:
            await agent.run("hello", "alice")
            await store._hand(lambda db: None, checkpoint=True)  # the log starts over
            # The next turn's start leaves the log under 50 KiB; its answer's save (64 KiB
            # of text), on the worker, fills it: the worker checkpoints after it, itself.
            monkeypatch.setattr(backend, "_checkpoint", checkpoint)
            monkeypatch.setattr(backend, "CHECKPOINT_BYTES", 50 * 1024)
            monkeypatch.setattr(backend, "COPY_ALONE_BYTES", 1 << 30)
            result = await agent.run("hello", "alice")
            assert result.stop_reason == "completed" and result.response == text
        messages = await store.load_messages(result.conversation_id, "alice")
        await store.close()
    assert failed and messages[-1]["content"] == text
    assert [r for r in caplog.records if "disk I/O error" in r.getMessage()]


async def _copier_idle(store: SQLiteStore) -> None:
    """Once the checkpoint the copier thread has in hand (if any) is over."""
    if store._copier is not None:
        await store._copier.submit(lambda: None)


async def test_after_a_checkpoint_commits_reuse_the_log_file(tmp_path, monkeypatch):
    """A checkpoint leaves the log file at its size, and the commits after it write over it
    from the start (a flush of blocks the file has is cheaper than one of a file that grows);
    how full the log is comes from SQLite's wal-index, not from the file's size. A header
    this store does not know sends it back to the file's size."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    monkeypatch.setattr(backend, "CHECKPOINT_BYTES", 512 * 1024)
    path = tmp_path / "t.db"
    log = path.with_name(path.name + "-wal")
    # The copier copies nothing here, so the worker starts the log over once it holds
    # LOG_MOST_BYTES. (A copy that ends before the next commit, on a fast machine, lets
    # SQLite start the log over by itself at that commit: the worker's checkpoint, which
    # this checks, would not come.)
    monkeypatch.setattr(backend, "LOG_MOST_BYTES", 1024 * 1024)
    monkeypatch.setattr(backend, "_copy_log", lambda db: None)
    store = SQLiteStore(path)  # every call on the loop: the checkpoint shows as handed
    text = "x" * 20_000
    async with Agent(ScriptedLLM([{"response": text}] * 100), store=store) as agent:
        conversation = (await agent.run(text, "alice")).conversation_id
        turns = 2
        while store._checkpointing is None:
            await agent.run(text, "alice", conversation)
            turns += 1
            assert turns < 90
        await store._checkpointing
        size = log.stat().st_size
        assert size >= backend.CHECKPOINT_BYTES
        await agent.run(text, "alice", conversation)
        assert store._checkpointing is None
        assert log.stat().st_size == size  # written over, neither emptied nor grown
        held = await store._run(lambda db: store._log_state()[0])
        assert 0 < held < size / 2  # what the last turns wrote, not the file's size
        monkeypatch.setattr(backend, "_WAL_INDEX_VERSION", 1)  # a wal-index it does not know
        assert await store._run(lambda db: store._log_state()[0]) == size
    await store.close()
    reopened = SQLiteStore(path)
    messages = await reopened.load_messages(conversation, "alice")
    assert len(messages) == 2 * turns and messages[-1]["content"] == text
    await reopened.close()


async def test_at_full_the_log_is_written_ahead_and_read_back_whole_after_a_crash(
        tmp_path, monkeypatch):
    """At synchronous="full" the store keeps its log file written (zeros) past its last
    frame, as far as the log holds (``LOG_AHEAD_FIRST`` to ``LOG_AHEAD_BYTES``), so most of its
    flushes are of a file that did not grow since the one before (a flush of a grown file
    records its size too). The frames
    before the zeros all count: the store reads them, and so does SQLite's recovery after a
    crash (the files copied as a killed process leaves them, without the wal-index, which
    SQLite rebuilds from the log, stopping at the zeros). At "normal", which flushes nothing
    itself, nothing is written ahead."""
    import shutil

    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    sizes: list[int] = []  # the log file's size at each flush of it
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
            sizes.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    turns = 40
    for setting in ("full", "normal"):
        path = tmp_path / f"{setting}.db"
        log = Path(f"{path}-wal")
        sizes.clear()
        store = SQLiteStore(path, synchronous=setting)
        answers = [{"response": f"answer {n}: " + "words " * 60} for n in range(turns)]
        async with Agent(ScriptedLLM(answers), store=store) as agent:
            conversation = None
            for n in range(turns):
                result = await agent.run(f"question {n}: " + "words " * 20, "alice",
                                         conversation)
                conversation = result.conversation_id
                if n == 0 and setting == "full":  # a short log is written ahead by little
                    first = await store._run(lambda db: store._log_state()[0])
                    assert 32 + first < log.stat().st_size <= (
                        32 + first + backend.LOG_AHEAD_FIRST)
            held, copied = await store._run(lambda db: store._log_state())
            frames_end = 32 + held  # the header, then the frames
            assert held > 10 * 1024 * turns and copied == 0  # no checkpoint came
            if setting == "full":
                assert len(sizes) == turns  # one flush per turn
                grew = sum(1 for before, after in zip(sizes, sizes[1:]) if after > before)
                assert grew <= turns // 5, sizes
                assert frames_end < log.stat().st_size <= frames_end + backend.LOG_AHEAD_BYTES
                crashed = tmp_path / "crashed.db"
                shutil.copyfile(path, crashed)
                shutil.copyfile(log, f"{crashed}-wal")
                assert rows(crashed, "SELECT count(*) FROM conversation_messages") == [
                    (2 * turns,)]
                assert rows(crashed, "SELECT content FROM conversation_messages "
                                     "ORDER BY seq DESC LIMIT 1") == [(answers[-1]["response"],)]
                assert rows(crashed, "PRAGMA integrity_check") == [("ok",)]
            else:
                assert sizes == []
                assert log.stat().st_size == frames_end
        await store.close()
        reopened = SQLiteStore(path)
        assert len(await reopened.load_messages(conversation, "alice")) == 2 * turns
        await reopened.close()


async def test_writing_the_log_ahead_that_fails_leaves_the_commit_to_sqlite(
        tmp_path, monkeypatch, caplog):
    """A full disk (or any error) writing the log ahead fails nothing: the commit is
    SQLite's, as without it, and the store says why at debug level."""
    import errno
    import logging

    from cogency import Agent
    from cogency.testing import ScriptedLLM

    def no_space(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", no_space)  # (SQLite's own writes are not Python's)
    path = tmp_path / "t.db"
    store = SQLiteStore(path, synchronous="full")
    with caplog.at_level(logging.DEBUG, logger="cogency.storage"):
        async with Agent(ScriptedLLM([{"response": "hi"}] * 3), store=store) as agent:
            conversation = None
            for _ in range(3):
                result = await agent.run("hello", "alice", conversation)
                assert result.response == "hi"
                conversation = result.conversation_id
            held, _ = await store._run(lambda db: store._log_state())
            assert Path(f"{path}-wal").stat().st_size == 32 + held  # nothing written ahead
    await store.close()
    assert "writing the log of" in caplog.text and "No space left" in caplog.text
    assert rows(path, "SELECT count(*) FROM conversation_messages") == [(6,)]

    # Where os.pwrite is missing (Windows), nothing is written ahead, and nothing fails.
    monkeypatch.delattr(os, "pwrite")
    store = SQLiteStore(tmp_path / "w.db", synchronous="full")
    async with Agent(ScriptedLLM([{"response": "hi"}]), store=store) as agent:
        assert (await agent.run("hello", "alice")).response == "hi"
        held, _ = await store._run(lambda db: store._log_state())
        assert store._log_zeros is None
        assert Path(f"{tmp_path / 'w.db'}-wal").stat().st_size == 32 + held
    await store.close()


async def test_a_checkpoint_never_waits_for_a_reader_and_empties_the_log_once_it_can(
        tmp_path, monkeypatch):
    """Another connection reading an older snapshot keeps the log from being emptied: the
    worker's checkpoint copies what it can and returns at once (it never waits on the busy
    timeout, nor fails the call it followed); a later one, with the reader gone, empties it,
    and the log file, grown meanwhile, is cut back to ``LOG_FILE_LIMIT`` as it starts over."""
    from cogency import Agent
    from cogency.storage import sqlite as backend
    from cogency.testing import ScriptedLLM

    monkeypatch.setattr(backend, "LOG_FILE_LIMIT", 128 * 1024)
    path = tmp_path / "t.db"
    log = path.with_name(path.name + "-wal")
    store = SQLiteStore(path)
    text = "x" * 20_000
    async with Agent(ScriptedLLM([{"response": text}] * 20), store=store) as agent:
        # No checkpoint before the reader's snapshot: one of a log all copied to the file
        # would read the file alone, and would not keep the log from being emptied.
        conversation = (await agent.run(text, "alice")).conversation_id
        assert store._checkpointing is None and log.stat().st_size > 0
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM conversation_messages").fetchone()  # a snapshot
        monkeypatch.setattr(backend, "CHECKPOINT_BYTES", 64 * 1024)
        monkeypatch.setattr(backend, "LOG_MOST_BYTES", 256 * 1024)
        try:
            while store._checkpointing is None:  # the copier copied what it could: the worker
                await agent.run(text, "alice", conversation)
            await asyncio.wait_for(store._checkpointing, 5)  # the busy timeout is 10 s
            kept = await store._run(lambda db: store._log_state()[0])
            assert kept >= backend.CHECKPOINT_BYTES  # the reader kept it
            assert log.stat().st_size >= kept
        finally:
            reader.execute("COMMIT")
            reader.close()
        await _copier_idle(store)
        await store._hand(lambda db: None, checkpoint=True)  # the reader gone: the next one
        monkeypatch.undo()  # no checkpoint in the next turn
        size = log.stat().st_size
        await agent.run("again", "alice", conversation)
        # All copied: the next commit started the log over, its file cut back.
        assert 0 < await store._run(lambda db: store._log_state()[0]) < size / 2
        assert log.stat().st_size <= 128 * 1024 < size
        assert [m["content"] for m in await store.load_messages(conversation, "alice")][-1] \
            == text
    await store.close()


async def test_the_windows_cache_keeps_nothing_of_conversations_it_evicted(tmp_path):
    """A long-running store sees many conversations: what it keeps of each (the window and
    the rows its last commit wrote for it) goes when the conversation leaves the cache."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    store = SQLiteStore(tmp_path / "t.db")
    cached = store._windows.size
    async with Agent(ScriptedLLM([{"response": "ok"}] * (cached + 10)), store=store) as agent:
        ids = [(await agent.run(f"hello {n}", "alice")).conversation_id
               for n in range(cached + 10)]
    assert len(store._windows._entries) == cached
    assert set(store._windows._tails) <= set(store._windows._entries)
    assert ids[0] not in store._windows._tails  # evicted long ago, with its tail
    await store.close()


async def test_reopening_applies_no_migration_twice_and_keeps_data(db_path, db):
    first = SQLiteStore(db_path)
    state = await State.start_task("q", "alice", store=first)
    add_message(state, "user", "kept")
    await autosave(state)
    await first.close()
    applied = db.execute("SELECT name, applied_at FROM schema_migrations ORDER BY name").fetchall()

    second = SQLiteStore(db_path)
    try:
        resumed = await State.continue_task(state.task_id, "alice", store=second)
        assert [m["content"] for m in resumed.execution.messages] == ["kept"]
    finally:
        await second.close()
    assert db.execute(
        "SELECT name, applied_at FROM schema_migrations ORDER BY name"
    ).fetchall() == applied
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []


# -- migration from the seeds' v3.0 schema -------------------------------------------------

SEED_V3_SCHEMA = """
CREATE TABLE user_profiles (
    user_id TEXT PRIMARY KEY,
    profile_data TEXT NOT NULL,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    conversation_data TEXT NOT NULL,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (user_id) REFERENCES user_profiles(user_id)
);
CREATE TABLE task_workspaces (
    task_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    workspace_data TEXT NOT NULL,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (user_id) REFERENCES user_profiles(user_id)
);
"""

SEED_MESSAGES = [
    {"role": "user", "content": "What is AI?", "timestamp": "2025-01-10T09:00:00.123456"},
    {"role": "assistant", "content": "AI is artificial intelligence...",
     "timestamp": "2025-01-10T09:00:05"},
    {"role": "user", "content": "Tell me more", "timestamp": "2025-01-10T09:01:00"},
]


def make_seed_database(path: Path, *, profile_for: tuple[str, ...] = ("alice",)) -> None:
    """A file as the v3.0 seed code wrote it: messages as a JSON list, no schema table."""
    connection = sqlite3.connect(path)
    connection.executescript(SEED_V3_SCHEMA)
    for user in profile_for:
        connection.execute(
            "INSERT INTO user_profiles (user_id, profile_data) VALUES (?, ?)",
            (user, json.dumps({
                "user_id": user, "preferences": {"tone": "casual"}, "goals": ["learn ML"],
                "expertise_areas": ["python"], "communication_style": "brief",
                "projects": {"site": "a blog"}, "created_at": "2025-01-01T10:00:00",
                "last_updated": "2025-01-10T09:00:00",
            })),
        )
    connection.execute(
        "INSERT INTO conversations (conversation_id, user_id, conversation_data) VALUES (?, ?, ?)",
        ("conv-seed", "alice", json.dumps({
            "conversation_id": "conv-seed", "user_id": "alice", "messages": SEED_MESSAGES,
            "last_updated": "2025-01-10T09:01:00",
        })),
    )
    connection.execute(
        "INSERT INTO conversations (conversation_id, user_id, conversation_data) VALUES (?, ?, ?)",
        ("conv-empty", "alice", json.dumps({
            "conversation_id": "conv-empty", "user_id": "alice", "messages": [],
            "last_updated": "2025-01-10T09:01:00",
        })),
    )
    connection.execute(
        "INSERT INTO task_workspaces (task_id, user_id, workspace_data) VALUES (?, ?, ?)",
        ("task-seed", "alice", json.dumps({
            "objective": "analyze codebase", "assessment": "medium size", "approach": "top down",
            "observations": ["uses asyncio"], "insights": [], "facts": {"files": 12},
            "thoughts": [{"step": 1}],
        })),
    )
    connection.commit()
    connection.close()


async def test_a_seed_v3_database_is_migrated_and_usable(db_path, db):
    make_seed_database(db_path)
    store = SQLiteStore(db_path)
    try:
        resumed = await State.continue_task("task-seed", "alice", store=store)
        # Rows after migration: every step recorded, messages moved out of the JSON blob.
        assert [r[0] for r in db.execute(
            "SELECT name FROM schema_migrations ORDER BY name")] == list(MIGRATION_NAMES)
        assert db.execute(
            "SELECT seq, role, content, created_at FROM conversation_messages "
            "WHERE conversation_id = 'conv-seed' ORDER BY seq"
        ).fetchall() == [
            (i + 1, m["role"], m["content"], m["timestamp"]) for i, m in enumerate(SEED_MESSAGES)
        ]
        count, data = db.execute(
            "SELECT message_count, conversation_data FROM conversations "
            "WHERE conversation_id = 'conv-seed'"
        ).fetchone()
        assert count == 3
        assert "messages" not in json.loads(data)
        assert "messages" not in json.loads(db.execute(
            "SELECT conversation_data FROM conversations WHERE conversation_id = 'conv-empty'"
        ).fetchone()[0])
        # The seed workspace got a conversation of its own and a version.
        conversation_id, version = db.execute(
            "SELECT conversation_id, version FROM task_workspaces WHERE task_id = 'task-seed'"
        ).fetchone()
        assert version == 1 and conversation_id
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []

        # The seed workspace continues: its v5.0 fields are kept, superseded ones ignored.
        assert resumed.workspace.objective == "analyze codebase"
        assert resumed.workspace.approach == "top down"
        assert resumed.conversation.conversation_id == conversation_id
        resumed.workspace.discoveries = "12 files"
        add_message(resumed, "assistant", "continuing the seed task")
        await autosave(resumed)
        assert db.execute(
            "SELECT version FROM task_workspaces WHERE task_id = 'task-seed'"
        ).fetchone() == (2,)
        await resumed.complete_task()
        assert db.execute("SELECT task_id FROM task_workspaces").fetchall() == []

        # The seed conversation continues with its whole history, appending after it.
        state = await State.start_task("And deep learning?", "alice", "conv-seed", store=store)
        assert [(m["role"], m["content"]) for m in state.execution.messages] == [
            (m["role"], m["content"]) for m in SEED_MESSAGES
        ]
        add_message(state, "user", "And deep learning?")
        await autosave(state)
        assert db.execute(
            "SELECT max(seq), count(*) FROM conversation_messages WHERE conversation_id = 'conv-seed'"
        ).fetchone() == (4, 4)

        # The seed profile reads with its v1.0 fields; new fields take their defaults.
        profile = await store.load_profile("alice")
        assert profile.goals == ["learn ML"] and profile.projects == {"site": "a blog"}
        assert profile.created_at.tzinfo is not None and profile.interaction_count == 0
        assert "learn ML" in await Memory(store=store).activate("alice")
    finally:
        await store.close()


async def test_a_seed_database_with_rows_of_users_without_a_profile_migrates(db_path, db):
    # The seeds never enforced foreign keys: a conversation or workspace could name a user
    # with no profile row. Migration must not trip over enforced keys on such a file.
    make_seed_database(db_path, profile_for=())
    store = SQLiteStore(db_path)
    try:
        resumed = await State.continue_task("task-seed", "alice", store=store)
        assert resumed.workspace.objective == "analyze codebase"
        assert db.execute("SELECT user_id FROM user_profiles").fetchall() == [("alice",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert await Memory(store=store).activate("alice") == ""
    finally:
        await store.close()


async def test_a_corrupt_seed_conversation_stops_migration_and_changes_nothing(db_path, db):
    make_seed_database(db_path)
    db.execute("UPDATE conversations SET conversation_data = '{\"messages\": [' "
               "WHERE conversation_id = 'conv-seed'")
    db.commit()
    store = SQLiteStore(db_path)
    try:
        with pytest.raises(CorruptDataError, match="conv-seed"):
            await store.list_tasks()
    finally:
        await store.close()
    # The migration ran in one transaction: the file is still a plain seed database.
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "conversation_messages" not in tables
    assert [r[1] for r in db.execute("PRAGMA table_info(task_workspaces)")] == [
        "task_id", "user_id", "workspace_data", "updated_at",
    ]


async def test_a_database_from_a_newer_cogency_is_refused(db_path, db):
    store = SQLiteStore(db_path)
    await State.start_task("q", "alice", store=store)
    await store.close()
    db.execute("INSERT INTO schema_migrations VALUES ('m999_from_the_future', '2030-01-01')")
    db.commit()

    newer = SQLiteStore(db_path)
    try:
        with pytest.raises(SchemaTooNewError, match="(?s)m999_from_the_future.*upgrade"):
            await State.start_task("q", "alice", store=newer)
        with pytest.raises(SchemaTooNewError):  # every call, not only the first
            await newer.list_tasks()
    finally:
        await newer.close()
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (1,)


# -- locations and URLs --------------------------------------------------------------------


async def test_default_location_is_under_the_data_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("COGENCY_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "cogency" / "cogency.db"
    assert default_db_path() == expected
    store = open_store()
    assert isinstance(store, SQLiteStore) and Path(store.path) == expected
    assert not expected.parent.exists()  # nothing is created before first use
    await store.close()

    state = await State.start_task("q", "alice")  # store=None: the default store
    add_message(state, "user", "stored by default")
    await state.complete_task()
    assert expected.exists()
    assert rows(expected, "SELECT content FROM conversation_messages") == [("stored by default",)]


async def test_cogency_db_overrides_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("COGENCY_DB", str(tmp_path / "chosen.db"))
    state = await State.start_task("q", "alice")
    await state.complete_task()
    assert rows(tmp_path / "chosen.db", "SELECT user_id FROM user_profiles") == [("alice",)]
    assert not (tmp_path / "xdg").exists()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COGENCY_DB", "sqlite:///from-url.db")
    store = open_store()
    assert store.path == "from-url.db"
    await store.list_tasks()
    await store.close()
    assert (tmp_path / "from-url.db").exists()


async def test_open_store_url_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()  # a store makes its file, not a missing directory
    relative = open_store("sqlite:///sub/rel.db")
    absolute = open_store(f"sqlite:///{tmp_path}/abs.db")  # sqlite:////tmp/... : four slashes
    plain = open_store(tmp_path / "plain.db")
    memory = open_store("sqlite://:memory:")
    try:
        assert relative.path == "sub/rel.db"
        assert absolute.path == f"{tmp_path}/abs.db"
        assert f"sqlite:///{tmp_path}".startswith("sqlite:////")
        for store in (relative, absolute, plain, memory):
            await State.start_task("q", "alice", store=store)
        assert rows(tmp_path / "sub" / "rel.db", "SELECT user_id FROM user_profiles") == [
            ("alice",)
        ]
        assert rows(tmp_path / "abs.db", "SELECT user_id FROM user_profiles") == [("alice",)]
        assert (tmp_path / "plain.db").exists()
        assert await memory.list_tasks("alice") != []
    finally:
        for store in (relative, absolute, plain, memory):
            await store.close()

    for bad in ("mysql://localhost/db", "sqlite://host/file.db", "sqlite:relative.db", "",
                "   "):
        with pytest.raises(UsageError):
            open_store(bad)


async def test_a_path_that_cannot_be_created_is_a_storage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = SQLiteStore(blocker / "sub" / "cogency.db", create_dirs=True)
    with pytest.raises(StorageError, match="COGENCY_DB"):
        await State.start_task("q", "alice", store=store)
    await store.close()
    store = SQLiteStore(blocker / "sub" / "cogency.db")  # missing directories are not made
    with pytest.raises(StorageError, match="there is no directory .*create it first"):
        await State.start_task("q", "alice", store=store)
    await store.close()

    directory = SQLiteStore(tmp_path)  # a directory is not a database file
    with pytest.raises(StorageError, match="cannot open"):
        await directory.list_tasks()
    await directory.close()

    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("hello " * 1000)
    store = SQLiteStore(not_a_db)
    with pytest.raises(StorageError, match="not a usable SQLite database"):
        await store.list_tasks()
    await store.close()
    assert not_a_db.read_text() == "hello " * 1000


async def test_a_closed_store_says_so(db_path):
    store = SQLiteStore(db_path)
    await store.list_tasks()
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(UsageError, match="closed"):
        await store.list_tasks()


# -- locking and concurrent writers ------------------------------------------------------------


async def test_a_locked_database_is_store_unavailable(db_path, db):
    store = SQLiteStore(db_path, busy_timeout=0.2)
    try:
        state = await State.start_task("q", "alice", store=store)
        db.isolation_level = None
        db.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        db.execute("UPDATE user_profiles SET updated_at = updated_at")
        add_message(state, "user", "waiting")
        with pytest.raises(StoreUnavailableError, match="locked"):
            await autosave(state)
        with pytest.raises(StoreUnavailableError):
            await State.start_task("q2", "alice", store=store)
        # Reads still work under WAL while a writer holds the lock.
        assert len(await store.list_tasks("alice")) == 1
        db.execute("COMMIT")

        await autosave(state)  # the same save succeeds once the lock is gone
        assert db.execute("SELECT content FROM conversation_messages").fetchall() == [
            ("waiting",)
        ]
    finally:
        await store.close()


async def test_a_lock_held_while_opening_is_store_unavailable(db_path, db):
    db.isolation_level = None
    db.execute("BEGIN IMMEDIATE")
    db.execute("CREATE TABLE holder (x)")
    store = SQLiteStore(db_path, busy_timeout=0.1)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.list_tasks()
        db.execute("ROLLBACK")
        assert await store.list_tasks() == []  # opens and migrates once the lock is gone
    finally:
        await store.close()


async def test_two_store_objects_on_one_file(db_path, db):
    one, two = SQLiteStore(db_path), SQLiteStore(db_path)
    try:
        root = await State.start_task("root", "alice", store=one)
        conversation_id = root.conversation.conversation_id

        async def task(store: SQLiteStore, n: int) -> None:
            state = await State.start_task(f"t{n}", "alice", conversation_id, store=store)
            for k in range(4):
                add_message(state, "assistant", f"{n}:{k}")
                await autosave(state)
            await state.complete_task()

        await asyncio.gather(*(task(one if n % 2 else two, n) for n in range(10)))

        # A stale save through the other connection still conflicts.
        a = await State.continue_task(root.task_id, "alice", store=one)
        b = await State.continue_task(root.task_id, "alice", store=two)
        a.workspace.approach = "a"
        await autosave(a)
        b.workspace.approach = "b"
        with pytest.raises(ConflictError):
            await autosave(b)
    finally:
        await one.close()
        await two.close()
    assert [r[0] for r in db.execute(
        "SELECT seq FROM conversation_messages ORDER BY seq")] == list(range(1, 41))
    assert db.execute("SELECT message_count FROM conversations").fetchone() == (40,)
    assert db.execute("SELECT workspace_data FROM task_workspaces").fetchone()[0].count('"a"') == 1


WRITER = textwrap.dedent(
    """
    import asyncio, os, sys
    from cogency.storage import SQLiteStore
    from cogency.state import State, add_message, autosave

    written = []  # what the store writes ahead of the log (os.pwrite: nothing else here)
    pwrite = os.pwrite
    os.pwrite = lambda fd, data, offset: written.append(len(data)) or pwrite(fd, data, offset)

    async def main(path, conversation_id, tag, count, synchronous, filler):
        store = SQLiteStore(path, synchronous=synchronous)
        state = await State.start_task(tag, "alice", conversation_id, store=store)
        for k in range(count):
            add_message(state, "user", f"{tag}:{k}" + (" " + "x" * filler if filler else ""))
            await autosave(state)
        await state.complete_task()
        await store.close()
        print(len(written))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5],
                     int(sys.argv[6])))
    """
)


@pytest.mark.parametrize("synchronous, filler", [("normal", 0), ("full", 6000)])
async def test_several_processes_create_and_append_to_one_conversation(
        db_path, db, synchronous, filler):
    # The file does not exist yet: the processes race to create and migrate it, then to
    # create the conversation, then append with interleaved transactions. At "full", they
    # write the log ahead in their own transactions (messages of 6 KB: several growths of
    # the log, counted): every frame of each is read back.
    conversation_id = "shared-conversation"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db_path), conversation_id, f"p{n}", "15",
             synchronous, str(filler)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for n in range(3)
    ]
    growths = []  # each process's writes ahead of the log
    for writer in writers:
        out, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err.decode()
        growths.append(int(out))
    # (Which of them writes ahead depends on who reaches the end of what is written first.)
    assert sum(growths) >= 4 if synchronous == "full" else not any(growths), growths

    seq_rows = db.execute(
        "SELECT seq, content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    ).fetchall()
    assert [s for s, _ in seq_rows] == list(range(1, 46))
    assert all(len(c.split(" ", 1)[-1]) == filler for _, c in seq_rows if filler)
    seq_rows = [(s, c.split(" ", 1)[0]) for s, c in seq_rows]
    assert sorted(c for _, c in seq_rows) == sorted(
        f"p{n}:{k}" for n in range(3) for k in range(15)
    )
    for n in range(3):
        mine = [c for _, c in seq_rows if c.startswith(f"p{n}:")]
        assert mine == [f"p{n}:{k}" for k in range(15)]
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute(
        "SELECT message_count FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone() == (45,)
    assert db.execute("SELECT count(*) FROM conversations").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM schema_migrations").fetchone() == (
        len(MIGRATION_NAMES),
    )
    assert db.execute("SELECT task_id FROM task_workspaces").fetchall() == []


def test_a_store_never_closed_does_not_keep_its_process_from_exiting(tmp_path):
    # The store's worker thread has run a job (a flushing write goes there) and waits for
    # the next: a program that forgets close() still ends, with what it committed stored.
    script = textwrap.dedent("""
        import asyncio, sys
        from cogency import Agent
        from cogency.storage import SQLiteStore
        from cogency.testing import ScriptedLLM

        async def main():
            store = SQLiteStore(sys.argv[1], synchronous="full")
            await Agent(ScriptedLLM([{"response": "kept"}]), store=store).run("hi", "ann")
            assert store._worker is not None  # the worker thread was started
        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "t.db")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert rows(tmp_path / "t.db", "SELECT content FROM conversation_messages "
                "WHERE role = 'assistant'") == [("kept",)]


def test_a_store_outlives_the_event_loop_of_a_job_it_ran(tmp_path):
    # A job handed from one event loop that closed before hearing its outcome: the worker
    # goes on serving the next loop (asyncio.run twice, as scripts and tests do).
    store = SQLiteStore(tmp_path / "t.db")
    loop_closed = threading.Event()

    async def hand_and_leave() -> None:
        store._hand(lambda db: loop_closed.wait(30))  # runs on past its loop's end

    async def use() -> list[tuple]:
        return await store._hand(lambda db: db.execute("SELECT 2").fetchall())

    asyncio.run(hand_and_leave())
    loop_closed.set()
    assert asyncio.run(asyncio.wait_for(use(), 30)) == [(2,)]
    asyncio.run(store.close())


async def test_stored_times_are_the_iso_text_datetime_writes(tmp_path, monkeypatch):
    """Every time a turn stores (a message's, the conversation's, a held task's lease end) is
    the ISO text ``datetime.isoformat`` writes for that moment in UTC, made without a
    datetime: it reads back to the same text, and it is now (the lease: now plus the lease)."""
    from datetime import datetime, timedelta, timezone

    from cogency import Agent, _time
    from cogency.testing import ScriptedLLM

    path = tmp_path / "t.db"
    store = SQLiteStore(path, lease=90)
    began = datetime.now(timezone.utc)
    try:
        async with Agent(ScriptedLLM([{"response": "one"}]), store=store) as agent:
            conversation = (await agent.run("hello", "alice")).conversation_id
        held = await State.start_task("later", "alice", conversation, store, runner="worker-1")
        stamps = [text for (text,) in rows(path, "SELECT created_at FROM conversation_messages")]
        stamps += [text for (text,) in rows(path, "SELECT updated_at FROM conversations")]
        (lease_until,) = rows(path, "SELECT lease_until FROM task_workspaces WHERE task_id = ?",
                              held.task_id)[0]
    finally:
        await store.close()
    ended = datetime.now(timezone.utc)
    assert len(stamps) == 3
    for text in [*stamps, lease_until]:
        moment = datetime.fromisoformat(text)
        assert moment.isoformat() == text and moment.utcoffset() == timedelta(0)
    assert all(began <= datetime.fromisoformat(text) <= ended for text in stamps)
    lease_end = datetime.fromisoformat(lease_until) - timedelta(seconds=90)
    assert began <= lease_end <= ended
    # On the second, isoformat leaves the microseconds out; so does the store.
    monkeypatch.setattr(_time.time, "time_ns", lambda: 1_800_000_000 * 10**9)
    on_the_second = datetime.fromtimestamp(1_800_000_000, timezone.utc)
    assert _time.stamp() == on_the_second.isoformat() == "2027-01-15T08:00:00+00:00"
    assert _time.stamp(0.25) == (on_the_second + timedelta(seconds=0.25)).isoformat()


def test_an_agent_and_its_store_are_cheap_to_build():
    """Building an agent with a tool and a SQLite store allocates at most 5.56 KiB at its peak
    (median of 5; the benchmark's goal: no more than the leanest peer, Agno). A store with a
    dict of its 31 attributes cost ~1.6 KB more than its slots: past 30, a dict stops sharing
    its keys with the class's other instances."""
    import gc
    import tracemalloc

    from cogency import Agent, tool
    from cogency.testing import ScriptedLLM

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    def build() -> Agent:
        return Agent(ScriptedLLM([{"response": "built"}]), tools=[lookup],
                     store=SQLiteStore(":memory:"))

    build()  # the first build fills the caches every later one shares
    gc.collect()
    tracemalloc.start()
    try:
        peaks = []
        for _ in range(5):
            gc.collect()
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            agent = build()
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert sorted(peaks)[2] <= 5_693, peaks

    async def answer() -> None:  # what was built works, its store included
        async with agent:
            result = await agent.run("hello", user_id="alice")
            assert result.response == "built"
            assert [m["content"] for m in await agent.store.load_messages(
                result.conversation_id, "alice")] == ["hello", "built"]

    asyncio.run(answer())
