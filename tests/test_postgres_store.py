"""PostgresStore beyond the shared contract: opening, migrations, leases, failures that lose nothing.

Each test gets its own database (tests/pgutil.py) and checks the rows PostgreSQL holds.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pgutil
import pytest

from cogency.errors import (
    NotFoundError,
    SchemaTooNewError,
    StoreUnavailableError,
    TaskRunningError,
)
from cogency.memory import Profile
from cogency.state import State, add_message, autosave
from cogency.storage import PostgresStore, SQLiteStore, open_store
from cogency.storage.base import MIGRATION_NAMES, new_runner


# -- opening --------------------------------------------------------------------------------


async def test_open_store_connects_lazily_and_names_an_unreachable_server_without_password():
    store = open_store("postgresql://cogency:s3cret-pw@127.0.0.1:1/agents")
    assert isinstance(store, PostgresStore)  # returned at once: nothing connected yet
    assert "s3cret" not in repr(store)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.list_tasks()
    message = str(caught.value)
    assert "127.0.0.1:1" in message and "agents" in message and "running" in message
    assert "s3cret" not in message
    # Still not usable, still clear, on the next call; closing is safe.
    with pytest.raises(StoreUnavailableError):
        await store.load_profile("alice")
    await store.close()


async def test_a_missing_database_says_to_create_it():
    await pgutil.admin_connect()  # skips outside CI when the server is down
    store = PostgresStore(pgutil.dsn_for("cogency_no_such_database"))
    with pytest.raises(StoreUnavailableError, match="does not exist.*createdb"):
        await store.list_tasks()
    await store.close()


# -- schema ---------------------------------------------------------------------------------


async def test_schema_has_sqlites_tables_columns_and_migration_names(observer, tmp_path: Path):
    names = [r[0] for r in await observer.fetch("SELECT name FROM schema_migrations ORDER BY 1")]
    assert names == sorted(MIGRATION_NAMES)
    sqlite_store = SQLiteStore(tmp_path / "ref.db")
    await sqlite_store.list_tasks()
    await sqlite_store.close()
    reference = sqlite3.connect(tmp_path / "ref.db")
    for table in ("user_profiles", "conversations", "task_workspaces", "conversation_messages",
                  "schema_migrations"):
        pg_columns = {
            r[0] for r in await observer.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
            )
        }
        sqlite_columns = {r[1] for r in reference.execute(f"PRAGMA table_info({table})")}
        assert pg_columns == sqlite_columns, table
    reference.close()


async def test_a_schema_step_from_a_newer_cogency_refuses_to_open(pg, observer):
    await observer.execute("INSERT INTO schema_migrations VALUES ('m999_future', 'later')")
    other = PostgresStore(pg.dsn)
    with pytest.raises(SchemaTooNewError, match="m999_future.*upgrade"):
        await other.list_tasks()
    await other.close()


async def test_concurrent_first_opens_migrate_once():
    async with pgutil.fresh_database() as dsn:
        stores = [PostgresStore(dsn, max_size=2) for _ in range(6)]
        try:
            await asyncio.gather(*(s.list_tasks() for s in stores))
            rows = await pgutil.raw_rows(stores[0])("SELECT name FROM schema_migrations")
            assert sorted(r[0] for r in rows) == sorted(MIGRATION_NAMES)
        finally:
            for store in stores:
                await store.close()


async def test_a_seed_era_database_is_migrated_with_its_messages():
    async with pgutil.fresh_database() as dsn:
        seed = await pgutil.connect(dsn)
        await seed.execute(
            """
            CREATE TABLE user_profiles (user_id TEXT PRIMARY KEY, profile_data TEXT NOT NULL,
                updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);
            CREATE TABLE conversations (conversation_id TEXT PRIMARY KEY, user_id TEXT NOT NULL,
                conversation_data TEXT NOT NULL, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);
            CREATE TABLE task_workspaces (task_id TEXT PRIMARY KEY, user_id TEXT NOT NULL,
                workspace_data TEXT NOT NULL, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);
            INSERT INTO user_profiles (user_id, profile_data) VALUES ('ann', '{"goals": ["x"]}');
            INSERT INTO conversations (conversation_id, user_id, conversation_data) VALUES
                ('c1', 'ann', '{"conversation_id": "c1", "user_id": "ann", "messages":
                  [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}');
            INSERT INTO task_workspaces (task_id, user_id, workspace_data) VALUES
                ('t1', 'ann', '{"objective": "old task"}');
            """
        )
        await seed.close()
        store = PostgresStore(dsn)
        try:
            messages = await store.load_messages("c1", "ann")
            assert [(m["seq"], m["role"], m["content"]) for m in messages] == [
                (1, "user", "hi"), (2, "assistant", "hello"),
            ]
            assert (await store.load_conversation("c1", "ann")).message_count == 2
            state = await State.continue_task("t1", "ann", store=store)
            assert state.workspace.objective == "old task"
            assert state.conversation.conversation_id == "migrated-t1"
            assert (await store.load_profile("ann")).goals == ["x"]
            rows = await pgutil.raw_rows(store)("SELECT name FROM schema_migrations")
            assert sorted(r[0] for r in rows) == sorted(MIGRATION_NAMES)
        finally:
            await store.close()


# -- task leases ----------------------------------------------------------------------------


async def test_a_task_is_held_by_one_store_until_released_or_closed(pg, observer):
    state = await State.start_task("q", "alice", store=pg)
    first, second = new_runner(), new_runner()
    other = PostgresStore(pg.dsn)
    try:
        await pg.claim_task(state.task_id, "alice", first)
        row = await observer.fetchrow("SELECT runner, lease_until > now() FROM task_workspaces")
        assert tuple(row) == (first, True)  # a lease as a row: no session holds it
        with pytest.raises(TaskRunningError, match="is running"):
            await other.claim_task(state.task_id, "alice", second)
        with pytest.raises(TaskRunningError, match="is running"):
            await pg.claim_task(state.task_id, "alice", second)  # same store, other runner
        with pytest.raises(NotFoundError):
            await other.claim_task(state.task_id, "bob", second)  # reveals nothing to bob
        await pg.release_task(state.task_id, first)
        assert await observer.fetchval("SELECT runner FROM task_workspaces") is None
        await other.claim_task(state.task_id, "alice", second)
        with pytest.raises(TaskRunningError):
            await pg.claim_task(state.task_id, "alice", first)
        await other.close()  # a store that closes lets go of what it holds
        await pg.claim_task(state.task_id, "alice", first)
        assert await observer.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND d.datname = current_database()") == 0
    finally:
        await other.close()


async def test_no_session_holds_a_run_killing_every_connection_loses_nothing(pg, observer):
    """Holds and leases are rows, renewed by statements: when every server connection of
    the store is terminated (a failover, a pooler restart) the run goes on, its task and its
    conversation stay held against every other runner, and its writes land."""
    from cogency import Agent, tool
    from cogency.errors import ConversationBusyError
    from cogency.testing import ScriptedLLM

    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait until released."""
        entered.set()
        await release.wait()
        return "slow done"

    await pg.hold_conversation("c", "alice", holder := new_runner())
    agent = Agent(llm=ScriptedLLM([{"actions": [{"name": "slow", "args": {}}]},
                                   {"response": "finished"}]), tools=[slow], store=pg)
    running = asyncio.create_task(agent.run("q", "alice", "c"))
    other = PostgresStore(pg.dsn)
    try:
        await asyncio.wait_for(entered.wait(), 10)
        killed = await observer.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert killed >= 1
        [(task_id,)] = await observer.fetch("SELECT task_id FROM task_workspaces")
        with pytest.raises(TaskRunningError):
            await other.claim_task(task_id, "alice", new_runner())
        with pytest.raises(ConversationBusyError):
            await other.hold_conversation("c", "alice", new_runner())
        release.set()
        result = await running
    finally:
        release.set()
        await other.close()
    assert (result.stop_reason, result.response) == ("completed", "finished")
    rows = await observer.fetch("SELECT role FROM conversation_messages ORDER BY seq")
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant"]
    await pg.release_conversation("c", holder)
    assert await observer.fetchval("SELECT runner FROM conversation_runs") is None


async def test_a_store_never_opens_more_than_its_pool(observer):
    """Runs, their leases' renewals and conversation holds all share the store's pool: no
    lease connection or other session besides it."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    async with pgutil.fresh_store(max_size=3, lease=0.3) as store:
        seen: list[int] = []
        done = asyncio.Event()

        async def sample() -> None:
            probe = await pgutil.connect(store.dsn)
            try:
                while not done.is_set():
                    seen.append(await probe.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid()"))
                    await asyncio.sleep(0.01)
            finally:
                await probe.close()

        async def one(n: int) -> None:
            await store.hold_conversation(f"c{n}", "alice", runner := new_runner())
            llm = ScriptedLLM([{"response": f"a{n}"}], delay=0.2)  # past a renewal
            await Agent(llm=llm, store=store).run(f"q{n}", "alice", f"c{n}")
            await store.release_conversation(f"c{n}", runner)

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(one(n) for n in range(8)))
        done.set()
        await sampler
    assert seen and max(seen) <= 3, max(seen)


# -- failures that lose nothing ---------------------------------------------------------------


async def test_pool_exhaustion_is_a_clear_error_and_loses_nothing(observer):
    async with pgutil.fresh_store(max_size=1, acquire_timeout=0.3) as small:
        await small.update_profile("alice", lambda p: p.goals.append("first"))
        holder = await pgutil.connect(small.dsn)
        try:
            # Another process holds alice's row, so the store's only connection waits for it.
            blocker = holder.transaction()
            await blocker.start()
            await holder.execute("SELECT 1 FROM user_profiles WHERE user_id = 'alice' FOR UPDATE")
            waiting = asyncio.create_task(
                small.update_profile("alice", lambda p: p.goals.append("second"))
            )
            await pgutil.wait_for_blocked_backend(holder)
            with pytest.raises(StoreUnavailableError) as caught:
                await small.load_profile("alice")
            assert "all 1 connections of the pool are in use" in str(caught.value)
            assert "max_size" in str(caught.value)
            await blocker.rollback()
            updated = await waiting
        finally:
            await holder.close()
        assert updated.goals == ["first", "second"]
        assert (await small.load_profile("alice")).goals == ["first", "second"]


async def _save_with_blocked_profile(pg: PostgresStore, observer: Any, kills: int):
    """An autosave that writes messages, the workspace and a profile, while another session
    holds the profile row; its connection is terminated ``kills`` times mid-transaction."""
    state = await State.start_task("q", "alice", store=pg)
    add_message(state, "user", "must be stored exactly once")
    add_message(state, "assistant", "me too")
    state.workspace.update({"discoveries": "saved with the messages"})
    profile = Profile("alice", goals=["learned"])
    holder = await pgutil.connect(pg.dsn)
    blocker = holder.transaction()
    await blocker.start()
    await holder.execute("SELECT 1 FROM user_profiles WHERE user_id = 'alice' FOR UPDATE")
    saving = asyncio.create_task(autosave(state, profile))
    killed: set[int] = set()
    for _ in range(kills):
        # The save has appended its messages and now waits for the profile row: kill it there.
        pid = await pgutil.wait_for_blocked_backend(observer, exclude=killed)
        assert await observer.fetchval("SELECT pg_terminate_backend($1)", pid)
        killed.add(pid)
        if saving.done():
            break
    return state, profile, saving, holder, blocker, killed


async def test_a_connection_dropped_mid_save_is_rolled_back_and_retried(pg, observer):
    state, profile, saving, holder, blocker, killed = await _save_with_blocked_profile(
        pg, observer, 1
    )
    try:
        await pgutil.wait_for_blocked_backend(observer, exclude=killed)  # the retry waits again
        await blocker.rollback()
        await saving  # the retry on a new connection succeeded
    finally:
        await holder.close()
    rows = await observer.fetch("SELECT seq, content FROM conversation_messages ORDER BY seq")
    assert [(r[0], r[1]) for r in rows] == [(1, "must be stored exactly once"), (2, "me too")]
    assert await observer.fetchval("SELECT message_count FROM conversations") == 2
    assert await observer.fetchval("SELECT version FROM task_workspaces") == 2
    assert (await pg.load_profile("alice")).goals == ["learned"]
    assert state.conversation.unsaved == []


async def test_a_connection_dropped_twice_mid_save_raises_and_stores_nothing(pg, observer):
    state, profile, saving, holder, blocker, _ = await _save_with_blocked_profile(
        pg, observer, 2
    )
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await saving
        # A save that writes a profile is one transaction (the profile goes through its
        # entries): lost twice before its COMMIT (it was retried once on a new connection),
        # so it is known to be rolled back.
        assert "was lost" in str(caught.value)
        assert "rolled back, so nothing of it was stored" in str(caught.value)
        # Rolled back (it was waiting on a lock): none of the batch is in the database.
        assert await observer.fetch("SELECT seq FROM conversation_messages") == []
        assert await observer.fetchval("SELECT message_count FROM conversations") == 0
        assert await observer.fetchval("SELECT version FROM task_workspaces") == 1
        await blocker.rollback()
    finally:
        await holder.close()
    # Nothing was lost either: the same state saves it all on the next try.
    assert len(state.conversation.unsaved) == 2
    await autosave(state, profile)
    rows = await observer.fetch("SELECT seq, content FROM conversation_messages ORDER BY seq")
    assert [(r[0], r[1]) for r in rows] == [(1, "must be stored exactly once"), (2, "me too")]
    assert await observer.fetchval("SELECT version FROM task_workspaces") == 2
    assert (await pg.load_profile("alice")).goals == ["learned"]


async def test_idle_connections_killed_by_a_server_restart_are_replaced(pg, observer):
    state = await State.start_task("q", "alice", store=pg)
    await observer.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'cogency'"
    )
    add_message(state, "user", "after the restart")
    await autosave(state)  # the dead pooled connection fails at BEGIN; a new one is used
    assert await observer.fetchval("SELECT content FROM conversation_messages") == (
        "after the restart"
    )


async def test_storing_exact_token_counts_that_fails_leaves_the_bounds_and_the_turn_goes_on(
    pg: Any, observer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Storing a counted window's exact counts is a statement of its own after the task began:
    when it fails (here, as if its lock wait timed out), the task goes on, the bounds stay as
    stored (true, if loose), and the log says why."""
    import cogency.tokens as tokens
    from cogency import Agent
    from cogency.errors import StoreLockedError
    from cogency.testing import ScriptedLLM

    text = " ".join(["ledger harbor quartz meadow signal copper lantern orbit"] * 5)
    monkeypatch.setattr(tokens, "_loaded", [])
    real_use = pg._use

    async def use(operation: str, *args: Any, **options: Any) -> Any:
        if operation == "storing messages' exact token counts":
            raise StoreLockedError("a lock wait timed out (injected)")
        return await real_use(operation, *args, **options)

    monkeypatch.setattr(pg, "_use", use)
    llm = ScriptedLLM([{"response": f"answer {n}: {text}"} for n in range(1, 21)])
    conversation = None
    with caplog.at_level("WARNING", logger="cogency.storage"):
        async with Agent(llm, store=pg) as agent:
            for turn in range(1, 21):
                result = await agent.run(f"turn {turn}: {text}", "alice", conversation)
                assert result.response == f"answer {turn}: {text}"
                conversation = result.conversation_id
                if tokens.loaded():
                    break
    assert tokens.loaded() and turn < 20
    assert "storing exact token counts failed" in caplog.text and "injected" in caplog.text
    stored = await observer.fetch(
        "SELECT content, tokens FROM conversation_messages WHERE conversation_id = $1 "
        "AND role = 'user' ORDER BY seq", conversation)
    assert [row["tokens"] for row in stored][:-1] == [
        tokens.most_tokens(row["content"]) for row in stored][:-1]  # the bounds, unchanged
