"""Runs and resume under hostile timing: recorded results found by task, streams and agents
that stop early, expiring and fenced leases, saves retried after an unknown outcome.

Each test asserts the rows; those marked ``any_store`` run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cogency import Agent, tool
from cogency.errors import (
    LeaseLostError,
    StoreLockedError,
    StoreUnavailableError,
    TaskRunningError,
    UsageError,
)
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM


def reply(response: str | None = None, actions: Any = (), **fields: Any) -> dict[str, Any]:
    return {"response": response, "actions": list(actions), **fields}


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args}


async def messages(raw, task_id: str) -> list[tuple[int, str, str]]:
    return [tuple(row) for row in await raw(
        "SELECT seq, role, content FROM conversation_messages WHERE task_id = ? ORDER BY seq",
        task_id,
    )]


async def assert_gapless(raw, conversation_id: str) -> None:
    seqs = [row[0] for row in await raw(
        "SELECT seq FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        conversation_id,
    )]
    assert seqs == list(range(1, len(seqs) + 1))
    [(count,)] = await raw(
        "SELECT message_count FROM conversations WHERE conversation_id = ?", conversation_id
    )
    assert count == len(seqs)


async def second_store(store: Any) -> Any:
    """Another store on the same database, as another process would open it."""
    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path)
    from cogency.storage.postgres import PostgresStore

    return PostgresStore(store.dsn)


# -- 10: recorded results are found by task, whatever the window ---------------------------


async def test_resume_finds_recorded_calls_outside_the_history_window(any_store, raw):
    sent: list[str] = []

    @tool
    def send_email(to: str) -> str:
        """Send an email (a side effect that must not happen twice)."""
        sent.append(to)
        return f"sent to {to}"

    @tool
    def read_page(n: int) -> str:
        """Read a long page."""
        return " ".join(f"page{n}word{i}" for i in range(150))

    steps = [reply(actions=[call("send_email", to="bob")])]
    steps += [reply(actions=[call("read_page", n=n)]) for n in (1, 2, 3)]
    first = Agent(llm=ScriptedLLM([*steps, RuntimeError("provider down")]),
                  tools=[send_email, read_page], store=any_store, history_tokens=600,
                  llm_retries=0)
    stopped = await first.run("email bob, then read three pages", user_id="u")
    assert stopped.stop_reason == "error" and sent == ["bob"]
    before = await messages(raw, stopped.task_id)

    # The model asks again for what it did before the crash: nothing runs twice.
    again = [*steps, reply("Emailed bob and read the pages.")]
    resumed = await Agent(llm=ScriptedLLM(again), tools=[send_email, read_page],
                          store=any_store, history_tokens=600).resume(stopped.task_id, "u")

    assert resumed.stop_reason == "completed" and sent == ["bob"]
    after = await messages(raw, stopped.task_id)
    assert after[: len(before)] == before
    assert [role for _, role, _ in after[len(before):]] == ["assistant"]  # only the answer
    assert [role for _, role, _ in after].count("user") == 1
    await assert_gapless(raw, stopped.conversation_id)


async def test_a_resumed_task_never_stores_its_query_twice(any_store, raw):
    @tool
    def read_page() -> str:
        """Read a page longer than the whole history window."""
        return " ".join(f"word{i}" for i in range(900))

    first = Agent(llm=ScriptedLLM([reply(actions=[call("read_page")]), RuntimeError("down")]),
                  tools=[read_page], store=any_store, history_tokens=300, llm_retries=0)
    stopped = await first.run("read the page", user_id="u")
    resumed = await Agent(llm=ScriptedLLM([reply("Read it.")]), tools=[read_page],
                          store=any_store, history_tokens=300).resume(stopped.task_id, "u")

    assert resumed.stop_reason == "completed"
    roles = [role for _, role, _ in await messages(raw, stopped.task_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


# -- 11: leaving a stream early, or closing the agent, settles the run ---------------------


class _SlowSaves:
    """A store whose saves take a while to land (a remote database, a busy disk)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def save(self, batch: Any) -> int:
        await asyncio.sleep(0.2)
        return await self._store.save(batch)


async def test_breaking_out_after_the_response_keeps_the_answer(any_store, raw):
    store = _SlowSaves(any_store)
    agent = Agent(llm=ScriptedLLM([reply("The answer.")]), store=store)
    async for event in agent.stream("a question", user_id="u"):
        if event.type == "response":
            task_id = event.task_id
            break
    await store.close()  # the caller is done with it

    assert [(r, c) for _, r, c in await messages(raw, task_id)] == [
        ("user", "a question"), ("assistant", "The answer.")]
    assert await raw("SELECT task_id FROM task_workspaces") == []  # completed: nothing held


async def test_closing_the_agent_settles_a_run_in_flight(store, db):
    started = asyncio.Event()

    @tool
    async def wait_long() -> str:
        """Take a long time."""
        started.set()
        await asyncio.sleep(60)
        return "late"

    agent = Agent(llm=ScriptedLLM([reply(actions=[call("wait_long")], understanding="waiting")]),
                  tools=[wait_long], store=store)

    async def caller() -> None:
        # Agent.run works in its caller's own task: closing the agent cancels that task to
        # stop the run, and takes the cancellation back as it raises, so the caller goes on.
        with pytest.raises(UsageError, match="closed while this run was in flight"):
            await agent.run("wait", user_id="u")
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0
        with pytest.raises(TimeoutError):  # a time-out of its own still times out
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)

    run = asyncio.create_task(caller())
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(agent.close(), 10)
    await asyncio.wait_for(run, 10)
    [(task_id, runner, data)] = db.execute(
        "SELECT task_id, runner, workspace_data FROM task_workspaces").fetchall()
    assert runner is None and json.loads(data)["understanding"] == "waiting"
    stored = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert [role for role, _ in stored] == ["user", "assistant", "tool"]
    assert json.loads(stored[2][1])["cancelled"] is True
    # Nothing holds the task in this process any more.
    resumed = await Agent(llm=ScriptedLLM([reply("Done.")]), tools=[wait_long],
                          store=store).resume(task_id, "u")
    assert resumed.stop_reason == "completed"


async def test_a_run_whose_agent_closes_before_it_begins_stores_nothing(store, db):
    """Agent.run gives the loop a turn before it begins: an Agent.close() in that turn
    stops it there, with UsageError, and nothing of it reaches the database."""
    agent = Agent(llm=ScriptedLLM([reply("first"), reply("never")]), store=store)
    await agent.run("first", user_id="u")
    run = asyncio.create_task(agent.run("hello", user_id="u"))
    await asyncio.sleep(0)  # the run is past its checks, at its turn for the loop
    await agent.close()
    with pytest.raises(UsageError, match="closed before this run began"):
        await run
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)
    assert [content for (content,) in db.execute(
        "SELECT content FROM conversation_messages ORDER BY conversation_id, seq")] == [
        "first", "first"]  # the first run's query and answer only


# -- 12: leases expire, and a dead runner's task can be released ----------------------------

_HANGING_RUNNER = """
import asyncio, socket, sys
socket.gethostname = lambda: "a-host-that-is-gone"   # a container that restarted renamed
from cogency import Agent, tool
from cogency.storage import open_store
from cogency.storage.base import new_runner
from cogency.testing import ScriptedLLM

@tool
async def wait_forever() -> str:
    "Hang."
    open(sys.argv[3], "w").close()
    await asyncio.sleep(3600)
    return "never"

async def main():
    store = open_store(sys.argv[1], lease=float(sys.argv[2]))
    await store.hold_conversation("held", "u", new_runner())
    llm = ScriptedLLM([{"response": None, "actions": [{"name": "wait_forever", "args": {}}]}])
    await Agent(llm=llm, tools=[wait_forever], store=store).run("hang", "u", "held")

asyncio.run(main())
"""


def _where(store: Any) -> str:
    return store.path if isinstance(store, SQLiteStore) else store.dsn


async def _start_hanging_runner(store: Any, raw: Any, tmp_path: Path, lease: float
                                ) -> tuple[subprocess.Popen[bytes], str]:
    """A runner on "another host" (as its host name says) that holds a task and the
    conversation "held" of user "u", then hangs in a tool."""
    marker = tmp_path / "runner.started"
    process = subprocess.Popen([sys.executable, "-c", _HANGING_RUNNER, _where(store),
                                str(lease), str(marker)])
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert process.poll() is None, "the runner exited early"
        assert time.monotonic() < deadline, "the runner never reached its tool"
        await asyncio.sleep(0.05)
    [(task_id,)] = await raw("SELECT task_id FROM task_workspaces")
    return process, task_id


def _kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


async def test_a_task_of_a_runner_on_another_host_is_free_once_its_lease_expires(
        any_store, raw, tmp_path):
    from cogency.errors import ConversationBusyError
    from cogency.storage.base import new_runner

    process, task_id = await _start_hanging_runner(any_store, raw, tmp_path, lease=1.0)
    try:
        agent = Agent(llm=ScriptedLLM([reply("Recovered.")]), store=any_store)
        await asyncio.sleep(0.8)  # past one renewal: the heartbeat keeps a live runner's lease
        with pytest.raises(TaskRunningError, match="lease expires"):
            await agent.resume(task_id, "u")
        with pytest.raises(ConversationBusyError):
            await any_store.hold_conversation("held", "u", new_runner())
        _kill(process)
        await asyncio.sleep(1.2)  # its last lease lapses (renewed at most 1/3 s before)
        result = await agent.resume(task_id, "u")
        await any_store.hold_conversation("held", "u", new_runner())  # its hold lapsed too
    finally:
        if process.poll() is None:
            _kill(process)

    assert result.stop_reason == "completed" and result.response == "Recovered."
    assert await raw("SELECT count(*) FROM task_workspaces") == [(0,)]


async def test_a_dead_runners_task_is_released_by_force_from_the_command_line(
        any_store, raw, tmp_path):
    """A runner on another host is known dead to the operator: `cogency tasks release`
    frees its task and the conversation hold of its process at once."""
    from cogency.errors import ConversationBusyError
    from cogency.storage.base import new_runner

    process, task_id = await _start_hanging_runner(any_store, raw, tmp_path, lease=300.0)
    _kill(process)
    agent = Agent(llm=ScriptedLLM([reply("Recovered.")]), store=any_store)
    with pytest.raises(TaskRunningError, match="cogency tasks release"):
        await agent.resume(task_id, "u")
    with pytest.raises(ConversationBusyError):
        await any_store.hold_conversation("held", "u", new_runner())
    [(runner, epoch)] = await raw("SELECT runner, epoch FROM task_workspaces")
    assert runner.startswith("a-host-that-is-gone|") and epoch == 1
    [(hold_epoch,)] = await raw("SELECT epoch FROM conversation_runs")

    released = subprocess.run(
        [sys.executable, "-m", "cogency.cli", "tasks", "release", task_id, "--user", "u",
         "--db", _where(any_store)],
        capture_output=True, text=True, timeout=60,
    )
    assert released.returncode == 0, released.stderr
    assert f"released task {task_id} from runner {runner}" in released.stdout
    assert await raw("SELECT runner, epoch FROM task_workspaces") == [(None, 2)]
    assert await raw("SELECT runner, epoch FROM conversation_runs") == [(None, hold_epoch + 1)]

    await any_store.hold_conversation("held", "u", holder := new_runner())
    result = await agent.resume(task_id, "u")
    await any_store.release_conversation("held", holder)
    assert result.stop_reason == "completed"


async def test_force_release_of_another_users_task_is_not_found(store):
    from cogency.errors import NotFoundError

    agent = Agent(llm=ScriptedLLM([reply(actions=[call("nothing")]), RuntimeError("down")]),
                  store=store, llm_retries=0, invalid_retries=0)
    stopped = await agent.run("x", user_id="alice")
    with pytest.raises(NotFoundError):
        await agent.release(stopped.task_id, "bob")
    assert await agent.release(stopped.task_id, "alice") is None  # it was not held


# -- 13: a runner that lost its lease writes nothing more -----------------------------------


async def _lose_lease(store: Any, task_id: str, other: Any) -> None:
    """Take the task away from ``store``'s runner while it works (its runner is known dead
    to the operator; a lapsed lease is taken over the same way, by a claim that moves the
    epoch on)."""
    assert await Agent(llm=ScriptedLLM([]), store=other).release(task_id, "u")


async def test_a_runner_that_lost_its_lease_stops_and_writes_nothing(any_store, raw):
    started, go_on = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        started.set()
        await go_on.wait()
        sent.append(to)
        return f"sent to {to}"

    other = await second_store(any_store)
    try:
        # No workspace fields: the step's save appends messages only (the unfenced path).
        first = Agent(llm=ScriptedLLM([reply(actions=[call("send_email", to="bob")]),
                                       reply("First runner's answer.")]),
                      tools=[send_email], store=any_store)
        run = asyncio.create_task(first.run("email bob", user_id="u"))
        await asyncio.wait_for(started.wait(), 10)
        [(task_id,)] = await raw("SELECT task_id FROM task_workspaces")
        await _lose_lease(any_store, task_id, other)

        second = Agent(llm=ScriptedLLM([reply("Second runner's answer.")]), tools=[send_email],
                       store=other)
        taken_over = await second.resume(task_id, "u")
        assert taken_over.stop_reason == "completed"
        settled = await messages(raw, task_id)

        go_on.set()
        with pytest.raises(LeaseLostError, match="wrote nothing more"):
            await asyncio.wait_for(run, 10)
    finally:
        go_on.set()
        await other.close()

    assert await messages(raw, task_id) == settled
    assert [c for _, r, c in settled if r == "assistant"] == ["Second runner's answer."]
    assert await raw("SELECT task_id FROM task_workspaces") == []


async def test_a_claim_fences_out_the_previous_epoch(any_store, raw):
    from cogency.state import State, add_message, autosave
    from cogency.storage.base import new_runner

    state = await State.start_task("q", "u", store=any_store, record_query=True,
                                   runner=new_runner())
    assert state.epoch == 1
    [(epoch,)] = await raw("SELECT epoch FROM task_workspaces")
    assert epoch == 1
    assert await any_store.force_release(state.task_id, "u") is not None
    other = await second_store(any_store)
    try:
        assert await other.claim_task(state.task_id, "u", new_runner()) == 3
    finally:
        await other.close()
    add_message(state, "assistant", "stale")
    state.workspace.update({"understanding": "stale"})
    with pytest.raises(LeaseLostError):
        await autosave(state)
    add_message(state, "assistant", "stale again")
    state.workspace = type(state.workspace)(**state.workspace.to_dict())
    with pytest.raises(LeaseLostError):
        await state.complete_task()
    assert [c for _, _, c in await messages(raw, state.task_id)] == ["q"]
    assert await raw("SELECT epoch, version FROM task_workspaces") == [(3, 1)]


# -- 14: a save retried after an unknown outcome stores nothing twice -----------------------


class _LostReply:
    """A store whose reply to the ``nth`` save is lost: the save lands, the caller hears the
    connection died before the outcome was known (as ``PostgresStore`` reports it)."""

    def __init__(self, store: Any, nth: int) -> None:
        self._store, self._left = store, nth

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def save(self, batch: Any) -> int:
        version = await self._store.save(batch)
        self._left -= 1
        if self._left == 0:
            raise StoreUnavailableError(
                "the connection was lost before the outcome of saving a task was known; the "
                "change may or may not have been stored: reload before retrying"
            )
        return version


@pytest.mark.parametrize("workspace", [False, True], ids=["messages", "messages+workspace"])
async def test_a_save_retried_after_a_lost_commit_reply_stores_nothing_twice(
    any_store, raw, workspace
):
    fields = {"understanding": "noted"} if workspace else {}
    llm = ScriptedLLM([reply(actions=[call("note", text="a")], **fields)])

    @tool
    def note(text: str) -> str:
        """Take a note."""
        return f"noted {text}"

    agent = Agent(llm=llm, tools=[note], store=_LostReply(any_store, nth=1))
    with pytest.raises(StoreUnavailableError, match="may or may not"):
        await agent.run("take a note", user_id="u")

    [(task_id, runner, data, version)] = await raw(
        "SELECT task_id, runner, workspace_data, version FROM task_workspaces")
    assert runner is None  # the retry saved, then released the task
    assert (json.loads(data) if isinstance(data, str) else data).get("understanding", "") == (
        "noted" if workspace else "")
    assert version == (2 if workspace else 1)
    assert [r for _, r, _ in await messages(raw, task_id)] == ["user", "assistant", "tool"]

    resumed = await Agent(llm=ScriptedLLM([reply("Noted.")]), tools=[note],
                          store=any_store).resume(task_id, "u")
    assert resumed.stop_reason == "completed"
    assert [r for _, r, _ in await messages(raw, task_id)] == [
        "user", "assistant", "tool", "assistant"]


# -- also seen: a held lock is reported after one busy time-out, not three ------------------


async def test_a_held_write_lock_is_reported_after_one_busy_timeout(db_path):
    store = SQLiteStore(db_path, busy_timeout=1.0)
    locker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    started = 0.0

    @tool
    def grab_lock() -> str:
        """Another process takes the write lock and keeps it."""
        nonlocal started
        locker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        return "locked"

    agent = Agent(llm=ScriptedLLM([reply(actions=[call("grab_lock")])]), tools=[grab_lock],
                  store=store)
    try:
        with pytest.raises(StoreLockedError, match="stayed locked"):
            await agent.run("lock it", user_id="u")
        waited = time.monotonic() - started
        locker.execute("ROLLBACK")
        # The save waited its 1 s; no cleanup save or release waited again (that was ~3 s).
        assert waited < 2.0, f"reported after {waited:.1f}s"
        [(task_id,)] = sqlite3.connect(db_path).execute(
            "SELECT task_id FROM task_workspaces").fetchall()
        resumed = await Agent(llm=ScriptedLLM([reply("Done.")]), tools=[grab_lock],
                              store=store).resume(task_id, "u")
        assert resumed.stop_reason == "completed"
    finally:
        locker.close()
        await store.close()


async def test_runs_one_after_another_let_the_event_loop_run_other_tasks(store):
    """A run with a model that never waits, whose store calls all run on the loop, still
    gives the loop a turn: other tasks (a heartbeat, learning, a checkpoint's hand-over) are
    never starved by a caller running turn after turn."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    agent = Agent(llm=ScriptedLLM([reply("ok")] * 30), tools=[], store=store)
    conversation = None
    for _ in range(10):  # the file made, the window cached: from here no call waits
        conversation = (await agent.run("hi", "u", conversation)).conversation_id
    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    for _ in range(20):
        await agent.run("hi", "u", conversation)
    ticking.cancel()
    assert ticks - before >= 20  # at least once a run
