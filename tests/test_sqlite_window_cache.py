"""The SQLite store keeps recent conversation windows so a turn reads only new rows; the
windows it returns must always equal a fresh read, whoever wrote in between."""

from __future__ import annotations

from pathlib import Path

from cogency.memory import Memory
from cogency.state import State, add_message, autosave
from cogency.storage import SQLiteStore


async def _turns(state: State, count: int, text: str) -> None:
    for index in range(count):
        add_message(state, "user", f"{text} {index}")
        await autosave(state)


async def _fresh_window(path: Path, conversation_id: str, budget: int) -> list[tuple]:
    fresh = SQLiteStore(path)
    try:
        rows = await fresh.load_messages(conversation_id, "alice", token_budget=budget)
    finally:
        await fresh.close()
    return [(m["seq"], m["content"]) for m in rows]


async def test_window_sees_rows_written_by_another_store(db_path: Path) -> None:
    cached, other = SQLiteStore(db_path), SQLiteStore(db_path)
    try:
        state = await State.start_task("q", "alice", store=cached)
        conversation_id = state.conversation.conversation_id
        await _turns(state, 30, "first words here")
        budget = 60
        before = await cached.load_messages(conversation_id, "alice", token_budget=budget)
        assert [(m["seq"], m["content"]) for m in before] == await _fresh_window(
            db_path, conversation_id, budget
        )
        second = await State.start_task("q2", "alice", conversation_id, store=other)
        await _turns(second, 7, "written elsewhere")
        after = await cached.load_messages(conversation_id, "alice", token_budget=budget)
        expected = await _fresh_window(db_path, conversation_id, budget)
        assert [(m["seq"], m["content"]) for m in after] == expected
        assert expected[-1][1] == "written elsewhere 6"
        assert sum(m["tokens"] for m in after) <= budget
        smaller = await cached.load_messages(conversation_id, "alice", token_budget=10)
        assert [(m["seq"], m["content"]) for m in smaller] == await _fresh_window(
            db_path, conversation_id, 10
        )
    finally:
        await cached.close()
        await other.close()


async def test_window_of_an_erased_and_recreated_conversation_is_read_afresh(
    db_path: Path,
) -> None:
    cached, other = SQLiteStore(db_path), SQLiteStore(db_path)
    try:
        state = await State.start_task("q", "alice", "chat", store=cached)
        await _turns(state, 5, "old")
        assert len(await cached.load_messages("chat", "alice", token_budget=1000)) == 5
        await Memory(store=other).forget("alice")  # another process erases everything
        again = await State.start_task("q", "alice", "chat", store=other)
        await _turns(again, 6, "new")
        window = await cached.load_messages("chat", "alice", token_budget=1000)
        assert [m["content"] for m in window] == [f"new {i}" for i in range(6)]
    finally:
        await cached.close()
        await other.close()
