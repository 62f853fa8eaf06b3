"""The store's part of the service, on SQLite and PostgreSQL: API keys and conversation holds."""

from __future__ import annotations

import asyncio
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


async def test_a_hold_that_needs_the_conversation_takes_none_of_one_missing(any_store, raw):
    # What the service asks for a conversation a client names: it must be the user's.
    from cogency.state.state import State

    state = await State.start_task("hi", "alice", store=any_store)
    conversation = state.conversation.conversation_id
    with pytest.raises(NotFoundError, match="no conversation 'named-by-a-client'"):
        await any_store.hold_conversation("named-by-a-client", "alice", new_runner(),
                                          existing=True)
    with pytest.raises(NotFoundError):  # another user's: not found either
        await any_store.hold_conversation(conversation, "bob", new_runner(), existing=True)
    assert await raw("SELECT conversation_id FROM conversation_runs") == []
    await any_store.hold_conversation(conversation, "alice", holder := new_runner(),
                                      existing=True)
    assert await raw("SELECT conversation_id, runner FROM conversation_runs") == [
        (conversation, holder)]


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


async def _conversations_of(any_store, raw, user):
    """Each conversation of ``user``: (its stored turns digest, the turns a chat client
    shows of it: user messages and final answers, as stored)."""
    found = {}
    for (conversation_id, digest) in await raw(
            "SELECT conversation_id, turns_digest FROM conversations WHERE user_id = ?", user):
        stored = await any_store.load_messages(conversation_id, user)
        shown = [(m["role"], m["content"]) for m in stored if m["role"] != "tool"
                 and not m["content"].startswith('{"actions"')]
        found[conversation_id] = (digest, shown)
    return found


async def test_every_append_keeps_the_digest_of_the_conversations_turns(any_store, raw):
    """Queries and final answers (trimmed) make a conversation's turns, in order; tool steps
    and results do not. The digest is kept by each append, the same on both stores, and one
    lookup finds the newest conversation of the user with those turns."""
    from cogency import Agent, tool
    from cogency.storage.base import turns_digest
    from cogency.testing import ScriptedLLM

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    script = ScriptedLLM([
        {"actions": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"response": "  5\n"},
        {"response": "you are welcome"}, {"response": "next answer"}, {"response": "again"},
    ])
    async with Agent(llm=script, tools=[add], store=any_store) as agent:
        first = await agent.run("what is 2 + 3?", "alice")
        await agent.run("thanks \x00", "alice", first.conversation_id)  # NUL: escaped on PG
        resent = [("user", "older question"), ("assistant", " older answer ")]
        async for _ in agent.stream("next", "alice", history=resent):
            pass
        async for _ in agent.stream("again", "bob", history=resent):
            pass
    conversations = await _conversations_of(any_store, raw, "alice")
    assert len(conversations) == 2
    for conversation_id, (digest, shown) in conversations.items():
        assert digest == turns_digest(shown)
        assert await any_store.find_conversation_by_turns("alice", digest) == conversation_id
    assert conversations[first.conversation_id][1] == [
        ("user", "what is 2 + 3?"), ("assistant", "  5\n"),
        ("user", "thanks \x00"), ("assistant", "you are welcome")]
    client = [("user", "what is 2 + 3?"), ("assistant", "5"), ("user", "thanks \x00"),
              ("assistant", "you are welcome ")]  # as a chat client resends them
    assert await any_store.find_conversation_by_turns(
        "alice", turns_digest(client)) == first.conversation_id
    assert await any_store.find_conversation_by_turns("alice", turns_digest(client[:2])) is None
    # bob's conversation has the same turns as one of alice's: each finds only their own
    bobs = await _conversations_of(any_store, raw, "bob")
    [(bob_digest, _)] = bobs.values()
    [alices] = [c for c, (_, shown) in conversations.items() if shown[0][1] == "older question"]
    assert turns_digest(resent + [("user", "next"), ("assistant", "next answer")]) == \
        conversations[alices][0]
    assert await any_store.find_conversation_by_turns("bob", bob_digest) == next(iter(bobs))


def test_opening_an_older_database_computes_its_conversations_digests(tmp_path):
    import sqlite3

    from cogency.storage.base import turns_digest
    from cogency.storage.sqlite import SQLiteStore, migrate

    path = tmp_path / "old.db"
    connection = sqlite3.connect(path, isolation_level=None)
    migrate(connection, upto="m010_idempotency_keys")
    connection.execute("INSERT INTO user_profiles VALUES ('alice', '{}', '2026-01-01')")
    connection.execute("INSERT INTO conversations (conversation_id, user_id, conversation_data, "
                       "updated_at, message_count) VALUES ('c', 'alice', '{}', '2026-01-01', 4)")
    for seq, (role, content) in enumerate([("user", "hi"), ("assistant", '{"actions": []}'),
                                           ("tool", "{}"), ("assistant", "hello ")], 1):
        connection.execute("INSERT INTO conversation_messages (conversation_id, seq, role, "
                           "content, created_at) VALUES ('c', ?, ?, ?, '2026-01-01')",
                           (seq, role, content))
    connection.close()

    async def find():
        store = SQLiteStore(path)
        try:
            return await store.find_conversation_by_turns(
                "alice", turns_digest([("user", "hi"), ("assistant", "hello")]))
        finally:
            await store.close()

    assert asyncio.run(find()) == "c"


async def test_an_idempotency_key_is_claimed_once_per_user_until_it_expires(any_store, raw):
    from datetime import timedelta

    from cogency import _time
    from cogency.storage.base import RequestRecord

    later = _time.now() + timedelta(hours=1)
    first = RequestRecord("alice", "k", "request-1", later)
    assert await any_store.claim_request(first) is None  # claimed
    again = await any_store.claim_request(RequestRecord("alice", "k", "request-2", later))
    assert again is not None and again.request == "request-1" and again.outcome is None
    assert await any_store.claim_request(RequestRecord("bob", "k", "r", later)) is None
    await any_store.settle_request("alice", "k", task_id="t", conversation_id="c")
    await any_store.settle_request("alice", "k", outcome={"result": {"response": "hi \ud800"}})
    done = await any_store.claim_request(first)
    assert (done.task_id, done.conversation_id) == ("t", "c")
    assert done.outcome == {"result": {"response": "hi \ud800"}}
    # replace: an SDK's first attempt takes the key over
    assert await any_store.claim_request(RequestRecord("alice", "k", "r3", later),
                                         replace=True) is None
    assert (await any_store.claim_request(first)).request == "r3"
    await any_store.drop_request("alice", "k")
    assert await any_store.claim_request(first) is None
    # an expired key is claimed afresh
    past = RequestRecord("carol", "old", "r", _time.now() - timedelta(seconds=1))
    assert await any_store.claim_request(past) is None
    assert await any_store.claim_request(RequestRecord("carol", "old", "new", later)) is None
    assert await raw("SELECT request_hash FROM idempotency_keys WHERE user_id = 'carol'") == [
        ("new",)]
    # forgetting a user forgets their keys
    await any_store.forget_user("alice")
    assert await raw("SELECT COUNT(*) FROM idempotency_keys WHERE user_id = 'alice'") == [(0,)]
    assert await raw("SELECT COUNT(*) FROM idempotency_keys WHERE user_id = 'bob'") == [(1,)]


async def test_opening_an_older_postgres_database_computes_its_conversations_digests():
    import pgutil

    from cogency.storage import postgres
    from cogency.storage.base import turns_digest

    async with pgutil.fresh_database() as url:
        import asyncpg

        connection = await asyncpg.connect(url)
        try:
            await postgres.migrate(connection, upto="m010_idempotency_keys")
            await connection.execute(
                "INSERT INTO user_profiles VALUES ('alice', '{}', now());"
                "INSERT INTO conversations (conversation_id, user_id, conversation_data, "
                "updated_at, message_count) VALUES ('c', 'alice', '{}', now(), 4);"
                "INSERT INTO conversation_messages (conversation_id, seq, role, content, "
                "created_at) VALUES ('c', 1, 'user', 'hi \ue0000', 'x'), "
                "('c', 2, 'assistant', '{\"actions\": []}', 'x'), ('c', 3, 'tool', '{}', 'x'), "
                "('c', 4, 'assistant', 'hello ', 'x')")
        finally:
            await connection.close()
        store = postgres.PostgresStore(url)
        try:
            found = await store.find_conversation_by_turns(  # 'hi \ue0000' holds a NUL
                "alice", turns_digest([("user", "hi \x00"), ("assistant", "hello")]))
        finally:
            await store.close()
    assert found == "c"


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


async def test_turn_after_turn_one_heartbeat_renews_what_is_held(tmp_path):
    """A store renews what it holds with one heartbeat, which letting go of the last hold does
    not stop: turn after turn (each holds its task) runs with the same one, which ends by
    itself at a beat that finds nothing held; a hold taken later starts another, and that one
    renews its lease."""
    import sqlite3

    from cogency import Agent
    from cogency.storage import SQLiteStore
    from cogency.testing import ScriptedLLM

    path = tmp_path / "beat.db"
    store = SQLiteStore(path, lease=0.3)  # a beat every 0.1 s
    try:
        async with Agent(ScriptedLLM([{"response": "ok"}] * 3), store=store) as agent:
            first = await agent.run("one", "alice")
            beat = store._leases._beat
            assert beat is not None and not beat.done()
            for text in ("two", "three"):
                await agent.run(text, "alice", first.conversation_id)
            assert store._leases._beat is beat  # never cancelled and started again
            await asyncio.wait_for(beat, 10)  # nothing held: it ends by itself

            await store.hold_conversation("c", "alice", new_runner())
            assert store._leases._beat is not beat and not store._leases._beat.done()
            taken = _lease_until(path, "c")
            for _ in range(200):  # renewed at its next beat
                if _lease_until(path, "c") != taken:
                    break
                await asyncio.sleep(0.05)
            assert _lease_until(path, "c") > taken
    finally:
        await store.close()
    with sqlite3.connect(path) as check:  # each run let its task go, with nothing left held
        assert check.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)


def test_a_store_used_from_another_event_loop_renews_there(tmp_path):
    """A heartbeat left pending on an event loop closed without cancelling it renews nothing:
    a hold taken on the next loop starts a heartbeat there, which renews its lease."""
    from cogency.storage import SQLiteStore

    path = tmp_path / "loops.db"
    store = SQLiteStore(path, lease=0.3)
    first = asyncio.new_event_loop()
    first.run_until_complete(store.hold_conversation("c", "alice", new_runner()))
    stale = store._leases._beat
    first.close()  # its heartbeat is still pending there, and never runs again
    assert stale is not None and not stale.done()

    async def on_the_next_loop() -> None:
        await store.hold_conversation("d", "alice", new_runner())
        taken = _lease_until(path, "d")
        for _ in range(200):
            if _lease_until(path, "d") != taken:
                break
            await asyncio.sleep(0.05)
        assert _lease_until(path, "d") > taken
        await store.close()

    asyncio.run(on_the_next_loop())


def _lease_until(path: object, conversation_id: str) -> str:
    import sqlite3

    with sqlite3.connect(str(path)) as check:
        (until,) = check.execute("SELECT lease_until FROM conversation_runs "
                                 "WHERE conversation_id = ?", (conversation_id,)).fetchone()
    return str(until)
