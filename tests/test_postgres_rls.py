"""Row-level security on PostgreSQL: every statement of the store acts for one user (or a
named scope across users), so one that forgets its ``WHERE user_id`` finds none of another
user's rows. The store connects as an ordinary role that owns the tables (FORCE ROW LEVEL
SECURITY holds the owner to the policies); the admin (a superuser) sees everything."""

from __future__ import annotations

import pgutil
import pytest

from cogency.memory import Memory
from cogency.state import State, add_message
from cogency.storage.postgres import _Sql

TABLES = ("user_profiles", "conversations", "conversation_messages", "task_workspaces",
          "task_approvals", "api_keys", "conversation_runs", "idempotency_keys",
          "profile_entries", "learning_queue")


async def _two_users(store) -> None:
    from datetime import timedelta

    from cogency import _time
    from cogency.server.keys import create_key
    from cogency.storage.base import RequestRecord, new_runner

    for user in ("alice", "bob"):
        done = await State.start_task(f"{user}'s secret", user, store=store, record_query=True)
        add_message(done, "assistant", f"{user}'s answer")
        await done.complete_task(learn=True)  # queued for learning (memory on)
        await Memory(store=store).set_entry(user, "goals", f"{user}'s goal")
        await State.start_task(f"{user}'s open task", user, store=store, record_query=True)
        await create_key(store, user)
        await store.hold_conversation(f"{user}-held", user, new_runner())
        await store.claim_request(RequestRecord(user, f"{user}-key", "request",
                                                _time.now() + timedelta(hours=1)))
    await store.save(_pause("alice", (await store.list_tasks("alice"))[0]))


def _pause(user, task):
    from cogency.storage import SaveBatch

    return SaveBatch(user, task.task_id, task.conversation_id, task.version,
                     approvals=[{"id": "call-1", "name": "shell", "args": {}}])


async def _every_row(store, **scope) -> dict[str, set[str]]:
    """What a statement with no filter at all finds in each table, in ``scope``."""

    async def work(db):
        found = {}
        for table in TABLES:
            column = "(SELECT user_id FROM conversations c WHERE c.conversation_id = " \
                "t.conversation_id)" if table == "conversation_messages" else "user_id"
            rows = await db.fetch(_Sql(f"SELECT {column} AS owner FROM {table} t"))
            found[table] = {row["owner"] for row in rows}
        return found

    return await store._read("reading every row", work, **scope)


async def test_a_statement_that_forgets_its_user_filter_finds_only_its_users_rows():
    async with pgutil.fresh_store(as_app=True) as store:
        await _two_users(store)
        as_bob = await _every_row(store, user="bob")
        assert as_bob == {table: {"bob"} for table in TABLES} | {"task_approvals": set()}
        as_alice = await _every_row(store, user="alice")
        assert as_alice == {table: {"alice"} for table in TABLES}
        # No scope at all: nothing (fails closed).
        assert await _every_row(store) == {table: set() for table in TABLES}
        # A named scope sees across users only where it must.
        tasks = await _every_row(store, scope="all_tasks")
        assert tasks["task_workspaces"] == {"alice", "bob"} and tasks["conversations"] == set()
        keys = await _every_row(store, scope="api_keys")
        assert keys["api_keys"] == {"alice", "bob"} and keys["user_profiles"] == set()
        # The learning sweep sees every user's queue, pruning every user's profile entries:
        # nothing else.
        for scope, table in (("learning", "learning_queue"), ("history", "profile_entries")):
            found = await _every_row(store, scope=scope)
            assert found == {name: {"alice", "bob"} if name == table else set()
                             for name in TABLES}, scope
        # The admin, a superuser, is not restricted (migrations and the tests' own reads).
        rows = await pgutil.raw_rows(store)("SELECT DISTINCT user_id FROM conversations")
        assert {row[0] for row in rows} == {"alice", "bob"}


async def test_writes_into_another_users_rows_are_refused_by_the_policies():
    import asyncpg

    async with pgutil.fresh_store(as_app=True) as store:
        await _two_users(store)

        async def work(db):
            changed = await db.fetch(_Sql(
                "UPDATE conversations SET conversation_data = '{}' RETURNING conversation_id"))
            with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                await db.fetch(_Sql(
                    "INSERT INTO user_profiles (user_id, profile_data) VALUES ('alice', '{}') "
                    "RETURNING 1"))
            return changed

        changed = await store._use("writing without a filter", work, user="bob",
                                   transaction=False)
        assert len(changed) == 2  # bob's two conversations only
        rows = await pgutil.raw_rows(store)(
            "SELECT user_id FROM conversations WHERE conversation_data::text = '{}'")
        assert {row[0] for row in rows} == {"bob"}


async def test_the_tables_are_forced_and_a_superuser_store_still_works():
    async with pgutil.fresh_store() as store:  # the admin: row-level security does not apply
        await _two_users(store)
        assert {t.user_id for t in await store.list_tasks()} == {"alice", "bob"}
        rows = await pgutil.raw_rows(store)(
            "SELECT relname FROM pg_class WHERE relrowsecurity AND relforcerowsecurity "
            "ORDER BY relname")
        assert [row[0] for row in rows] == sorted(TABLES)
