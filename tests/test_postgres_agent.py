"""Agent.run / resume on PostgreSQL, seen in the rows: history, resume, one runner per task."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pgutil
import pytest

from cogency import Agent, tool
from cogency.errors import TaskRunningError
from cogency.storage import PostgresStore, open_store
from cogency.testing import ScriptedLLM


def reply(response=None, actions=(), **fields):
    return {"response": response, "actions": list(actions), **fields}


def call(name, **args):
    return {"name": name, "args": args}


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def messages(store: PostgresStore, conversation_id: str) -> list[tuple[int, str, str]]:
    rows = await pgutil.raw_rows(store)(
        "SELECT seq, role, content FROM conversation_messages WHERE conversation_id = ? "
        "ORDER BY seq",
        conversation_id,
    )
    return [(seq, role, content) for seq, role, content in rows]


async def test_run_with_a_tool_stores_the_conversation_and_drops_the_workspace(pg, observer):
    llm = ScriptedLLM([
        reply(actions=[call("lookup", key="k1")], secure=True, objective="find k1"),
        reply("k1 is value of k1"),
    ])
    result = await Agent(llm=llm, tools=[lookup], store=pg).run("what is k1?", user_id="ada")

    assert (result.response, result.stop_reason, result.iterations) == (
        "k1 is value of k1", "completed", 2,
    )
    stored = await messages(pg, result.conversation_id)
    assert [(seq, role) for seq, role, _ in stored] == [
        (1, "user"), (2, "assistant"), (3, "tool"), (4, "assistant"),
    ]
    assert stored[0][2] == "what is k1?"
    assert json.loads(stored[1][2]) == {"actions": [call("lookup", key="k1")]}
    assert json.loads(stored[2][2])["output"] == "value of k1"
    assert stored[3][2] == "k1 is value of k1"
    raw = pgutil.raw_rows(pg)
    assert await raw("SELECT user_id, message_count FROM conversations") == [("ada", 4)]
    assert await raw("SELECT task_id FROM task_workspaces") == []
    assert [r[0] for r in await raw("SELECT user_id FROM user_profiles")] == ["ada"]
    # The completed run's row is gone with its lease; no session lock ever held it.
    assert await observer.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND d.datname = current_database()") == 0

    # The next task of the conversation sees the history.
    llm2 = ScriptedLLM([reply("you asked about k1")])
    again = await Agent(llm=llm2, store=pg).run("what did I ask?", "ada", result.conversation_id)
    assert again.response == "you asked about k1"
    chat = [m["content"] for m in llm2.calls[0][1:]]
    assert chat[0] == "what is k1?" and chat[-1] == "what did I ask?"
    assert len(await messages(pg, result.conversation_id)) == 6


async def test_an_unfinished_task_is_resumed_by_another_store(pg):
    llm = ScriptedLLM([reply(actions=[call("lookup", key="a")], understanding="need a")])
    stopped = await Agent(llm=llm, tools=[lookup], store=pg, max_iterations=1).run(
        "find a", user_id="ada"
    )
    assert stopped.stop_reason == "max_iterations"
    raw = pgutil.raw_rows(pg)
    [(task_id, runner, workspace)] = await raw(
        "SELECT task_id, runner, workspace_data FROM task_workspaces"
    )
    assert task_id == stopped.task_id and runner is None  # released, kept for resume
    assert json.loads(workspace)["understanding"] == "need a"

    other = open_store(pg.dsn)  # another process would open its own store the same way
    try:
        llm2 = ScriptedLLM([reply("a is value of a")])
        resumed = await Agent(llm=llm2, tools=[lookup], store=other).resume(task_id, "ada")
    finally:
        await other.close()
    assert (resumed.response, resumed.stop_reason) == ("a is value of a", "completed")
    assert "need a" in llm2.calls[0][0]["content"]  # the workspace came back
    assert await raw("SELECT task_id FROM task_workspaces") == []
    stored = await messages(pg, stopped.conversation_id)
    assert [role for _, role, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert [c for _, r, c in stored if r == "user"] == ["find a"]  # the query, once


async def test_a_second_resume_of_a_running_task_is_refused(pg, observer):
    stopped = await Agent(
        llm=ScriptedLLM([reply(actions=[call("lookup", key="x")])]), tools=[lookup], store=pg,
        max_iterations=1,
    ).run("q", user_id="ada")
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def slow(key: str) -> str:
        """Wait until released."""
        entered.set()
        await release.wait()
        return "slow done"

    first = Agent(
        llm=ScriptedLLM([reply(actions=[call("slow", key="y")]), reply("finished")]),
        tools=[slow], store=pg,
    )
    running = asyncio.create_task(first.resume(stopped.task_id, "ada"))
    await asyncio.wait_for(entered.wait(), 10)
    other = PostgresStore(pg.dsn)
    try:
        for store in (other, pg):  # another process's store, and this one
            second = Agent(llm=ScriptedLLM([reply("never")]), store=store)
            with pytest.raises(TaskRunningError, match="is running"):
                await second.resume(stopped.task_id, "ada")
        release.set()
        result = await running
        assert (result.response, result.stop_reason) == ("finished", "completed")
        assert await pgutil.raw_rows(pg)("SELECT task_id FROM task_workspaces") == []
    finally:
        release.set()
        await other.close()


async def test_concurrent_runs_on_one_conversation_keep_every_message_in_order(pg):
    first = await Agent(llm=ScriptedLLM([reply("ok 0")]), store=pg).run("m0", user_id="ada")
    conversation = first.conversation_id

    async def one(index: int) -> None:
        llm = ScriptedLLM([
            reply(actions=[call("lookup", key=f"k{index}")]), reply(f"ok {index}"),
        ], delay=0.01)
        await Agent(llm=llm, tools=[lookup], store=pg).run(f"m{index}", "ada", conversation)

    await asyncio.gather(*(one(i) for i in range(1, 9)))
    stored = await messages(pg, conversation)
    assert [seq for seq, _, _ in stored] == list(range(1, 2 + 8 * 4 + 1))
    for index in range(1, 9):
        assert [c for _, r, c in stored if r == "user" and c == f"m{index}"] == [f"m{index}"]
        assert sum(1 for _, _, c in stored if c == f"ok {index}") == 1
    assert await pgutil.raw_rows(pg)("SELECT task_id FROM task_workspaces") == []


async def test_a_one_step_turn_is_two_round_trips(pg):
    """Starting the task (its lease, its query and the new history) is one statement, and
    completing it (fenced, idempotent) another: counted at the driver, as the benchmark does."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.bench_postgres import round_trips

    assert await round_trips(pg.dsn) == {"begin_task": 1, "save": 1, "total": 2}


async def test_with_memory_on_a_completion_queues_its_learning_in_its_one_statement():
    """Memory on adds the profile read for the prompt; the completion still is one statement,
    which also queues the task for learning (in a transaction of its own statements it took
    five round trips)."""
    import pgutil

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.bench_postgres import round_trips

    import asyncpg

    async with pgutil.fresh_database(as_app=True) as dsn:  # row-level security on
        assert await round_trips(dsn, memory=True) == {
            "begin_task": 1, "load_profile": 1, "save": 1, "total": 3}
        # each of the 4 turns was queued, then learned (after it was counted)
        db = await asyncpg.connect(pgutil.dsn_for(dsn.rsplit("/", 1)[1]))  # as the admin
        try:
            data = await db.fetchval(
                "SELECT profile_data::text FROM user_profiles WHERE user_id = 'alice'")
            left = await db.fetchval("SELECT count(*) FROM learning_queue")
        finally:
            await db.close()
    assert json.loads(data)["interaction_count"] == 4 and left == 0
