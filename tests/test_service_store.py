"""The store's part of the service, on SQLite and PostgreSQL: API keys and conversation holds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cogency.errors import ConflictError, ConversationBusyError, NotFoundError
from cogency.server.keys import authenticate, create_key
from cogency.storage.base import new_runner


async def test_keys_are_stored_hashed_and_checked(any_store, raw):
    record, key = await create_key(any_store, "alice", "laptop")
    assert key.startswith("cog_") and record.key_id in key
    stored = await raw("SELECT key_id, user_id, key_hash, name FROM api_keys")
    assert stored == [(record.key_id, "alice", record.key_hash, "laptop")]
    assert key.split("_", 2)[2] not in str(stored)  # the secret is not stored, only its hash
    assert (await authenticate(any_store, key)).user_id == "alice"
    assert await authenticate(any_store, key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert await authenticate(any_store, "cog_0000000000000000_" + key.split("_", 2)[2]) is None
    assert await authenticate(any_store, key + "x") is None
    _, other = await create_key(any_store, "bob")
    assert [k.user_id for k in await any_store.list_api_keys()] == ["alice", "bob"]
    assert [k.user_id for k in await any_store.list_api_keys("bob")] == ["bob"]
    revoked = await any_store.revoke_api_key(record.key_id)
    assert revoked.revoked_at is not None
    assert await authenticate(any_store, key) is None
    assert (await authenticate(any_store, other)).user_id == "bob"
    with pytest.raises(NotFoundError):
        await any_store.revoke_api_key("nope")
    with pytest.raises(ConflictError):
        await any_store.create_api_key(record)


async def test_one_holder_per_conversation(any_store):
    from cogency.state.state import State

    state = await State.start_task("hi", "alice", store=any_store)
    conversation = state.conversation.conversation_id
    first, second = new_runner(), new_runner()
    await any_store.hold_conversation(conversation, "alice", first)
    await any_store.hold_conversation(conversation, "alice", first)  # the holder again: fine
    with pytest.raises(ConversationBusyError, match="has a run in flight"):
        await any_store.hold_conversation(conversation, "alice", second)
    with pytest.raises(NotFoundError):  # another user's conversation is not found, not busy
        await any_store.hold_conversation(conversation, "bob", second)
    await any_store.release_conversation(conversation, second)  # not the holder: no effect
    with pytest.raises(ConversationBusyError):
        await any_store.hold_conversation(conversation, "alice", second)
    await any_store.release_conversation(conversation, first)
    await any_store.hold_conversation(conversation, "alice", second)
    await any_store.hold_conversation("brand-new", "alice", first)  # not created yet: held


async def test_a_dead_holder_holds_nothing(any_store, tmp_path):
    """A holder whose process died (a killed replica) leaves the conversation free."""
    from cogency.state.state import State

    state = await State.start_task("hi", "alice", store=any_store)
    conversation = state.conversation.conversation_id
    target = getattr(any_store, "dsn", None) or any_store.path
    code = (
        "import asyncio, os, sys\n"
        "from cogency.storage import open_store\n"
        "from cogency.storage.base import new_runner\n"
        "async def main():\n"
        "    store = open_store(sys.argv[1])\n"
        "    await store.hold_conversation(sys.argv[2], 'alice', new_runner())\n"
        "    print('held', flush=True)\n"
        "    os._exit(0)\n"  # dies without releasing
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(target), conversation],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "held", done.stderr
    await any_store.hold_conversation(conversation, "alice", new_runner())


async def test_a_run_whose_hold_was_taken_over_writes_nothing(any_store, raw, raw_write):
    """The hold lapsed (its store could not renew it) and another runner took the
    conversation: the first run's next write raises LeaseLostError and stores nothing, so two
    runs never interleave in one conversation."""
    from cogency.errors import LeaseLostError
    from cogency.state import State, add_message, autosave
    from cogency.storage import SQLiteStore
    from cogency.storage.postgres import PostgresStore

    await any_store.hold_conversation("c", "alice", new_runner())
    state = await State.start_task("first run", "alice", "c", store=any_store,
                                   record_query=True, runner=new_runner())
    any_store._leases._beat.cancel()  # its renewals stop (a partition, a stalled process)
    await raw_write("UPDATE conversation_runs SET lease_until = ?", "2000-01-01T00:00:00+00:00")
    other = SQLiteStore(any_store.path) if isinstance(any_store, SQLiteStore) \
        else PostgresStore(any_store.dsn)
    try:
        await other.hold_conversation("c", "alice", second := new_runner())
        later = await State.start_task("second run", "alice", "c", store=other,
                                       record_query=True, runner=new_runner())
        add_message(state, "assistant", "the first run's late answer")
        with pytest.raises(LeaseLostError, match="conversation 'c'"):
            await autosave(state)
        with pytest.raises(LeaseLostError):
            await state.complete_task()
        add_message(later, "assistant", "the second run's answer")
        await later.complete_task()
        await other.release_conversation("c", second)
    finally:
        await other.close()
    rows = await raw("SELECT content FROM conversation_messages WHERE conversation_id = 'c' "
                     "ORDER BY seq")
    assert [r[0] for r in rows] == ["first run", "second run", "the second run's answer"]


async def test_a_lapsed_hold_nobody_took_is_renewed_and_the_run_goes_on(any_store, raw,
                                                                       raw_write):
    from cogency.state import State, add_message

    await any_store.hold_conversation("c", "alice", holder := new_runner())
    state = await State.start_task("q", "alice", "c", store=any_store, record_query=True,
                                   runner=new_runner())
    await raw_write("UPDATE conversation_runs SET lease_until = ?", "2000-01-01T00:00:00+00:00")
    add_message(state, "assistant", "answer")
    await state.complete_task()  # its epoch is unchanged: still its hold
    [(epoch,)] = await raw("SELECT epoch FROM conversation_runs")
    assert epoch == 1
    await any_store.release_conversation("c", holder)
    assert await raw("SELECT runner FROM conversation_runs") == [(None,)]
