"""Durability of a run: failures, resume, cancellation and concurrent runners, seen in the rows."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from cogency import Agent, tool
from cogency.errors import ConflictError, NotFoundError, StorageError, TaskRunningError
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM


def reply(response=None, actions=(), **fields):
    return {"response": response, "actions": list(actions), **fields}


def call(name, **args):
    return {"name": name, "args": args}


def rows(db: sqlite3.Connection, conversation_id: str) -> list[tuple[int, str, str]]:
    return db.execute(
        "SELECT seq, role, content FROM conversation_messages WHERE conversation_id = ? "
        "ORDER BY seq",
        (conversation_id,),
    ).fetchall()


def assert_consistent(db: sqlite3.Connection, conversation_id: str) -> None:
    """Seqs run 1..n with no gap, the counter matches, every action has its results."""
    stored = rows(db, conversation_id)
    assert [seq for seq, _, _ in stored] == list(range(1, len(stored) + 1))
    count = db.execute(
        "SELECT message_count FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()[0]
    assert count == len(stored)
    for index, (_, role, content) in enumerate(stored):
        if role == "assistant" and content.startswith('{"actions"'):
            actions = json.loads(content)["actions"]
            following = stored[index + 1 : index + 1 + len(actions)]
            assert [r for _, r, _ in following] == ["tool"] * len(actions)
            assert [json.loads(c)["name"] for _, _, c in following] == [a["name"] for a in actions]


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted: {text}"


async def test_llm_failure_midway_then_resume_completes(store, db):
    llm = ScriptedLLM([
        reply(actions=[call("note", text="step one")], understanding="note first"),
        RuntimeError("provider down"),
        RuntimeError("provider still down"),
    ])
    agent = Agent(llm=llm, tools=[note], store=store, llm_retries=1, retry_delay=0)
    result = await agent.run("take notes", user_id="ada")

    assert result.stop_reason == "error" and result.response is None
    assert "provider still down" in result.error
    assert len(llm.calls) == 3  # the failing call was retried once
    [(task_id, data, runner)] = db.execute(
        "SELECT task_id, workspace_data, runner FROM task_workspaces"
    ).fetchall()
    assert task_id == result.task_id and runner is None
    assert json.loads(data)["understanding"] == "note first"
    assert [r for _, r, _ in rows(db, result.conversation_id)] == ["user", "assistant", "tool"]

    llm.extend([reply("Noted step one.", understanding="done")])
    events = [e async for e in agent.resume_stream(result.task_id, user_id="ada")]
    assert events[0].type == "start" and events[0].resumed
    assert events[-1].stop_reason == "completed"
    sent = llm.calls[-1]
    assert "understanding: note first" in sent[0]["content"]
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "user"]
    assert "noted: step one" in sent[-1]["content"]
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)
    stored = rows(db, result.conversation_id)
    assert [r for _, r, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[-1][2] == "Noted step one."
    assert_consistent(db, result.conversation_id)


async def test_resume_by_another_user_is_not_found(store, db):
    llm = ScriptedLLM([RuntimeError("down")])
    agent = Agent(llm=llm, store=store, llm_retries=0, retry_delay=0)
    result = await agent.run("secret plans", user_id="ada")
    assert result.stop_reason == "error"
    with pytest.raises(NotFoundError):
        await agent.resume(result.task_id, user_id="eve")
    assert len(llm.calls) == 1  # nothing was sent to the model for eve
    assert db.execute("SELECT user_id, runner FROM task_workspaces").fetchall() == [("ada", None)]
    with pytest.raises(NotFoundError):
        await agent.resume("no-such-task", user_id="ada")


async def test_workspace_row_is_saved_between_iterations(store, db, db_path):
    seen = []

    @tool
    def probe() -> str:
        """Read the task's stored row, as another process would."""
        with sqlite3.connect(db_path) as connection:
            data, version = connection.execute(
                "SELECT workspace_data, version FROM task_workspaces"
            ).fetchone()
            count = connection.execute("SELECT count(*) FROM conversation_messages").fetchone()
        seen.append((json.loads(data), version, count[0]))
        return "ok"

    llm = ScriptedLLM([
        reply(actions=[call("probe")], understanding="U1", approach="A1"),
        reply(actions=[call("probe")], understanding="U2"),
        reply("done", discoveries="D3"),
    ])
    result = await Agent(llm=llm, tools=[probe], store=store).run("inspect yourself")
    assert result.stop_reason == "completed"
    (first, v1, n1), (second, v2, n2) = seen
    assert first["understanding"] == "" and first["objective"] == "inspect yourself"
    assert n1 == 1  # the query was saved before the first step
    # Iteration 1 was saved before iteration 2 ran: its workspace and its messages.
    assert second == {"objective": "inspect yourself", "understanding": "U1",
                      "approach": "A1", "discoveries": ""}
    assert v2 > v1 and n2 == 3
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)


async def test_cancelled_mid_tool_leaves_a_consistent_resumable_task(store, db):
    started = asyncio.Event()

    @tool(timeout=30)
    async def slow(job: str) -> str:
        """A long job."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    llm = ScriptedLLM([reply(actions=[call("slow", job="a"), call("note", text="b")],
                             understanding="running the job")])
    agent = Agent(llm=llm, tools=[slow, note], store=store)
    events = []

    async def consume():
        async for event in agent.stream("run the job", user_id="ada"):
            events.append(event)

    run = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run

    task_id, conversation_id = events[0].task_id, events[0].conversation_id
    [(data, runner)] = db.execute("SELECT workspace_data, runner FROM task_workspaces").fetchall()
    assert runner is None  # released: resumable at once
    assert json.loads(data)["understanding"] == "running the job"
    stored = rows(db, conversation_id)
    assert [r for _, r, _ in stored] == ["user", "assistant", "tool", "tool"]
    results = [json.loads(c) for _, r, c in stored if r == "tool"]
    assert all(not r["ok"] and "cancelled" in r["error"] for r in results)
    assert_consistent(db, conversation_id)

    llm.extend([reply("Cancelled earlier; nothing ran to completion.")])
    done = await agent.resume(task_id, user_id="ada")
    assert done.stop_reason == "completed"
    assert llm.calls[-1][-1]["role"] == "user" and "cancelled" in llm.calls[-1][-1]["content"]
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)
    assert_consistent(db, conversation_id)


async def test_cancelled_during_a_save_keeps_no_duplicate(db_path, db):
    saved, gate = asyncio.Event(), asyncio.Event()

    class SlowAckStore(SQLiteStore):
        """Commits, then is slow to say so: a cancellation lands in between."""

        hold = False

        async def save(self, batch):
            version = await super().save(batch)
            if self.hold and any(m["role"] == "tool" for m in batch.messages):
                saved.set()
                await gate.wait()
            return version

    store = SlowAckStore(db_path)
    store.hold = True
    llm = ScriptedLLM([reply(actions=[call("note", text="x")], understanding="U1")])
    agent = Agent(llm=llm, tools=[note], store=store)
    run = asyncio.create_task(agent.run("write x", user_id="ada"))
    await asyncio.wait_for(saved.wait(), 5)
    run.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    [(conversation_id, runner)] = db.execute(
        "SELECT conversation_id, runner FROM task_workspaces"
    ).fetchall()
    assert runner is None
    assert [r for _, r, _ in rows(db, conversation_id)] == ["user", "assistant", "tool"]
    assert_consistent(db, conversation_id)
    await store.close()


async def test_a_second_runner_of_a_running_task_is_refused(store, db):
    started, release = asyncio.Event(), asyncio.Event()

    @tool(timeout=30)
    async def wait_here() -> str:
        """Blocks until the test lets it go."""
        started.set()
        await release.wait()
        return "released"

    llm = ScriptedLLM([reply(actions=[call("wait_here")]), reply("finished")])
    agent = Agent(llm=llm, tools=[wait_here], store=store)
    first = asyncio.create_task(agent.run("hold the task", user_id="ada"))
    await asyncio.wait_for(started.wait(), 5)
    [(task_id, runner)] = db.execute("SELECT task_id, runner FROM task_workspaces").fetchall()
    assert runner  # held while it runs

    other = Agent(llm=ScriptedLLM([]), store=store)
    with pytest.raises(TaskRunningError) as caught:
        await other.resume(task_id, user_id="ada")
    assert isinstance(caught.value, ConflictError)
    release.set()
    result = await first
    assert result.stop_reason == "completed" and result.response == "finished"
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)


async def test_storage_failure_propagates_and_frees_the_task(db_path, db):
    class FailingStore(SQLiteStore):
        fail_next = False

        async def save(self, batch):
            if self.fail_next:
                self.fail_next = False
                raise StorageError("disk full (simulated)")
            return await super().save(batch)

    store = FailingStore(db_path)

    @tool
    def arm() -> str:
        """Makes the next save fail."""
        store.fail_next = True
        return "armed"

    llm = ScriptedLLM([reply(actions=[call("arm")])])
    agent = Agent(llm=llm, tools=[arm], store=store)
    with pytest.raises(StorageError, match="disk full"):
        await agent.run("arm it", user_id="ada")
    [(task_id, runner)] = db.execute("SELECT task_id, runner FROM task_workspaces").fetchall()
    assert runner is None  # freed for resume despite the failure
    llm.extend([reply("recovered")])
    assert (await agent.resume(task_id, user_id="ada")).stop_reason == "completed"
    await store.close()
