"""What a turn costs the SQLite store in statements, and that the statements it saved keep every
guarantee: seq numbering, the conversation's count and turns digest, exactly-once saves after
an unknown outcome, refused completions that write nothing, the history window's checks."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cogency import Agent
from cogency.errors import ConflictError
from cogency.memory import Memory
from cogency.state import State, add_message
from cogency.storage import SQLiteStore
from cogency.storage.base import SaveBatch, chain_turns, turn_hash
from cogency.testing import ScriptedLLM

TURN_STATEMENTS = 10
"""A one-step turn on an existing conversation, memory off. Beginning it: BEGIN IMMEDIATE;
UPDATE conversations (count, updated_at and turns digest, returning the row and the created_at
that checks the cached history window); INSERT task_workspaces; INSERT conversation_messages
(the query); COMMIT. Completing it: BEGIN IMMEDIATE; DELETE task_workspaces (returning what
the lease, version and retry checks read); UPDATE conversations; INSERT conversation_messages
(the answer); COMMIT. (16 before: a SELECT of the conversation, one of the window's last
message, one of the task row and one of message ids were their own statements, and the digest
had an UPDATE of its own on each append.)"""


def _statements(traced: list[str]) -> list[str]:
    """The statements sent, PRAGMAs left out. A foreign key's cascade (the deleted task's
    approvals) runs as a trigger, which the trace reports as its statement again."""
    sent: list[str] = []
    for sql in traced:
        if sql.startswith("PRAGMA") or (sent and sql == sent[-1]):
            continue
        sent.append(sql)
    return sent


def _digest(turns: list[tuple[str, str]]) -> str | None:
    """The turns digest as the store computed it before (one chain step per turn)."""
    digest = None
    for role, text in turns:
        piece = turn_hash(role, text)
        if piece is not None:
            digest = chain_turns(digest, [piece])
    return digest


@pytest.mark.parametrize("synchronous", ["normal", "full"])
async def test_a_one_step_turn_on_an_existing_conversation_sends_ten_statements(
        tmp_path: Path, synchronous: str) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(path, synchronous=synchronous)
    answers = ["one", "two", "three"]
    try:
        async with Agent(ScriptedLLM([{"response": a} for a in answers]),
                         store=store) as agent:
            conversation = (await agent.run("hello", "alice")).conversation_id
            assert (await agent.run("again", "alice", conversation)).response == "two"
            traced: list[str] = []
            await store._run(lambda db: db.set_trace_callback(traced.append))
            assert (await agent.run("and again", "alice", conversation)).response == "three"
            await store._run(lambda db: db.set_trace_callback(None))
    finally:
        await store.close()
    sent = _statements(traced)
    assert len(sent) == TURN_STATEMENTS, "\n".join(sent)
    assert [sql.split()[0] for sql in sent] == [
        "BEGIN", "UPDATE", "INSERT", "INSERT", "COMMIT",
        "BEGIN", "DELETE", "UPDATE", "INSERT", "COMMIT"]

    turns = [("user", "hello"), ("assistant", "one"), ("user", "again"),
             ("assistant", "two"), ("user", "and again"), ("assistant", "three")]
    db = sqlite3.connect(path)
    try:
        assert db.execute(
            "SELECT seq, role, content FROM conversation_messages WHERE conversation_id = ? "
            "ORDER BY seq", (conversation,)).fetchall() == [
                (seq, role, text) for seq, (role, text) in enumerate(turns, start=1)]
        assert db.execute(
            "SELECT message_count, turns_digest FROM conversations WHERE conversation_id = ?",
            (conversation,)).fetchone() == (6, _digest(turns))
        assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)
    finally:
        db.close()


async def test_a_save_of_messages_sent_again_after_it_landed_stores_them_once(
        store: SQLiteStore, db: sqlite3.Connection) -> None:
    """A save that carries no workspace checks no task row: only the unique index of message
    ids finds that its earlier attempt landed, and the save is made again, looking."""
    state = await State.start_task("q", "alice", store=store, record_query=True)
    conversation = state.conversation.conversation_id
    add_message(state, "assistant", "one")
    add_message(state, "tool", "two")
    add_message(state, "user", "three")
    first = SaveBatch("alice", state.task_id, conversation, 1,
                      [dict(m) for m in state.conversation.unsaved], save_id="s1")
    await store.save(first)
    again = SaveBatch("alice", state.task_id, conversation, 1,
                      [*(dict(m) for m in state.conversation.unsaved),
                       {"id": "later", "role": "assistant", "content": "four", "tokens": 1}],
                      save_id="s1")
    await store.save(again)
    assert [m["seq"] for m in again.messages] == [2, 3, 4, 5]
    turns = [("user", "q"), ("assistant", "one"), ("tool", "two"), ("user", "three"),
             ("assistant", "four")]
    assert db.execute("SELECT seq, role, content FROM conversation_messages ORDER BY seq"
                      ).fetchall() == [(s, r, t) for s, (r, t) in enumerate(turns, start=1)]
    assert db.execute("SELECT message_count, turns_digest FROM conversations").fetchone() == (
        5, _digest(turns))


async def test_a_refused_completion_keeps_its_task_and_writes_nothing(
        store: SQLiteStore, db: sqlite3.Connection) -> None:
    state = await State.start_task("q", "alice", store=store, record_query=True)
    conversation = state.conversation.conversation_id
    before = db.execute("SELECT message_count, turns_digest, updated_at FROM conversations"
                        ).fetchone()
    with pytest.raises(ConflictError):
        await store.save(SaveBatch(
            "alice", state.task_id, conversation, 7,
            [{"id": "a", "role": "assistant", "content": "late", "tokens": 1}],
            complete=True, save_id="s1",
            approvals=[{"id": "call_1", "name": "x", "args": {}}]))
    assert db.execute("SELECT task_id, version FROM task_workspaces").fetchall() == [
        (state.task_id, 1)]
    assert db.execute("SELECT content FROM conversation_messages").fetchall() == [("q",)]
    assert db.execute("SELECT message_count, turns_digest, updated_at FROM conversations"
                      ).fetchone() == before
    assert db.execute("SELECT count(*) FROM task_approvals").fetchone() == (0,)


async def _window(store: SQLiteStore, query: str, conversation: str) -> list[Any]:
    state = await State.start_task(query, "alice", conversation, store=store,
                                   record_query=True)
    await state.complete_task()
    return [(m["seq"], m["content"]) for m in state.execution.messages]


async def test_a_turn_on_a_conversation_erased_elsewhere_reads_it_afresh(
        db_path: Path, db: sqlite3.Connection) -> None:
    """The turn's one statement reads the row with what checks the cached window: a
    conversation made again under its id, as long, is read afresh; one that is gone is
    made anew."""
    cached, other = SQLiteStore(db_path), SQLiteStore(db_path)
    try:
        for index in range(3):
            await _window(cached, f"old {index}", "chat")
        await Memory(store=other).forget("alice")
        for index in range(3):  # as many messages: only their created_at tells them apart
            await _window(other, f"new {index}", "chat")
        assert await _window(cached, "next", "chat") == [
            (1, "new 0"), (2, "new 1"), (3, "new 2"), (4, "next")]
        await Memory(store=other).forget("alice")
        assert await _window(cached, "alone", "chat") == [(1, "alone")]
        assert db.execute("SELECT message_count, turns_digest FROM conversations").fetchone() \
            == (1, _digest([("user", "alone")]))
    finally:
        await cached.close()
        await other.close()
