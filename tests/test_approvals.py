"""Approvals through Agent.run/resume: a call that needs a person waits in the database."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cogency import Agent, Tool, tool
from cogency.errors import ApprovalRequiredError, ConflictError, NotFoundError, UsageError
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tools import files_tools, http_tool, shell_tool


def reply(response=None, actions=(), **fields):
    return {"response": response, "actions": list(actions), **fields}


def call(name, **args):
    return {"name": name, "args": args}


def make_tools(ran: list[str]) -> list[Tool]:
    @tool(needs_approval=True)
    def write_note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return f"wrote {text}"

    @tool
    def read_note() -> str:
        """Read the notes."""
        ran.append("read")
        return "notes: " + ", ".join(ran)

    return [write_note, read_note]


def approvals_rows(db: sqlite3.Connection) -> list[tuple]:
    return db.execute(
        "SELECT task_id, call_id, status, call_data FROM task_approvals ORDER BY position"
    ).fetchall()


def tool_results(db: sqlite3.Connection) -> list[dict]:
    return [json.loads(c) for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY seq")]


def test_built_ins_need_approval_when_they_change_something(tmp_path: Path):
    by_name = {t.name: t for t in files_tools(tmp_path)}
    assert {n for n, t in by_name.items() if t.needs_approval} == {"file_write", "file_edit"}
    assert shell_tool(tmp_path, sandbox=False).needs_approval is True
    assert http_tool().needs_approval is False


async def test_needs_approval_rule_of_the_args_fails_closed():
    def outside_tmp(args):
        return not args["path"].startswith("tmp/")

    @tool(needs_approval=outside_tmp)
    def save(path: str) -> str:
        """Save."""
        return path

    assert await save.requires_approval({"path": "tmp/a"}) is False
    assert await save.requires_approval({"path": "etc/a"}) is True
    broken = Tool("b", "b", {"type": "object"}, lambda: 1, needs_approval=lambda args: args["x"])
    assert await broken.requires_approval({}) is True  # the rule raised: ask
    vague = Tool("v", "v", {"type": "object"}, lambda: 1, needs_approval=lambda args: None)
    assert await vague.requires_approval({}) is True  # only False lets a call through
    with pytest.raises(Exception, match="needs_approval must be"):
        Tool("x", "x", {"type": "object"}, lambda: 1, needs_approval="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="approve must be"):
        Agent(llm=ScriptedLLM([]), store=":memory:", approve="yes")  # type: ignore[arg-type]


async def test_pause_lists_the_call_runs_the_rest_and_survives_until_approved(store, db):
    ran: list[str] = []
    llm = ScriptedLLM([
        reply(actions=[call("write_note", text="hello"), call("read_note")],
              understanding="write then read"),
        reply("Wrote hello."),
    ])
    agent = Agent(llm=llm, tools=make_tools(ran), store=store)
    events = []
    async for event in agent.stream("note hello", user_id="ada"):
        if event.type == "approval":  # already stored: it can be decided as soon as it is seen
            assert approvals_rows(db)[0][1] == event.id
        events.append(event)
    types = [e.type for e in events]
    assert types[-2:] == ["approval", "end"] and events[-1].stop_reason == "awaiting_approval"
    assert ran == ["read"]  # the call that needs no approval ran; the other waits
    approval = events[-2]

    [(task_id, call_id, status, data)] = approvals_rows(db)
    assert (call_id, status) == (approval.id, "pending") and task_id == approval.task_id
    assert json.loads(data) == {"name": "write_note", "args": {"text": "hello"}}
    [(workspace,)] = db.execute("SELECT workspace_data FROM task_workspaces").fetchall()
    assert json.loads(workspace)["understanding"] == "write then read"  # the step is saved
    assert [r["name"] for r in tool_results(db)] == ["read_note"]
    [task] = await store.list_tasks("ada")
    assert [(p["id"], p["name"], p["args"], p["status"]) for p in task.pending_approvals] == [
        (call_id, "write_note", {"text": "hello"}, "pending")]

    # Resuming without deciding: a clear error that names the call; nothing ran, nothing lost.
    with pytest.raises(ApprovalRequiredError, match=call_id) as caught:
        await agent.resume(task_id, user_id="ada")
    assert [p["id"] for p in caught.value.pending] == [call_id]
    with pytest.raises(NotFoundError, match="no call 'call_nope'"):
        await agent.resume(task_id, user_id="ada", approvals={"call_nope": True})
    with pytest.raises(NotFoundError):  # another user's task does not exist for them
        await agent.resume(task_id, user_id="eve", approvals={call_id: True})
    assert ran == ["read"] and approvals_rows(db)[0][2] == "pending"

    result = await agent.resume(task_id, user_id="ada", approvals={call_id: True})
    assert result.stop_reason == "completed" and result.response == "Wrote hello."
    assert ran == ["read", "hello"]  # ran exactly once
    assert [r["name"] for r in tool_results(db)] == ["read_note", "write_note"]
    assert tool_results(db)[1]["output"] == "wrote hello"
    assert "wrote hello" in json.dumps(llm.calls[-1])  # the model saw the result
    assert db.execute("SELECT COUNT(*) FROM task_approvals").fetchone() == (0,)  # with the task
    assert await store.list_tasks("ada") == []


async def test_denied_call_never_runs_and_the_model_is_told(store, db):
    ran: list[str] = []
    llm = ScriptedLLM([reply(actions=[call("write_note", text="x")]), reply("Understood.")])
    agent = Agent(llm=llm, tools=make_tools(ran), store=store)
    paused = await agent.run("note x", user_id="ada")
    assert paused.stop_reason == "awaiting_approval"
    [pending] = paused.pending_approvals
    assert pending["name"] == "write_note" and pending["args"] == {"text": "x"}

    result = await agent.resume(paused.task_id, user_id="ada",
                                approvals={pending["id"]: False})
    assert result.stop_reason == "completed" and ran == []
    [denied] = tool_results(db)
    assert denied["ok"] is False and "denied by the user" in denied["error"]
    assert "denied by the user" in json.dumps(llm.calls[-1])


async def test_a_decision_is_final_and_decided_calls_run_on_the_next_resume(store, db):
    ran: list[str] = []
    llm = ScriptedLLM([reply(actions=[call("write_note", text="a"), call("write_note", text="b")])])
    agent = Agent(llm=llm, tools=make_tools(ran), store=store)
    paused = await agent.run("two notes", user_id="ada")
    first, second = (p["id"] for p in paused.pending_approvals)

    # The store API a service uses: decide part now, the rest later; never twice.
    decided = await store.decide_approvals(paused.task_id, "ada", {first: True})
    assert [(d["id"], d["status"]) for d in decided] == [(first, "approved")]
    with pytest.raises(ConflictError, match="already decided"):
        await store.decide_approvals(paused.task_id, "ada", {first: False})
    with pytest.raises(ConflictError):  # all or none: the valid half is not recorded either
        await store.decide_approvals(paused.task_id, "ada", {second: True, first: True})
    assert [p["id"] for p in await store.load_approvals(paused.task_id, "ada", "pending")] == [
        second]
    with pytest.raises(ApprovalRequiredError, match=second):
        await agent.resume(paused.task_id, user_id="ada")
    assert ran == []

    llm.extend([reply("Both done.")])
    result = await agent.resume(paused.task_id, user_id="ada", approvals={second: False})
    assert result.stop_reason == "completed" and ran == ["a"]
    assert [(r["name"], r["ok"]) for r in tool_results(db)] == [
        ("write_note", True), ("write_note", False)]


async def test_policy_callable_decides_at_once_and_true_allows_everything(store, db):
    ran: list[str] = []
    asked: list[dict] = []

    async def only_a(request):
        asked.append(request)
        return request["args"]["text"] == "a"

    llm = ScriptedLLM([
        reply(actions=[call("write_note", text="a"), call("write_note", text="b"),
                       call("read_note")]),
        reply("ok"),
    ])
    agent = Agent(llm=llm, tools=make_tools(ran), store=store, approve=only_a)
    result = await agent.run("notes", user_id="ada")
    assert result.stop_reason == "completed" and result.pending_approvals == []
    assert [(r["name"], r["args"]) for r in asked] == [
        ("write_note", {"text": "a"}), ("write_note", {"text": "b"})]
    assert asked[0]["task_id"] == result.task_id and asked[0]["user_id"] == "ada"
    assert sorted(ran) == ["a", "read"]
    assert ["denied" in r.get("error", "") for r in tool_results(db)] == [False, True, False]
    assert approvals_rows(db) == []

    ran.clear()
    free = Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="c")]), reply("ok")]),
                 tools=make_tools(ran), store=store, approve=True)
    assert (await free.run("note c", user_id="ada")).stop_reason == "completed"
    assert ran == ["c"]

    wrong = Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="d")])]),
                  tools=make_tools(ran), store=store, approve=lambda request: "yes")
    with pytest.raises(UsageError, match="must return True or False"):
        await wrong.run("note d", user_id="ada")
    assert ran == ["c"]


async def test_resume_needs_the_tools_the_calls_use(store):
    ran: list[str] = []
    agent = Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="a")])]),
                  tools=make_tools(ran), store=store)
    paused = await agent.run("note", user_id="ada")
    [pending] = paused.pending_approvals
    bare = Agent(llm=ScriptedLLM([]), store=store)
    with pytest.raises(UsageError, match="write_note, which this agent does not have"):
        await bare.resume(paused.task_id, user_id="ada", approvals={pending["id"]: True})
    # Nothing was decided: the call still waits, for an agent that has the tool.
    assert [p["status"] for p in await store.load_approvals(paused.task_id, "ada")] == ["pending"]


async def test_store_contract_for_approvals(any_store, raw):
    """What an HTTP service relies on, on both backends: list, decide, isolation, cleanup."""
    ran: list[str] = []
    agent = Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="a")])]),
                  tools=make_tools(ran), store=any_store)
    paused = await agent.run("note", user_id="ada")
    [pending] = paused.pending_approvals
    [task] = await any_store.list_tasks()
    assert task.pending_approvals[0]["id"] == pending["id"]
    loaded = await any_store.load_task(paused.task_id, "ada")
    assert [p["name"] for p in loaded.pending_approvals] == ["write_note"]
    with pytest.raises(NotFoundError):
        await any_store.load_approvals(paused.task_id, "eve")
    with pytest.raises(NotFoundError):
        await any_store.decide_approvals(paused.task_id, "eve", {pending["id"]: True})
    with pytest.raises(UsageError, match="True \\(approve\\) or False"):
        await any_store.decide_approvals(paused.task_id, "ada", {pending["id"]: "yes"})
    [decided] = await any_store.decide_approvals(paused.task_id, "ada", {pending["id"]: True})
    assert decided["status"] == "approved" and decided["decided_at"]
    with pytest.raises(ConflictError):
        await any_store.decide_approvals(paused.task_id, "ada", {pending["id"]: True})
    await any_store.start_approvals(paused.task_id, "ada", [pending["id"]])
    with pytest.raises(ConflictError):  # a call marked running never starts again
        await any_store.start_approvals(paused.task_id, "ada", [pending["id"]])
    assert await raw("SELECT status FROM task_approvals") == [("running",)]
    await any_store.forget_user("ada")
    assert await raw("SELECT COUNT(*) FROM task_approvals") == [(0,)]


async def test_pause_survives_a_new_store_and_agent(db_path, db):
    ran: list[str] = []
    first = SQLiteStore(db_path)
    agent = Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="a")])]),
                  tools=make_tools(ran), store=first)
    paused = await agent.run("note", user_id="ada")
    await first.close()

    second = SQLiteStore(db_path)
    later = Agent(llm=ScriptedLLM([reply("done")]), tools=make_tools(ran), store=second)
    [pending] = (await second.list_tasks("ada"))[0].pending_approvals
    result = await later.resume(paused.task_id, user_id="ada", approvals={pending["id"]: True})
    assert result.stop_reason == "completed" and ran == ["a"]
    await second.close()


async def test_resume_lets_the_agents_policy_decide_what_waits(store, db):
    ran: list[str] = []
    paused = await Agent(llm=ScriptedLLM([reply(actions=[call("write_note", text="a")])]),
                         tools=make_tools(ran), store=store).run("note", user_id="ada")
    [pending] = paused.pending_approvals
    asked: list[dict] = []

    async def person(request):  # e.g. the CLI's [y/N] prompt on `cogency resume`
        asked.append(request)
        return True

    later = Agent(llm=ScriptedLLM([reply("done")]), tools=make_tools(ran), store=store,
                  approve=person)
    result = await later.resume(paused.task_id, user_id="ada")
    assert result.stop_reason == "completed" and ran == ["a"]
    assert [(r["id"], r["name"], r["args"]) for r in asked] == [
        (pending["id"], "write_note", {"text": "a"})]


async def test_pause_and_approve_on_each_backend(any_store, raw):
    ran: list[str] = []
    llm = ScriptedLLM([reply(actions=[call("write_note", text="a"), call("read_note")]),
                       reply("done")])
    agent = Agent(llm=llm, tools=make_tools(ran), store=any_store)
    paused = await agent.run("note", user_id="ada")
    [pending] = paused.pending_approvals
    assert ran == ["read"]
    assert await raw("SELECT call_id, status FROM task_approvals") == [(pending["id"], "pending")]
    result = await agent.resume(paused.task_id, user_id="ada", approvals={pending["id"]: True})
    assert result.stop_reason == "completed" and ran == ["read", "a"]
    assert await raw("SELECT COUNT(*) FROM task_approvals") == [(0,)]


async def test_an_approve_callable_that_raises_leaves_the_call_waiting(store, db, caplog):
    ran: list[str] = []

    async def broken(request):
        raise ConnectionError("the approval service is down")

    llm = ScriptedLLM([reply(actions=[call("write_note", text="a"), call("read_note")])])
    agent = Agent(llm=llm, tools=make_tools(ran), store=store, approve=broken)
    result = await agent.run("note a", user_id="ada")
    # Fails closed and loses nothing: the call was not run, it waits for a person, and the
    # step is whole (was: the callable's raw error out of run(), an action stored with no
    # result for the call).
    assert result.stop_reason == "awaiting_approval", result.error
    assert [c["name"] for c in result.pending_approvals] == ["write_note"]
    assert ran == ["read"]
    assert [status for _, _, status, _ in approvals_rows(db)] == ["pending"]
    assert [r["name"] for r in tool_results(db)] == ["read_note"]
    assert "approval service is down" in caplog.text
    # Deciding at resume with the same broken policy is a clear error; nothing is decided.
    resumed = Agent(llm=ScriptedLLM([reply("ok")]), tools=make_tools(ran), store=store,
                    approve=broken)
    with pytest.raises(UsageError, match="approve callable raised ConnectionError"):
        await resumed.resume(result.task_id, user_id="ada")
    assert [status for _, _, status, _ in approvals_rows(db)] == ["pending"]
    assert ran == ["read"]
