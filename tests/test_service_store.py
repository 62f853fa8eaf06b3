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
