"""Backend-neutral store behaviour: every test runs on SQLite, on PostgreSQL (as an ordinary
role, so row-level security holds) and on PostgreSQL through PgBouncer in transaction mode.

Tenancy, optimistic versioning, concurrent appends, enforced foreign keys, corrupt rows,
forgetting a user. Rows are read back with ``raw`` (``?`` placeholders on every backend).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cogency.errors import ConflictError, CorruptDataError, NotFoundError
from cogency.memory import Memory
from cogency.state import State, add_message, autosave
from cogency.storage import SaveBatch, SQLiteStore, TaskRecord


@pytest.fixture(params=["sqlite", "postgres", "pgbouncer"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from conftest import open_backend

    async with open_backend(request.param, tmp_path) as store:
        yield store


def as_json(value: Any) -> Any:
    return value if isinstance(value, (dict, list)) else json.loads(value)


async def seqs(raw, conversation_id: str) -> list[int]:
    rows = await raw(
        "SELECT seq FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        conversation_id,
    )
    return [row[0] for row in rows]


async def message_count(raw, conversation_id: str) -> int:
    rows = await raw(
        "SELECT message_count FROM conversations WHERE conversation_id = ?", conversation_id
    )
    return rows[0][0]


async def execute_as_store(store: Any, raw, sql: str, *params: Any) -> None:
    """Run SQL on a connection configured like the store's own.

    SQLite enforces foreign keys per connection, so a write must go through the store's
    connection to prove *its* settings; a server backend enforces them for every session.
    """
    if isinstance(store, SQLiteStore):
        await store._run(lambda db: db.execute(sql, params).fetchall())
    else:
        await raw(sql, *params)


async def alice_with_history(store: Any) -> State:
    state = await State.start_task("alice's secret plan", "alice", store=store)
    add_message(state, "user", "my bank PIN is 4321")
    state.workspace.update({"discoveries": "alice-only discovery"})
    await autosave(state)
    return state


# -- tenancy ------------------------------------------------------------------------------


async def test_another_users_task_is_not_found_and_reveals_nothing(any_store, raw):
    alice = await alice_with_history(any_store)

    with pytest.raises(NotFoundError) as caught:
        await State.continue_task(alice.task_id, "bob", store=any_store)
    assert "4321" not in str(caught.value) and "alice-only" not in str(caught.value)
    with pytest.raises(NotFoundError):
        await any_store.load_task(alice.task_id, "bob")
    with pytest.raises(NotFoundError):
        await any_store.load_conversation(alice.conversation.conversation_id, "bob")
    with pytest.raises(NotFoundError):
        await any_store.load_messages(alice.conversation.conversation_id, "bob")
    assert await any_store.list_tasks("bob") == []
    assert await any_store.list_conversations("bob") == []
    assert await any_store.load_profile("bob") is None

    # Writing into alice's task or conversation as bob is refused and writes nothing.
    with pytest.raises(NotFoundError):
        await any_store.save(SaveBatch(
            user_id="bob", task_id=alice.task_id,
            conversation_id=alice.conversation.conversation_id, expected_version=alice.version,
            messages=[{"role": "user", "content": "injected", "tokens": 1}],
            workspace={"objective": "hijacked"},
        ))
    with pytest.raises(NotFoundError):
        await any_store.save(SaveBatch(
            user_id="bob", task_id="bob-task", conversation_id=alice.conversation.conversation_id,
            expected_version=1, messages=[{"role": "user", "content": "injected", "tokens": 1}],
        ))
    assert await seqs(raw, alice.conversation.conversation_id) == [1]
    rows = await raw("SELECT content FROM conversation_messages")
    assert [r[0] for r in rows] == ["my bank PIN is 4321"]
    data = as_json((await raw("SELECT workspace_data FROM task_workspaces"))[0][0])
    assert data["objective"] == "alice's secret plan"

    # Alice still sees all of it.
    resumed = await State.continue_task(alice.task_id, "alice", store=any_store)
    assert resumed.workspace.discoveries == "alice-only discovery"


async def test_a_conversation_id_owned_by_another_user_cannot_be_continued(any_store, raw):
    alice = await alice_with_history(any_store)
    conversation_id = alice.conversation.conversation_id

    with pytest.raises(NotFoundError, match="no conversation"):
        await State.start_task("let me in", "bob", conversation_id, store=any_store)

    # The refused start wrote nothing at all: not even bob's profile row.
    assert await raw("SELECT user_id FROM user_profiles") == [("alice",)]
    assert await raw("SELECT user_id FROM conversations") == [("alice",)]
    assert [r[0] for r in await raw("SELECT user_id FROM task_workspaces")] == ["alice"]
    assert await seqs(raw, conversation_id) == [1]


async def test_forget_user_removes_only_that_users_data(any_store, raw):
    alice = await alice_with_history(any_store)
    bob = await State.start_task("bob's task", "bob", store=any_store)
    add_message(bob, "user", "hello from bob")
    await bob.complete_task()
    await Memory(store=any_store).forget("alice")

    assert await raw("SELECT user_id FROM user_profiles") == [("bob",)]
    assert await raw("SELECT user_id FROM conversations") == [("bob",)]
    assert await raw("SELECT task_id FROM task_workspaces") == []
    rows = await raw("SELECT conversation_id, content FROM conversation_messages")
    assert rows == [(bob.conversation.conversation_id, "hello from bob")]
    with pytest.raises(NotFoundError):
        await State.continue_task(alice.task_id, "alice", store=any_store)


# -- versions and conflicts ------------------------------------------------------------------


async def test_a_stale_workspace_save_conflicts_and_writes_nothing(any_store, raw):
    start = await State.start_task("shared task", "alice", store=any_store)
    one = await State.continue_task(start.task_id, "alice", store=any_store)
    two = await State.continue_task(start.task_id, "alice", store=any_store)
    conversation_id = start.conversation.conversation_id

    add_message(one, "assistant", "from one")
    one.workspace.understanding = "one's view"
    await autosave(one)

    add_message(two, "assistant", "from two")
    two.workspace.understanding = "two's view"
    with pytest.raises(ConflictError, match="continue_task again"):
        await autosave(two)

    # The losing save wrote none of its parts: not its message, not its workspace.
    rows = await raw("SELECT version, workspace_data FROM task_workspaces")
    assert rows[0][0] == 2
    assert as_json(rows[0][1])["understanding"] == "one's view"
    assert [r[0] for r in await raw("SELECT content FROM conversation_messages")] == ["from one"]
    assert await message_count(raw, conversation_id) == 1
    with pytest.raises(ConflictError):
        await two.complete_task()
    assert len(await raw("SELECT task_id FROM task_workspaces")) == 1

    # Reloading gets the winner's workspace and a save that works.
    three = await State.continue_task(start.task_id, "alice", store=any_store)
    assert three.workspace.understanding == "one's view"
    three.workspace.approach = "agreed"
    await autosave(three)
    assert (await raw("SELECT version FROM task_workspaces"))[0][0] == 3


async def test_saving_a_task_completed_elsewhere_is_not_found(any_store, raw):
    start = await State.start_task("t", "alice", store=any_store)
    other = await State.continue_task(start.task_id, "alice", store=any_store)
    await start.complete_task()
    other.workspace.discoveries = "too late"
    add_message(other, "assistant", "too late")
    with pytest.raises(NotFoundError, match="completed"):
        await autosave(other)
    assert await raw("SELECT task_id FROM task_workspaces") == []
    assert await raw("SELECT content FROM conversation_messages") == []


async def test_a_task_id_is_used_once(any_store, raw):
    await State.start_task("a", "alice", store=any_store, task_id="fixed-id")
    with pytest.raises(ConflictError, match="already exists"):
        await State.start_task("b", "alice", store=any_store, task_id="fixed-id")
    with pytest.raises(ConflictError):  # nor by another user
        await State.start_task("b", "bob", store=any_store, task_id="fixed-id")
    assert [tuple(r) for r in await raw("SELECT task_id, query FROM task_workspaces")] == [
        ("fixed-id", "a")
    ]
    assert await raw("SELECT user_id FROM user_profiles WHERE user_id = 'bob'") == []


# -- concurrency -----------------------------------------------------------------------------


async def test_twenty_concurrent_tasks_append_to_one_conversation(any_store, raw):
    first = await State.start_task("root", "alice", store=any_store)
    conversation_id = first.conversation.conversation_id

    async def task(n: int) -> State:
        state = await State.start_task(f"task {n}", "alice", conversation_id, store=any_store)
        for k in range(3):
            add_message(state, "user", f"t{n}-m{k}")
            if k == 1:
                await autosave(state)  # saves interleave with the other tasks'
        state.workspace.discoveries = f"done {n}"
        await state.complete_task()
        return state

    await asyncio.gather(*(task(n) for n in range(20)))

    assert await seqs(raw, conversation_id) == list(range(1, 61))
    assert await message_count(raw, conversation_id) == 60
    contents = [r[0] for r in await raw(
        "SELECT content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        conversation_id,
    )]
    assert sorted(contents) == sorted(f"t{n}-m{k}" for n in range(20) for k in range(3))
    for n in range(20):  # each task's own messages keep their order
        mine = [c for c in contents if c.startswith(f"t{n}-")]
        assert mine == [f"t{n}-m0", f"t{n}-m1", f"t{n}-m2"]
    assert [r[0] for r in await raw("SELECT task_id FROM task_workspaces")] == [first.task_id]


async def test_concurrent_profile_updates_are_all_applied(any_store, raw):
    await State.start_task("t", "alice", store=any_store)

    def bump(profile):
        profile.interaction_count += 1

    await asyncio.gather(*(any_store.update_profile("alice", bump) for _ in range(15)))
    data = as_json((await raw("SELECT profile_data FROM user_profiles"))[0][0])
    assert data["interaction_count"] == 15


# -- integrity -------------------------------------------------------------------------------


async def test_foreign_keys_are_enforced(any_store, raw):
    await any_store.list_tasks()  # opens the store and creates the schema
    with pytest.raises(Exception, match="(?i)foreign key"):
        await execute_as_store(
            any_store, raw,
            "INSERT INTO task_workspaces (task_id, user_id, workspace_data, updated_at) "
            "VALUES (?, ?, ?, ?)",
            "orphan", "nobody", "{}", "2024-01-01T00:00:00+00:00",
        )
    with pytest.raises(Exception, match="(?i)foreign key"):
        await execute_as_store(
            any_store, raw,
            "INSERT INTO conversation_messages (conversation_id, seq, role, content, tokens, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?)",
            "no-such-conversation", 1, "user", "x", 1, "2024-01-01T00:00:00+00:00",
        )
    assert await raw("SELECT task_id FROM task_workspaces") == []
    assert await raw("SELECT seq FROM conversation_messages") == []


async def _corrupt(raw_write, sql: str, *params: Any) -> bool:
    """Write a corrupt value; False when the backend itself refuses to store invalid JSON."""
    try:
        await raw_write(sql, *params)
    except Exception as exc:  # a JSON column type rejects the text: nothing corrupt can exist
        assert "json" in str(exc).lower(), exc
        return False
    return True


async def test_a_corrupt_workspace_row_raises_corrupt_data_naming_the_row(any_store, raw_write):
    for bad in ("{not json", '{"objective": "cut', "[1, 2]", '"text"'):
        state = await State.start_task("t", "alice", store=any_store)
        if not await _corrupt(raw_write, "UPDATE task_workspaces SET workspace_data = ? "
                              "WHERE task_id = ?", bad, state.task_id):
            continue
        with pytest.raises(CorruptDataError) as caught:
            await State.continue_task(state.task_id, "alice", store=any_store)
        assert "task_workspaces" in str(caught.value) and state.task_id in str(caught.value)
        with pytest.raises(CorruptDataError):
            await any_store.list_tasks("alice")
        await raw_write("DELETE FROM task_workspaces WHERE task_id = ?", state.task_id)


async def test_a_corrupt_conversation_row_raises_corrupt_data_naming_the_row(any_store, raw_write):
    for bad in ("{not json", "[]", '{"created_at": "last tuesday"}'):
        state = await State.start_task("t", "alice", store=any_store)
        conversation_id = state.conversation.conversation_id
        if not await _corrupt(raw_write, "UPDATE conversations SET conversation_data = ? "
                              "WHERE conversation_id = ?", bad, conversation_id):
            continue
        for attempt in (
            lambda: State.continue_task(state.task_id, "alice", store=any_store),
            lambda: State.start_task("again", "alice", conversation_id, store=any_store),
        ):
            with pytest.raises(CorruptDataError) as caught:
                await attempt()
            assert "conversations" in str(caught.value) and conversation_id in str(caught.value)


async def test_a_corrupt_profile_row_raises_corrupt_data_naming_the_row(any_store, raw, raw_write):
    await State.start_task("t", "alice", store=any_store)
    for bad in ("{not json", "[]", '{"goals": "not a list"}', '{"interaction_count": "many"}',
                '{"last_updated": "soon"}'):
        if not await _corrupt(raw_write, "UPDATE user_profiles SET profile_data = ? "
                              "WHERE user_id = ?", bad, "alice"):
            continue
        with pytest.raises(CorruptDataError) as caught:
            await Memory(store=any_store).activate("alice")
        assert "user_profiles" in str(caught.value) and "alice" in str(caught.value)
        with pytest.raises(CorruptDataError):
            await any_store.update_profile("alice", lambda p: None)
        # The corrupt row is left for the user to repair, not overwritten with defaults.
        assert (await raw("SELECT profile_data FROM user_profiles"))[0][0] == bad


async def test_message_text_round_trips_exactly(any_store, raw):
    texts = [
        "plain", "", "naïve café — 東京 🚀", "line\nbreaks\r\nand\ttabs", "quote ' \" \\ back",
        "x" * 200_000, '{"looks": "like json"}', "\u2028\u2029 separators",
        "emoji \U0001f469\u200d\U0001f4bb and combining e\u0301",
    ]
    state = await State.start_task("t", "alice", store=any_store)
    for text in texts:
        add_message(state, "user", text)
    await autosave(state)
    rows = await raw("SELECT content FROM conversation_messages ORDER BY seq")
    assert [r[0] for r in rows] == texts
    loaded = await any_store.load_messages(state.conversation.conversation_id, "alice")
    assert [m["content"] for m in loaded] == texts


async def test_nul_characters_round_trip(any_store, raw):
    # Tool output (a binary file read as text) can hold NUL; saving it must not end the task.
    texts = ["nul \x00 byte", "\x00", "a\x00b\x00c"]
    state = await State.start_task("t", "alice", store=any_store)
    for text in texts:
        add_message(state, "tool", text)
    state.workspace.discoveries = "found \x00 in the file"
    await autosave(state)
    rows = await raw("SELECT content FROM conversation_messages ORDER BY seq")
    if isinstance(any_store, SQLiteStore):
        assert [r[0] for r in rows] == texts
    else:  # PostgreSQL text cannot hold NUL: the column holds a reversible escape
        assert len(rows) == len(texts) and all("\x00" not in r[0] for r in rows)
    resumed = await State.continue_task(state.task_id, "alice", store=any_store)
    assert [m["content"] for m in resumed.execution.messages] == texts
    assert resumed.workspace.discoveries == "found \x00 in the file"
    loaded = await any_store.load_messages(state.conversation.conversation_id, "alice")
    assert [m["content"] for m in loaded] == texts


async def test_list_tasks_and_conversations_are_scoped_by_user(any_store, raw):
    a1 = await State.start_task("a1", "alice", store=any_store)
    a2 = await State.start_task("a2", "alice", store=any_store)
    b1 = await State.start_task("b1", "bob", store=any_store)
    assert {t.task_id for t in await any_store.list_tasks("alice")} == {a1.task_id, a2.task_id}
    assert {t.task_id for t in await any_store.list_tasks()} == {
        a1.task_id, a2.task_id, b1.task_id,
    }
    conversations = await any_store.list_conversations("bob")
    assert [c.conversation_id for c in conversations] == [b1.conversation.conversation_id]
    newest = await any_store.list_conversations("alice", limit=1)  # most recently updated
    assert [c.conversation_id for c in newest] == [a2.conversation.conversation_id]
    assert len(await any_store.list_conversations("alice", limit=None)) == 2
    task = (await any_store.list_tasks("bob"))[0]
    assert isinstance(task, TaskRecord)
    assert (task.user_id, task.conversation_id, task.query, task.version) == (
        "bob", b1.conversation.conversation_id, "b1", 1,
    )


async def test_a_query_with_a_lone_surrogate_is_stored_with_it_replaced(any_store, raw):
    # Text decoded with errors="surrogateescape" (or a model's "\ud800") reaches the query;
    # neither SQLite nor PostgreSQL can store it, so the character is replaced, not the task lost.
    state = await State.start_task("bad \ud800 query", "alice", store=any_store)
    assert "\ud800" not in state.query and state.query.startswith("bad ")
    rows = await raw("SELECT query FROM task_workspaces WHERE task_id = ?", state.task_id)
    assert rows == [(state.query,)]


async def test_a_continued_conversation_knows_when_it_was_last_written(any_store):
    first = await State.start_task("q", "alice", store=any_store)
    add_message(first, "assistant", "an answer")
    await first.complete_task()
    stored = (await any_store.load_conversation(first.conversation.conversation_id, "alice"))
    later = await State.start_task("q2", "alice", first.conversation.conversation_id,
                                   store=any_store)
    assert stored.updated_at is not None
    assert later.conversation.last_updated >= stored.updated_at
    assert later.conversation.last_updated >= later.conversation.created_at


# -- runs: idempotent saves, messages by task, leases ---------------------------------------


async def test_a_save_retried_after_an_unknown_outcome_stores_nothing_twice(any_store, raw):
    state = await State.start_task("q", "alice", store=any_store, record_query=True)
    add_message(state, "assistant", "one")
    add_message(state, "tool", "two")
    batch = SaveBatch("alice", state.task_id, state.conversation.conversation_id, 1,
                      list(state.conversation.unsaved), {"understanding": "u"}, save_id="s1")
    assert await any_store.save(batch) == 2
    # The same save again (its reply was lost): the messages and the workspace land once.
    again = SaveBatch("alice", state.task_id, state.conversation.conversation_id, 1,
                      [dict(m) for m in batch.messages], {"understanding": "u"}, save_id="s1")
    assert await any_store.save(again) == 2
    assert [m["seq"] for m in again.messages] == [2, 3]
    assert await seqs(raw, state.conversation.conversation_id) == [1, 2, 3]
    assert await message_count(raw, state.conversation.conversation_id) == 3
    # Another save from the same stale version is still a conflict.
    with pytest.raises(ConflictError):
        await any_store.save(SaveBatch("alice", state.task_id, state.conversation.conversation_id,
                                       1, [], {"understanding": "x"}, save_id="s2"))
    # A completion retried after it landed finds its messages stored and succeeds.
    done = SaveBatch("alice", state.task_id, state.conversation.conversation_id, 2,
                     [{"id": "answer-1", "role": "assistant", "content": "done", "tokens": 1}],
                     complete=True, save_id="s3")
    await any_store.save(done)
    await any_store.save(SaveBatch(**{**done.__dict__, "messages": [dict(done.messages[0])]}))
    assert await seqs(raw, state.conversation.conversation_id) == [1, 2, 3, 4]
    assert await raw("SELECT task_id FROM task_workspaces") == []


async def test_a_tasks_messages_are_found_by_task_and_scoped_by_user(any_store):
    first = await State.start_task("first", "alice", store=any_store, record_query=True)
    add_message(first, "tool", '{"name": "x"}')
    await autosave(first)
    second = await State.start_task("second", "alice", first.conversation.conversation_id,
                                    store=any_store, record_query=True)
    found = await any_store.load_task_messages(first.task_id, "alice")
    assert [(m["role"], m["content"]) for m in found] == [("user", "first"),
                                                            ("tool", '{"name": "x"}')]
    assert [m["content"] for m in await any_store.load_task_messages(second.task_id, "alice")] \
        == ["second"]
    assert await any_store.load_task_messages(first.task_id, "bob") == []


async def test_claims_and_force_release_move_the_lease_epoch(any_store, raw):
    from cogency.errors import TaskRunningError
    from cogency.storage.base import new_runner

    state = await State.start_task("q", "alice", store=any_store)
    assert (await any_store.load_task(state.task_id, "alice")).epoch == 0
    runner = new_runner()
    assert await any_store.claim_task(state.task_id, "alice", runner) == 1
    assert await any_store.claim_task(state.task_id, "alice", runner) == 1  # held already
    with pytest.raises(TaskRunningError):
        await any_store.claim_task(state.task_id, "alice", new_runner())
    with pytest.raises(NotFoundError):
        await any_store.force_release(state.task_id, "bob")
    assert await any_store.force_release(state.task_id, "alice") == runner
    assert await raw("SELECT runner, epoch FROM task_workspaces") == [(None, 2)]
    assert await any_store.claim_task(state.task_id, "alice", new_runner()) == 3


async def test_a_started_tasks_window_sees_other_processes_writes(any_store, raw):
    """Each store caches history windows; another process's appends, and a conversation
    erased and made again under its id, still show in the next task's window."""
    from cogency.storage.base import new_runner

    other = SQLiteStore(any_store.path) if isinstance(any_store, SQLiteStore) else type(
        any_store)(any_store.dsn)
    try:
        async def started(store: Any, query: str) -> list[str]:
            state = await State.start_task(query, "alice", "c", store=store, record_query=True,
                                           runner=new_runner(), history_tokens=60)
            window = [m["content"] for m in state.execution.messages]
            assert window == [m["content"] for m in await store.load_messages(
                "c", "alice", token_budget=60)]  # what a fresh read finds
            add_message(state, "assistant", f"answer to {query}")
            await state.complete_task()
            return window

        for turn in range(6):  # turns alternate between the two stores
            store = any_store if turn % 2 == 0 else other
            window = await started(store, f"q{turn} " + "word " * 3)
            assert window[-1].startswith(f"q{turn}") and (len(window) > 2 or turn == 0)
        await other.forget_user("alice")
        assert await started(any_store, "after forget") == ["after forget"]
        assert await seqs(raw, "c") == [1, 2]
    finally:
        await other.close()



@pytest.mark.parametrize(("seed", "unloaded"), [(1, True), (2, True), (3, False)])
async def test_every_window_matches_the_rows_whatever_three_stores_do(
    any_store, raw, seed, unloaded, request
):
    """Three stores on one database, taking turns at random: budgets that keep all, some or
    none of the history, queries longer than the window, a task that adds more messages than
    one page of rows, and a forget. Every task starts with exactly the newest messages that
    fit its budget by their exact token counts (read from the rows' text), each kept right
    for the prompt; rows stored before the encoding loaded carry the upper bound of their
    count (``unloaded``: the test starts as a fresh process, with no encoding loaded)."""
    import random

    from cogency._history import History
    from cogency.storage.base import new_runner
    from cogency.tokens import count_tokens

    if unloaded:
        count_tokens = request.getfixturevalue("tokenizer_unloaded")  # noqa: F811
    rng = random.Random(seed)

    def another() -> Any:
        if isinstance(any_store, SQLiteStore):
            return SQLiteStore(any_store.path)
        return type(any_store)(any_store.dsn)

    stores = [any_store, another(), another()]
    try:
        for step in range(36):
            store = rng.choice(stores)
            budget = rng.choice([40, 200, 8_000])
            words = rng.choice([1, 3, 60])  # 60 words: longer than a budget of 40
            query = f"q{step} " + "word " * words
            state = await State.start_task(query, "alice", "c", store=store, record_query=True,
                                           runner=new_runner(), history_tokens=budget)
            rows = await raw("SELECT content, tokens FROM conversation_messages "
                             "WHERE conversation_id = ? ORDER BY seq DESC", "c")
            expected: list[str] = []
            used = 0
            for content, tokens in rows:
                assert tokens >= count_tokens(content)  # never less than the exact count
                if used + count_tokens(content) > budget:
                    break
                used += count_tokens(content)
                expected.append(content)
            expected.reverse()
            if not expected or expected[-1] != query:
                expected.append(query)  # a query longer than the budget still comes
            window = state.execution.messages
            assert [m["content"] for m in window] == expected, (seed, step)
            assert isinstance(window, History)
            fresh = History(list(window))
            assert window.chats == fresh.chats and window.cost() == fresh.cost(), (seed, step)
            added = rng.choice([0, 1, 2, 2, 300])  # 300: more than a page of rows at once
            for n in range(added):
                add_message(state, "assistant", f"a{step}.{n} " + "x " * rng.choice([1, 30]))
            await state.complete_task()
            if rng.random() < 0.08:
                await rng.choice(stores).forget_user("alice")
    finally:
        for store in stores[1:]:
            await store.close()


async def test_processes_that_start_on_a_conversation_far_below_its_window_rarely_count_it(
    any_store: Any, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that starts on a conversation whose stored upper bounds exceed the history
    window counts the window exactly, which loads the encoding (~0.12 s and ~20 MiB), and
    stores the exact counts in place of the bounds. The processes after it then start without
    loading it, until the bounds of the newer messages exceed the window again. Each turn
    here is a fresh process (no encoding, a new store), through ``Agent.run``; the model is
    sent the whole conversation every time (counted exactly, it is far below the window), and
    a stored count is only ever the message's exact count or its upper bound."""
    import cogency.tokens as tokens
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    real_load, loads = tokens._load, []
    turn = 0

    def load() -> Any:
        loads.append(turn)
        return real_load()

    monkeypatch.setattr(tokens, "_load", load)
    words = "ledger harbor quartz meadow signal copper lantern orbit pepper canyon".split()

    def text(n: int) -> str:  # ~270 characters, ~45 tokens: the bound is ~6 times the count
        return " ".join(words[(n * 7 + i * 3) % 10] for i in range(40))

    conversation = None
    for turn in range(1, 31):
        monkeypatch.setattr(tokens, "_loaded", [])  # a fresh process: no encoding loaded
        store = (SQLiteStore(any_store.path) if isinstance(any_store, SQLiteStore)
                 else type(any_store)(any_store.dsn))  # a new store: no window cached
        llm = ScriptedLLM([{"response": f"answer {turn}: {text(turn + 1)}"}])
        try:
            async with Agent(llm, store=store) as agent:
                result = await agent.run(f"turn {turn}: {text(turn)}", "alice", conversation)
        finally:
            await store.close()
        conversation = result.conversation_id
        assert result.response == f"answer {turn}: {text(turn + 1)}"
        sent = llm.calls[-1][1:]  # after the system message: the whole conversation
        assert [m["content"] for m in sent][-1] == f"turn {turn}: {text(turn)}"
        assert len(sent) == 2 * turn - 1, turn
    # Without the exact counts stored, every process from the first count on counts again:
    # 16 loads in these 30 turns.
    assert loads and len(loads) <= 3, loads
    rows = await raw("SELECT content, tokens FROM conversation_messages "
                     "WHERE conversation_id = ? ORDER BY seq", conversation)
    monkeypatch.setattr(tokens, "_loaded", [real_load()])
    exact = [tokens.count_tokens(content) for content, _ in rows]
    bound = [tokens.most_tokens(content) for content, _ in rows]
    assert all(stored in (e, b) for (_, stored), e, b in zip(rows, exact, bound))
    # Every message the last count saw holds its exact count: those before it, at least.
    assert all(stored == e for (_, stored), e in zip(rows[: 2 * loads[-1] - 2], exact))


async def test_a_window_a_running_store_counts_exactly_stores_its_exact_counts(
    any_store: Any, raw: Any, tokenizer_unloaded: Any
) -> None:
    """The same in one process that runs on: once the newest message takes its window's
    upper bounds over the budget, the window is counted exactly and those counts are stored
    (a process started after it reads them, and need not count)."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM
    from cogency.tokens import loaded, most_tokens

    exact = tokenizer_unloaded
    text = " ".join(["ledger harbor quartz meadow signal copper lantern orbit"] * 5)
    llm = ScriptedLLM([{"response": f"answer {n}: {text}"} for n in range(1, 21)])
    conversation = None
    async with Agent(llm, store=any_store) as agent:
        for turn in range(1, 21):
            result = await agent.run(f"turn {turn}: {text}", "alice", conversation)
            conversation = result.conversation_id
            if loaded():
                break
    assert loaded() and turn < 20  # the bounds went over the window: it was counted
    rows = await raw("SELECT content, tokens FROM conversation_messages "
                     "WHERE conversation_id = ? ORDER BY seq", conversation)
    assert len(rows) == 2 * turn
    held = [(tokens, exact(content), most_tokens(content)) for content, tokens in rows]
    assert all(stored in (e, b) for stored, e, b in held)
    # All but this turn's query (stored as a bound before the count) and its answer (its
    # count exact when it was stored): counted in place.
    assert [stored == e for stored, e, _ in held[:-2]] == [True] * (2 * turn - 2)
