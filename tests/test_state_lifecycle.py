"""The task lifecycle through the public state functions, checked against the stored rows.

Runs on every backend (``any_store``/``raw``). The contract being proven (SPEC §1):

- ``State.start_task`` writes the profile, conversation and workspace rows;
- ``add_message`` is a plain function that holds the message **in memory** until the next
  ``autosave``/``complete_task`` (documented in ``cogency.state.add_message``); ``autosave``
  appends it as one ``conversation_messages`` row and writes a changed workspace, bumping
  its ``version``;
- ``continue_task`` restores the workspace *and* the conversation history;
- ``complete_task`` deletes the workspace row and keeps the conversation and its messages.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from memory_replies import learn_into

from cogency.errors import NotFoundError, UsageError
from cogency.memory import Profile
from cogency.state import State, Workspace, add_message, autosave
from cogency.tokens import count_tokens, loaded


def as_json(value: Any) -> Any:
    """A JSON column as Python data (text on SQLite, possibly already decoded elsewhere)."""
    return value if isinstance(value, (dict, list)) else json.loads(value)


async def workspace_row(raw, task_id: str) -> dict[str, Any] | None:
    rows = await raw(
        "SELECT task_id, user_id, conversation_id, version, workspace_data, query "
        "FROM task_workspaces WHERE task_id = ?",
        task_id,
    )
    if not rows:
        return None
    task, user, conversation, version, data, query = rows[0]
    return {
        "task_id": task, "user_id": user, "conversation_id": conversation,
        "version": version, "workspace": as_json(data), "query": query,
    }


async def message_rows(raw, conversation_id: str) -> list[tuple[int, str, str]]:
    return [
        tuple(row)
        for row in await raw(
            "SELECT seq, role, content FROM conversation_messages WHERE conversation_id = ? "
            "ORDER BY seq",
            conversation_id,
        )
    ]


async def message_count(raw, conversation_id: str) -> int:
    rows = await raw(
        "SELECT message_count FROM conversations WHERE conversation_id = ?", conversation_id
    )
    return rows[0][0]


async def test_start_task_creates_profile_conversation_and_workspace_rows(any_store, raw):
    state = await State.start_task("plan a trip to Lisbon", "alice", store=any_store)
    conversation_id = state.conversation.conversation_id

    profiles = await raw("SELECT user_id, profile_data FROM user_profiles")
    assert [row[0] for row in profiles] == ["alice"]
    assert as_json(profiles[0][1])["user_id"] == "alice"

    conversations = await raw(
        "SELECT conversation_id, user_id, conversation_data, message_count FROM conversations"
    )
    assert [(c, u, n) for c, u, _, n in conversations] == [(conversation_id, "alice", 0)]
    stored = as_json(conversations[0][2])
    assert stored["conversation_id"] == conversation_id
    assert "messages" not in stored  # message text lives in conversation_messages

    assert await workspace_row(raw, state.task_id) == {
        "task_id": state.task_id,
        "user_id": "alice",
        "conversation_id": conversation_id,
        "version": 1,
        "workspace": {
            "objective": "plan a trip to Lisbon", "understanding": "", "approach": "",
            "discoveries": "",
        },
        "query": "plan a trip to Lisbon",
    }
    assert state.version == 1
    assert state.execution.messages == []
    assert await message_rows(raw, conversation_id) == []

    # A second task of the same user reuses the profile row.
    await State.start_task("another", "alice", store=any_store)
    assert len(await raw("SELECT user_id FROM user_profiles")) == 1
    assert len(await raw("SELECT task_id FROM task_workspaces")) == 2


async def test_add_message_is_in_memory_until_autosave_appends_the_row(any_store, raw):
    state = await State.start_task("hello", "alice", store=any_store)
    conversation_id = state.conversation.conversation_id

    message = add_message(state, "user", "hello there")
    # Documented contract: add_message is a plain (sync) function; the row comes with autosave.
    assert not hasattr(message, "__await__")
    assert state.execution.messages[-1]["content"] == "hello there"
    assert state.conversation.messages[-1]["content"] == "hello there"
    assert await message_rows(raw, conversation_id) == []

    await autosave(state)
    assert await message_rows(raw, conversation_id) == [(1, "user", "hello there")]
    assert await message_count(raw, conversation_id) == 1
    assert message["seq"] == 1

    add_message(state, "assistant", "hi, how can I help?")
    add_message(state, "tool", '{"result": 42}')
    await autosave(state)
    assert await message_rows(raw, conversation_id) == [
        (1, "user", "hello there"),
        (2, "assistant", "hi, how can I help?"),
        (3, "tool", '{"result": 42}'),
    ]
    assert await message_count(raw, conversation_id) == 3
    # Stored alongside: the writing task and the token count used for windowing.
    rows = await raw(
        "SELECT task_id, tokens FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        conversation_id,
    )
    assert [r[0] for r in rows] == [state.task_id] * 3
    # Each count is exact, or (in a process that never loaded the encoding) the text's UTF-8
    # length: an upper bound, which whatever windows by it counts exactly (tests/test_tokens.py).
    texts = ("hello there", "hi, how can I help?", '{"result": 42}')
    assert [r[1] for r in rows] == [count_tokens(t) if loaded() else len(t) for t in texts]

    # Saving again with nothing new writes nothing.
    await autosave(state)
    assert len(await message_rows(raw, conversation_id)) == 3


async def test_autosave_updates_the_workspace_row_and_bumps_its_version(any_store, raw):
    state = await State.start_task("find the bug", "alice", store=any_store)
    assert (await workspace_row(raw, state.task_id))["version"] == 1

    # Messages alone leave the workspace and its version untouched.
    add_message(state, "user", "find the bug")
    await autosave(state)
    assert (await workspace_row(raw, state.task_id))["version"] == 1

    state.workspace.update({"understanding": "crash on empty input", "approach": "bisect"})
    await autosave(state)
    row = await workspace_row(raw, state.task_id)
    assert row["version"] == 2 and state.version == 2
    assert row["workspace"] == {
        "objective": "find the bug", "understanding": "crash on empty input",
        "approach": "bisect", "discoveries": "",
    }

    state.workspace.discoveries = "parse() divides by len(items)"
    add_message(state, "assistant", "found it")
    await autosave(state)
    row = await workspace_row(raw, state.task_id)
    assert row["version"] == 3
    assert row["workspace"]["discoveries"] == "parse() divides by len(items)"
    assert await message_rows(raw, state.conversation.conversation_id) == [
        (1, "user", "find the bug"), (2, "assistant", "found it"),
    ]


async def test_continue_task_restores_workspace_and_conversation_history(any_store, raw):
    first = await State.start_task("refactor the parser", "alice", store=any_store)
    add_message(first, "user", "refactor the parser")
    add_message(first, "assistant", "looking at parser.py")
    first.workspace.update({"understanding": "two code paths", "discoveries": "no tests"})
    await autosave(first)
    # The process "dies" here: nothing else of `first` is used.

    resumed = await State.continue_task(first.task_id, "alice", store=any_store)
    assert resumed.task_id == first.task_id
    assert resumed.query == "refactor the parser"
    assert resumed.workspace == Workspace(
        objective="refactor the parser", understanding="two code paths", approach="",
        discoveries="no tests",
    )
    assert resumed.conversation.conversation_id == first.conversation.conversation_id
    assert [(m["role"], m["content"]) for m in resumed.execution.messages] == [
        ("user", "refactor the parser"), ("assistant", "looking at parser.py"),
    ]
    assert [m["content"] for m in resumed.conversation.messages] == [
        "refactor the parser", "looking at parser.py",
    ]
    assert resumed.version == 2
    assert resumed.execution.iteration == 0  # execution is fresh, never stored

    # The resumed state keeps appending after the restored history.
    add_message(resumed, "assistant", "done")
    resumed.workspace.approach = "merge the paths"
    await autosave(resumed)
    assert await message_rows(raw, first.conversation.conversation_id) == [
        (1, "user", "refactor the parser"), (2, "assistant", "looking at parser.py"),
        (3, "assistant", "done"),
    ]
    assert (await workspace_row(raw, first.task_id))["version"] == 3


async def test_complete_task_deletes_workspace_and_keeps_conversation(any_store, raw):
    state = await State.start_task("summarise", "alice", store=any_store)
    conversation_id = state.conversation.conversation_id
    add_message(state, "user", "summarise")
    await autosave(state)
    # Unsaved messages and workspace changes are written by complete_task itself.
    add_message(state, "assistant", "here is the summary")
    state.workspace.discoveries = "three sections"

    await state.complete_task()

    assert await workspace_row(raw, state.task_id) is None
    assert await message_rows(raw, conversation_id) == [
        (1, "user", "summarise"), (2, "assistant", "here is the summary"),
    ]
    assert await message_count(raw, conversation_id) == 2
    assert len(await raw("SELECT user_id FROM user_profiles WHERE user_id = ?", "alice")) == 1
    with pytest.raises(NotFoundError, match="no unfinished task"):
        await State.continue_task(state.task_id, "alice", store=any_store)
    # A completed state refuses further use instead of writing into a deleted task.
    with pytest.raises(UsageError, match="complete"):
        add_message(state, "user", "more")
    with pytest.raises(UsageError, match="complete"):
        await autosave(state)


async def test_complete_task_saves_the_profile_in_the_same_transaction(any_store, raw):
    state = await State.start_task("hi", "alice", store=any_store)
    profile = await any_store.load_profile("alice")
    learn_into(profile, {"goals": ["learn Rust"], "communication_style": "terse"})
    await state.complete_task(profile)

    data = as_json((await raw("SELECT profile_data FROM user_profiles WHERE user_id = ?",
                              "alice"))[0][0])
    assert data["goals"] == ["learn Rust"]
    assert data["communication_style"] == "terse"
    assert data["interaction_count"] == 1
    assert Profile.from_dict(data).goals == ["learn Rust"]
    assert await workspace_row(raw, state.task_id) is None


async def test_new_task_on_a_conversation_carries_every_earlier_message(any_store, raw):
    first = await State.start_task("What is AI?", "alice", store=any_store)
    conversation_id = first.conversation.conversation_id
    add_message(first, "user", "What is AI?")
    add_message(first, "assistant", "Artificial intelligence is ...")
    await first.complete_task()

    # A second task stops without completing; its messages were autosaved.
    second = await State.start_task("Tell me more", "alice", conversation_id, store=any_store)
    assert [m["content"] for m in second.execution.messages] == [
        "What is AI?", "Artificial intelligence is ...",
    ]
    add_message(second, "user", "Tell me more")
    add_message(second, "assistant", "Machine learning is one branch ...")
    await autosave(second)

    third = await State.start_task("And deep learning?", "alice", conversation_id, store=any_store)
    assert third.conversation.conversation_id == conversation_id
    assert third.task_id not in (first.task_id, second.task_id)
    expected = [
        ("user", "What is AI?"), ("assistant", "Artificial intelligence is ..."),
        ("user", "Tell me more"), ("assistant", "Machine learning is one branch ..."),
    ]
    assert [(m["role"], m["content"]) for m in third.execution.messages] == expected
    assert [m["seq"] for m in third.execution.messages] == [1, 2, 3, 4]
    assert [(m["role"], m["content"]) for m in third.conversation.messages] == expected
    assert [(r, c) for _, r, c in await message_rows(raw, conversation_id)] == expected
    # Only the unfinished tasks keep a workspace; all three share the conversation.
    rows = await raw("SELECT task_id, conversation_id FROM task_workspaces ORDER BY task_id")
    assert sorted(rows) == sorted([(second.task_id, conversation_id),
                                   (third.task_id, conversation_id)])


async def test_history_is_windowed_to_the_token_budget_and_never_lost(any_store, raw):
    texts = [f"message {i}: " + "lorem ipsum dolor sit amet " * 5 for i in range(12)]
    tokens = [count_tokens(t) for t in texts]
    first = await State.start_task("long chat", "alice", store=any_store)
    conversation_id = first.conversation.conversation_id
    for i, text in enumerate(texts):
        add_message(first, "user" if i % 2 == 0 else "assistant", text)
    await autosave(first)

    budget = sum(tokens[-3:]) + tokens[-4] // 2  # room for three newest, not a fourth
    later = await State.start_task(
        "next", "alice", conversation_id, store=any_store, history_tokens=budget
    )
    assert [m["content"] for m in later.execution.messages] == texts[-3:]
    assert [m["seq"] for m in later.execution.messages] == [10, 11, 12]

    resumed = await State.continue_task(
        later.task_id, "alice", store=any_store, history_tokens=sum(tokens[-5:])
    )
    assert [m["content"] for m in resumed.execution.messages] == texts[-5:]
    # A task's own messages are never windowed away: all twelve are `first`'s (issue 19).
    own = await State.continue_task(
        first.task_id, "alice", store=any_store, history_tokens=sum(tokens[-5:])
    )
    assert [m["content"] for m in own.execution.messages] == texts

    # A zero budget loads nothing; the default budget loads everything here.
    empty = await State.start_task("x", "alice", conversation_id, store=any_store,
                                   history_tokens=0)
    assert empty.execution.messages == []
    full = await State.start_task("y", "alice", conversation_id, store=any_store)
    assert [m["content"] for m in full.execution.messages] == texts

    # The database keeps every message whatever was loaded.
    assert [c for _, _, c in await message_rows(raw, conversation_id)] == texts
    assert await message_count(raw, conversation_id) == 12

    # Appending after a windowed load continues the sequence; nothing is renumbered.
    add_message(later, "user", "and now?")
    await autosave(later)
    assert (await message_rows(raw, conversation_id))[-1] == (13, "user", "and now?")


async def test_bad_user_ids_are_usage_errors_and_write_nothing(any_store, raw):
    await any_store.list_tasks()  # the store opens lazily: create the schema first
    for user_id in ("", "   ", None, 42, "a\x00b", "tab\there", "x" * 300):
        with pytest.raises(UsageError, match="user_id"):
            await State.start_task("q", user_id, store=any_store)
        with pytest.raises(UsageError, match="user_id"):
            await State.continue_task("some-task", user_id, store=any_store)
    assert await raw("SELECT user_id FROM user_profiles") == []
    assert await raw("SELECT task_id FROM task_workspaces") == []


async def test_bad_arguments_are_usage_errors(any_store, raw):
    with pytest.raises(UsageError, match="conversation_id"):
        await State.start_task("q", "alice", "", store=any_store)
    with pytest.raises(UsageError, match="task_id"):
        await State.continue_task("", "alice", store=any_store)
    with pytest.raises(UsageError, match="query"):
        await State.start_task(None, "alice", store=any_store)
    state = await State.start_task("q", "alice", store=any_store)
    with pytest.raises(UsageError, match="role"):
        add_message(state, "robot", "beep")
    with pytest.raises(UsageError, match="content"):
        add_message(state, "user", None)
    await autosave(state)
    assert await message_rows(raw, state.conversation.conversation_id) == []
