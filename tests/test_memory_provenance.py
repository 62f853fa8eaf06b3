"""Memory you can audit: every entry's sources, history instead of overwrite, the user's
corrections, export/import, forget's receipt. Through ``Agent.run`` and ``Memory`` on SQLite
and PostgreSQL, asserting the rows."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from memory_replies import answer, insights

from cogency import Agent
from cogency._time import now
from cogency.errors import ConflictError, NotFoundError, UsageError
from cogency.memory import Memory
from cogency.testing import ScriptedLLM


def synthesis(**fields: Any) -> dict[str, Any]:
    """A consolidation reply (the learned fields, maps as pairs)."""
    reply: dict[str, Any] = {
        "preferences": [], "goals": [], "expertise_areas": [], "communication_style": "",
        "projects": [], "interests": [], "constraints": [], "success_patterns": [],
        "failure_patterns": [],
    }
    for key, value in fields.items():
        if isinstance(value, dict):
            value = [{"key": k, "value": v} for k, v in value.items()]
        reply[key] = value
    return reply


async def entries(raw: Any, user: str) -> list[dict[str, Any]]:
    rows = await raw(
        "SELECT entry_id, field, entry_key, value, origin, sources, superseded_at, "
        "superseded_by, reason, model FROM profile_entries WHERE user_id = ? "
        "ORDER BY created_at, rank", user)
    names = ("entry_id", "field", "key", "value", "origin", "sources", "superseded_at",
             "superseded_by", "reason", "model")
    found = [dict(zip(names, row)) for row in rows]
    for entry in found:
        entry["sources"] = json.loads(entry["sources"])
    return found


async def profile_data(raw: Any, user: str) -> dict[str, Any] | None:
    rows = await raw("SELECT profile_data FROM user_profiles WHERE user_id = ?", user)
    if not rows:
        return None
    data = rows[0][0]
    return json.loads(data) if isinstance(data, str) else data


async def run_and_learn(agent: Agent, query: str, user: str = "alice") -> Any:
    result = await agent.run(query, user)
    assert result.stop_reason == "completed"
    await agent.memory.settle()
    return result


async def test_every_entry_cites_real_message_ids_of_that_users_conversation(any_store, raw):
    learner = ScriptedLLM([insights(preferences={"editor": "helix"}, goals=["learn Zig"])])
    agent = Agent(llm=ScriptedLLM([answer("Zig is fun."), answer("hi bob")]), store=any_store,
                  memory=Memory(llm=learner))
    result = await run_and_learn(agent, "I use helix and I am learning Zig")
    await agent.run("hello", "bob")  # another user's conversation, for contrast
    await agent.close()

    stored = await entries(raw, "alice")
    assert {(e["field"], e["key"], e["value"]) for e in stored} == {
        ("preferences", "editor", "helix"), ("goals", "", "learn Zig")}
    mine = {row[0] for row in await raw(
        "SELECT m.message_id FROM conversation_messages m JOIN conversations c "
        "USING (conversation_id) WHERE c.user_id = ? AND m.conversation_id = ?",
        "alice", result.conversation_id)}
    bobs = {row[0] for row in await raw(
        "SELECT m.message_id FROM conversation_messages m JOIN conversations c "
        "USING (conversation_id) WHERE c.user_id = ?", "bob")}
    for entry in stored:
        assert entry["origin"] == "learned" and entry["model"] == "scripted"
        (source,) = entry["sources"]
        assert source["task_id"] == result.task_id
        assert source["conversation_id"] == result.conversation_id
        assert source["model"] == "scripted" and source["at"]
        # the query and the answer, both real rows of alice's conversation, none of bob's
        assert len(source["message_ids"]) == 2
        assert set(source["message_ids"]) <= mine and not set(source["message_ids"]) & bobs

    # explain() quotes what the user said there
    why = await Memory(store=any_store).explain("alice")
    quotes = [q["content"] for item in why for s in item["sources"] for q in s["quotes"]]
    assert quotes == ["I use helix and I am learning Zig"] * 2


async def test_a_contradiction_leaves_one_current_entry_and_one_superseded(any_store, raw):
    learner = ScriptedLLM([insights(preferences={"language": "Python"}),
                           insights(preferences={"language": "Rust"})])
    llm = ScriptedLLM([answer(), answer(), answer()])
    async with Agent(llm=llm, store=any_store, memory=Memory(llm=learner)) as agent:
        first = await run_and_learn(agent, "I write Python")
        second = await run_and_learn(agent, "I switched to Rust")
        await agent.run("what should I use?", "alice")
    stored = [e for e in await entries(raw, "alice") if e["key"] == "language"]
    current = [e for e in stored if e["superseded_at"] is None]
    old = [e for e in stored if e["superseded_at"] is not None]
    assert [e["value"] for e in current] == ["Rust"] and [e["value"] for e in old] == ["Python"]
    assert old[0]["superseded_by"] == current[0]["entry_id"] and old[0]["reason"] == "replaced"
    assert old[0]["sources"][0]["task_id"] == first.task_id
    assert current[0]["sources"][0]["task_id"] == second.task_id
    assert (await profile_data(raw, "alice"))["preferences"] == {"language": "Rust"}
    system = llm.calls[2][0]["content"]
    assert "language: Rust" in system and "Python" not in system  # history is out of the prompt
    history = await Memory(store=any_store).history("alice")
    assert [(e.value, e.reason) for e in history] == [("Python", "replaced")]


async def test_consolidation_keeps_the_sources_of_what_it_merged(any_store, raw):
    learner = ScriptedLLM([
        insights(goals=["ship the parser"]), insights(goals=["ship the lexer"]),
        insights(interests=["compilers"]),
        synthesis(goals=["ship the parser and lexer"], interests=["compilers"]),
    ])
    async with Agent(llm=ScriptedLLM([answer()] * 3), store=any_store,
                     memory=Memory(llm=learner)) as agent:
        tasks = [(await run_and_learn(agent, q)).task_id
                 for q in ("parser first", "then the lexer", "I like compilers")]
    stored = await entries(raw, "alice")
    merged = next(e for e in stored if e["value"] == "ship the parser and lexer")
    assert merged["origin"] == "consolidated" and merged["superseded_at"] is None
    assert {s["task_id"] for s in merged["sources"]} == set(tasks[:2])
    for value in ("ship the parser", "ship the lexer"):
        old = next(e for e in stored if e["value"] == value)
        assert old["reason"] == "consolidated" and old["superseded_by"] == merged["entry_id"]
    kept = next(e for e in stored if e["value"] == "compilers")  # unchanged: the same row
    assert kept["origin"] == "learned" and kept["superseded_at"] is None
    assert [s["task_id"] for s in kept["sources"]] == [tasks[2]]
    assert (await profile_data(raw, "alice"))["goals"] == ["ship the parser and lexer"]


async def test_a_users_correction_survives_ten_contradicting_learnings(any_store, raw):
    memory = Memory(store=any_store)
    mine = await memory.set_entry("alice", "preferences", "Rust", key="language")
    goal = await memory.set_entry("alice", "goals", "ship v2")
    wrong = insights(preferences={"language": "Python"}, goals=["abandon v2"],
                     communication_style="verbose")
    learner = ScriptedLLM([
        wrong, wrong, wrong,
        synthesis(preferences={"language": "Python"}, goals=["abandon v2"]),  # ignores the user
    ] * 4)
    llm = ScriptedLLM([answer()] * 11)
    async with Agent(llm=llm, store=any_store, memory=Memory(llm=learner)) as agent:
        for number in range(10):
            await run_and_learn(agent, f"task {number}: I use Python now")
        await agent.run("which language do I use?", "alice")
    data = await profile_data(raw, "alice")
    # ten learnings, and the question's own: eleven, every one saying Python
    assert data["preferences"] == {"language": "Rust"} and data["interaction_count"] == 11
    assert data["goals"][-1] == "ship v2"  # the user's entry comes last: the newest, quoted
    assert data["synthesis_version"] == 4  # consolidations ran, and kept it
    stored = await entries(raw, "alice")
    current = {e["entry_id"]: e for e in stored if e["superseded_at"] is None}
    assert current[mine.entry_id]["value"] == "Rust" and current[mine.entry_id]["origin"] == "user"
    assert current[goal.entry_id]["value"] == "ship v2"
    assert not [e for e in current.values() if e["key"] == "language" and e["value"] != "Rust"]
    overridden = [e for e in stored if e["reason"] == "overridden"]
    assert len(overridden) == 11 and all(e["superseded_by"] == mine.entry_id for e in overridden)
    system = llm.calls[-1][0]["content"]
    assert "language: Rust" in system and "language: Python" not in system
    assert "ship v2" in system
    consolidation = next(c[0]["content"] for c in learner.calls if "consolidate" in
                         c[0]["content"])
    assert '"set_by_user"' in consolidation and "leave it out of your reply" in consolidation


async def test_the_user_changes_and_removes_entries(any_store, raw):
    learner = ScriptedLLM([insights(goals=["learn Haskell"], interests=["chess"])])
    llm = ScriptedLLM([answer(), answer()])
    async with Agent(llm=llm, store=any_store, memory=Memory(llm=learner)) as agent:
        await run_and_learn(agent, "hello")
        memory = agent.memory
        (goal,) = [e for e in await memory.entries("alice") if e.field == "goals"]
        (chess,) = [e for e in await memory.entries("alice") if e.field == "interests"]
        fixed = await memory.set_entry("alice", "goals", "learn OCaml", replaces=goal.entry_id)
        removed = await memory.remove_entry("alice", chess.entry_id)
        assert removed.entry_id == chess.entry_id
        await agent.run("what now?", "alice")
    data = await profile_data(raw, "alice")
    assert data["goals"] == ["learn OCaml"] and data["interests"] == []
    stored = {e["entry_id"]: e for e in await entries(raw, "alice")}
    assert stored[goal.entry_id]["reason"] == "changed"
    assert stored[goal.entry_id]["superseded_by"] == fixed.entry_id
    assert stored[chess.entry_id]["reason"] == "removed"
    system = llm.calls[1][0]["content"]
    assert "learn OCaml" in system and "Haskell" not in system and "chess" not in system

    memory = Memory(store=any_store)
    with pytest.raises(NotFoundError, match="no current profile entry"):
        await memory.remove_entry("alice", chess.entry_id)  # history, not current
    with pytest.raises(NotFoundError):
        await memory.remove_entry("bob", fixed.entry_id)  # another user's entry
    with pytest.raises(UsageError, match="need a key"):
        await memory.set_entry("alice", "preferences", "dark")
    with pytest.raises(UsageError, match="field must be one of"):
        await memory.set_entry("alice", "secrets", "x")
    with pytest.raises(UsageError, match="at most 500"):
        await memory.set_entry("alice", "goals", "x" * 501)
    for number in range(9):
        await memory.set_entry("alice", "goals", f"goal {number}")
    with pytest.raises(UsageError, match="at most 10 entries of yours"):
        await memory.set_entry("alice", "goals", "one too many")
    assert await raw("SELECT COUNT(*) FROM profile_entries WHERE user_id = 'bob'") == [(0,)]


async def test_history_older_than_the_retention_is_pruned(any_store, raw, raw_write):
    learner = ScriptedLLM([insights(preferences={"city": "Paris"}),
                           insights(preferences={"city": "Berlin"}),
                           insights(preferences={"city": "Rome"}),
                           synthesis(preferences={"city": "Rome"})])
    memory = Memory(llm=learner, history_days=30)
    async with Agent(llm=ScriptedLLM([answer()] * 3), store=any_store, memory=memory) as agent:
        await run_and_learn(agent, "Paris")
        await run_and_learn(agent, "Berlin")
        await run_and_learn(agent, "Rome")
        old = (now() - timedelta(days=31)).isoformat()
        await raw_write("UPDATE profile_entries SET superseded_at = ? WHERE value = 'Paris'", old)
        await agent.memory.catch_up()  # what every sweep does (each run's process, each minute)
    values = sorted(row[0] for row in await raw("SELECT value FROM profile_entries"))
    assert values == ["Berlin", "Rome"]  # Paris's history is gone, Berlin's kept
    assert await any_store.prune_history(now() + timedelta(days=1)) == 1  # then Berlin's


async def test_export_forget_import_restores_the_same_profile_and_conversations(any_store, raw):
    learner = ScriptedLLM([insights(goals=["finish the thesis"], preferences={"tone": "brief"}),
                           insights(preferences={"tone": "warm"})])
    llm = ScriptedLLM([answer("first"), answer("second"),
                       {"secure": True, "response": None, "actions": []}])
    memory = Memory(llm=learner)
    async with Agent(llm=llm, store=any_store, memory=memory, max_iterations=1) as agent:
        first = await run_and_learn(agent, "my thesis is due")
        await run_and_learn(agent, "be warmer please")
        unfinished = await agent.run("and this never ends", "alice", first.conversation_id)
        assert unfinished.stop_reason == "max_iterations"
        await agent.memory.set_entry("alice", "interests", "origami")

    def snapshot_sql() -> list[str]:
        return [
            "SELECT profile_data FROM user_profiles WHERE user_id = 'alice'",
            "SELECT entry_id, field, entry_key, value, origin, sources, rank, superseded_at, "
            "superseded_by, reason FROM profile_entries ORDER BY entry_id",
            "SELECT conversation_id, conversation_data, message_count FROM conversations "
            "ORDER BY conversation_id",
            "SELECT conversation_id, seq, role, content, task_id, tokens, created_at, message_id "
            "FROM conversation_messages ORDER BY conversation_id, seq",
            "SELECT task_id, conversation_id, query, workspace_data, version FROM task_workspaces",
        ]

    before = [await raw(sql) for sql in snapshot_sql()]
    document = await Memory(store=any_store).export_user("alice")
    text = json.dumps(document)  # plain JSON
    receipt = await Memory(store=any_store).forget("alice")
    assert receipt.conversations == 2 and receipt.tasks == 1
    assert all(rows == [] for rows in [await raw(sql) for sql in snapshot_sql()])

    restored = await Memory(store=any_store).import_user(json.loads(text))
    assert restored == {"profiles": 1, "entries": 3, "history": 1, "conversations": 2,
                        "messages": receipt.messages, "tasks": 1, "approvals": 0,
                        "pending_learning": 0}
    after = [await raw(sql) for sql in snapshot_sql()]
    assert after == before
    # and it works as before: the unfinished task resumes in its conversation
    again = Agent(llm=ScriptedLLM([answer("resumed")]), store=any_store)
    result = await again.resume(unfinished.task_id, "alice")
    assert result.response == "resumed" and result.conversation_id == first.conversation_id
    await again.close()

    with pytest.raises(ConflictError, match="already holds data of this user"):
        await Memory(store=any_store).import_user(document)
    # as another user, the ids are alice's: refused, plainly, nothing written (on
    # PostgreSQL alice's rows are invisible to mallory's statements: the key says it)
    conversation = document["conversations"][0]["conversation_id"]
    with pytest.raises(ConflictError, match=f"conversation '{conversation}' of the export "
                                            "belongs to another user"):
        await Memory(store=any_store).import_user(document, user_id="mallory")
    assert await raw("SELECT COUNT(*) FROM user_profiles WHERE user_id = 'mallory'") == [(0,)]
    with pytest.raises(UsageError, match="format"):
        await Memory(store=any_store).import_user({"user_id": "x"})
    broken = json.loads(text)
    broken["user_id"] = "zed"
    broken["conversations"][0]["messages"][0]["role"] = "root"
    with pytest.raises(UsageError, match="role"):
        await Memory(store=any_store).import_user(broken)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


async def test_an_import_keeps_client_tool_calls_and_turns_and_counts_tokens_itself(
        any_store, raw):
    from cogency.storage.base import turns_digest
    from cogency.tokens import count_tokens, most_tokens

    llm = ScriptedLLM([answer("hello back"),
                       {"secure": True, "response": None,
                        "actions": [{"name": "get_weather", "args": {"city": "Oslo"}}]},
                       answer("Oslo: sunny.")])
    async with Agent(llm=llm, store=any_store) as agent:
        said = await agent.run("hello", "alice")
        paused = await agent.run("weather?", "alice", client_tools=[WEATHER])
        [waiting] = paused.tool_calls
        # the client's result, recorded before the task resumes (decider "client")
        await any_store.decide_approvals(paused.task_id, "alice", {waiting["id"]: "sunny"})
    memory = Memory(store=any_store)
    document = await memory.export_user("alice")
    [(task)] = document["tasks"]
    assert [(c["decider"], c["status"], c["output"]) for c in task["approvals"]] == [
        ("client", "answered", "sunny")]
    await memory.forget("alice")
    # A hostile document may say any count: kept only when it is the bound a store keeps
    # (the text's UTF-8 length), else counted; never one below the text's.
    long = "word " * 400
    chat = next(c for c in document["conversations"]
                if c["conversation_id"] == said.conversation_id)
    chat["messages"][0]["content"] = long
    chat["messages"][0]["tokens"] = 1
    chat["messages"][1]["tokens"] = most_tokens(chat["messages"][1]["content"])
    await memory.import_user(document)
    rows = await raw("SELECT content, tokens FROM conversation_messages WHERE "
                     "conversation_id = ? ORDER BY seq", said.conversation_id)
    assert rows == [(long, count_tokens(long)), ("hello back", most_tokens("hello back"))]
    assert await raw("SELECT call_id, status, decider, output FROM task_approvals") == [
        (waiting["id"], "answered", "client", "sunny")]
    # the imported conversation is found by its turns, as a resent chat history finds it
    digest = turns_digest([("user", long), ("assistant", "hello back")])
    assert await any_store.find_conversation_by_turns("alice", digest) == said.conversation_id
    # and the task goes on with the client's result
    async with Agent(llm=ScriptedLLM([answer("Oslo: sunny.")]), store=any_store) as agent:
        done = await agent.resume(paused.task_id, "alice")
    assert done.response == "Oslo: sunny."
    [(content,)] = await raw("SELECT content FROM conversation_messages WHERE role = 'tool'")
    assert json.loads(content)["output"] == "sunny"


async def test_forgets_receipt_matches_the_rows_that_were_there(any_store, raw):
    learner = ScriptedLLM([insights(goals=["a"]), insights(goals=["b"]), insights()])
    llm = ScriptedLLM([answer(), answer(), answer("bob's"),
                       {"secure": True, "response": None,
                        "actions": [{"name": "write_note", "args": {"text": "x"}}]}])
    from cogency import tool

    @tool(needs_approval=True)
    def write_note(text: str) -> str:
        """Write a note."""
        return "written"

    async with Agent(llm=llm, tools=[write_note], store=any_store,
                     memory=Memory(llm=learner)) as agent:
        first = await run_and_learn(agent, "one")
        await run_and_learn(agent, "two")
        await agent.run("bob here", "bob")
        paused = await agent.run("write it", "alice", first.conversation_id)
        assert paused.stop_reason == "awaiting_approval"
    # one more task queued for learning, never learned (as if its process died)
    from cogency.state import State

    state = await State.start_task("queued", "alice", store=any_store, record_query=True)
    await state.complete_task(learn=True)

    async def count(sql: str) -> int:
        return (await raw(sql, "alice"))[0][0]

    expected = {
        "profiles": await count("SELECT COUNT(*) FROM user_profiles WHERE user_id = ?"),
        "entries": await count("SELECT COUNT(*) FROM profile_entries WHERE user_id = ? "
                               "AND superseded_at IS NULL"),
        "history": await count("SELECT COUNT(*) FROM profile_entries WHERE user_id = ? "
                               "AND superseded_at IS NOT NULL"),
        "conversations": await count("SELECT COUNT(*) FROM conversations WHERE user_id = ?"),
        "messages": await count("SELECT COUNT(*) FROM conversation_messages m JOIN "
                                "conversations c USING (conversation_id) WHERE c.user_id = ?"),
        "tasks": await count("SELECT COUNT(*) FROM task_workspaces WHERE user_id = ?"),
        "approvals": await count("SELECT COUNT(*) FROM task_approvals WHERE user_id = ?"),
    }
    queued = await raw("SELECT tasks FROM learning_queue WHERE user_id = ?", "alice")
    expected["pending_learning"] = len(json.loads(queued[0][0]))
    assert expected == {"profiles": 1, "entries": 2, "history": 0, "conversations": 3,
                        "messages": 7, "tasks": 1, "approvals": 1, "pending_learning": 1}
    receipt = await Memory(store=any_store).forget("alice")
    assert receipt.erased() == expected
    assert receipt.generation == 1 and receipt.user_id == "alice"
    for table in ("user_profiles", "profile_entries", "conversations", "task_workspaces",
                  "task_approvals", "learning_queue"):
        assert await raw(f"SELECT COUNT(*) FROM {table} WHERE user_id = ?", "alice") == [(0,)]
    assert (await Memory(store=any_store).forget("alice")).erased() == dict.fromkeys(expected, 0)
    assert await raw("SELECT COUNT(*) FROM conversations WHERE user_id = 'bob'") == [(1,)]


async def test_memory_off_writes_nothing_for_memory(any_store, raw):
    async with Agent(llm=ScriptedLLM([answer()] * 3), store=any_store) as agent:
        for query in ("one", "two", "three"):
            await agent.run(query, "alice")
    assert await raw("SELECT COUNT(*) FROM learning_queue") == [(0,)]
    assert await raw("SELECT COUNT(*) FROM profile_entries") == [(0,)]
    # nor with a model too small to learn (it is not asked, nothing is queued for it)
    small = ScriptedLLM([answer()])
    small.learns = False  # type: ignore[attr-defined]
    async with Agent(llm=small, store=any_store, memory=True) as agent:
        await agent.run("four", "alice")
    assert await raw("SELECT COUNT(*) FROM learning_queue") == [(0,)]


async def test_a_thousand_quick_tasks_leave_at_most_one_queued_row(any_store, raw):
    from cogency.storage import SQLiteStore

    tasks = 1000 if isinstance(any_store, SQLiteStore) else 60  # the same code, fewer round trips
    gate, learning = asyncio.Event(), asyncio.Event()

    async def stuck(messages: list[dict[str, Any]]) -> dict[str, Any]:
        learning.set()
        await gate.wait()
        return insights(goals=["batched"])

    learner = ScriptedLLM([stuck, stuck, synthesis(goals=["batched"])])
    agent = Agent(llm=ScriptedLLM([answer()] * tasks), store=any_store,
                  memory=Memory(llm=learner, settle_timeout=5))
    memory = agent.memory
    for number in range(tasks):
        await agent.run(f"quick {number}", "alice")
        if number == 0:  # the first task is claimed and being learned before the next runs
            await asyncio.wait_for(learning.wait(), 10)
    rows = await raw("SELECT tasks, claimed, dropped FROM learning_queue")
    assert len(rows) == 1  # one row for the user, however many tasks
    queued, claimed, dropped = json.loads(rows[0][0]), json.loads(rows[0][1]), rows[0][2]
    assert len(claimed) == 1  # the first task, being learned (the model is stuck)
    assert len(queued) == 20 and dropped == tasks - 20 - 1  # bounded: the newest 20 kept
    assert [t["task_id"] for t in queued] == [
        row[0] for row in await raw(
            "SELECT task_id FROM conversation_messages WHERE role = 'user' ORDER BY "
            "created_at DESC, seq DESC LIMIT 20")][::-1]
    status = await memory.status("alice")
    assert status.pending == 21 and status.dropped == tasks - 21 and status.claimed
    assert len(learner.calls) == 1 and memory.learning("alice") is not None
    gate.set()
    await agent.close()
    data = await profile_data(raw, "alice")
    assert data["interaction_count"] == 21  # the claimed one, then the 20 kept, coalesced
    assert len(learner.calls) == 3  # the 20 in one extraction call (then a consolidation)
    assert learner.calls[1][0]["content"].count("<interaction>") == 20
    assert await raw("SELECT COUNT(*) FROM learning_queue") == [(0,)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_profile_learned_before_entries_existed_becomes_entries(backend, tmp_path):
    """Opening a database of the previous schema adopts each stored profile's values as
    entries (no sources: learned before they were kept), which then change like any other."""
    import sqlite3

    from cogency.memory import Profile
    from cogency.storage import open_store

    old = Profile("ann", preferences={"editor": "vim"}, goals=["write a book"],
                  interaction_count=4)
    data = json.dumps(old.to_dict())
    if backend == "sqlite":
        from cogency.storage.sqlite import migrate

        where = str(tmp_path / "old.db")
        connection = sqlite3.connect(where, isolation_level=None)
        migrate(connection, upto="m013_row_level_security")
        connection.execute("INSERT INTO user_profiles (user_id, profile_data) VALUES ('ann', ?)",
                           (data,))
        connection.close()
        await _adopted(open_store(where))
        return
    import asyncpg
    import pgutil

    from cogency.storage import postgres

    async with pgutil.fresh_database() as where:
        connection = await asyncpg.connect(where)
        try:
            await postgres.migrate(connection, upto="m013_row_level_security")
            await connection.execute(
                "INSERT INTO user_profiles (user_id, profile_data) VALUES ('ann', $1)", data)
        finally:
            await connection.close()
        await _adopted(open_store(where))


async def _adopted(store: Any) -> None:
    try:
        memory = Memory(store=store)
        entries = await memory.entries("ann")
        assert {(e.field, e.key, e.value, e.origin) for e in entries} == {
            ("preferences", "editor", "vim", "learned"), ("goals", "", "write a book", "learned")}
        assert all(e.sources == [] for e in entries)
        learner = ScriptedLLM([insights(preferences={"editor": "helix"})])
        async with Agent(llm=ScriptedLLM([answer()]), store=store,
                         memory=Memory(llm=learner)) as agent:
            await run_and_learn(agent, "I use helix now", "ann")
        (vim,) = await memory.history("ann")
        assert vim.value == "vim" and vim.reason == "replaced"
        profile = await memory.profile("ann")
        assert profile.preferences == {"editor": "helix"} and profile.interaction_count == 5
        assert profile.goals == ["write a book"]
    finally:
        await store.close()
