"""Fault injection: the model raising, hanging or talking garbage; a tool raising or hanging;
the database locked or its disk full. The run stops with the right stop reason or a clear
StorageError, and nothing already stored is lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from cogency import Agent, Tool, tool
from cogency.errors import LLMTimeoutError, StorageError, StoreUnavailableError
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from conftest import IN_CI

FIRST = {"secure": True, "understanding": "step one", "actions": [{"name": "note", "args": {"text": "one"}}]}
DONE = {"response": "finished", "actions": []}


@tool
def note(text: str) -> str:
    """Remember a note."""
    return f"noted {text}"


def _rows(db_path: Path) -> list[tuple]:
    db = sqlite3.connect(db_path)
    try:
        return db.execute(
            "SELECT conversation_id, seq, role, content FROM conversation_messages ORDER BY 1, 2"
        ).fetchall()
    finally:
        db.close()


def _workspaces(db_path: Path) -> list[tuple]:
    db = sqlite3.connect(db_path)
    try:
        return db.execute("SELECT task_id, runner FROM task_workspaces").fetchall()
    finally:
        db.close()


async def _stored_history(store, db_path) -> list[tuple]:
    """One completed task, so there is something to lose."""
    agent = Agent(llm=ScriptedLLM([FIRST, DONE]), tools=[note], store=store)
    assert (await agent.run("earlier work", user_id="u", conversation_id="c")).stop_reason == "completed"
    return _rows(db_path)


@pytest.mark.parametrize(
    ("failure", "reason", "says"),
    [
        (RuntimeError("connection reset by peer"), "error", "connection reset"),
        (LLMTimeoutError("the model did not answer within 30s"), "error", "did not answer"),
        (ValueError("provider SDK bug"), "error", "provider SDK bug"),
    ],
)
async def test_a_failing_model_stops_the_task_with_error_and_keeps_it(
    store, db_path, failure, reason, says
) -> None:
    before = await _stored_history(store, db_path)
    llm = ScriptedLLM([FIRST, failure, failure, failure])
    agent = Agent(llm=llm, tools=[note], store=store, llm_retries=2, retry_delay=0)
    result = await agent.run("next", user_id="u", conversation_id="c")
    assert result.stop_reason == reason and says in result.error
    after = _rows(db_path)
    assert after[: len(before)] == before
    assert [r[2] for r in after[len(before):]] == ["user", "assistant", "tool"]
    assert _workspaces(db_path) == [(result.task_id, None)]  # kept, and free to resume
    resumed = await Agent(llm=ScriptedLLM([DONE]), tools=[note], store=store).resume(
        result.task_id, user_id="u")
    assert resumed.stop_reason == "completed"


async def test_garbage_from_the_model_ends_with_invalid_response(store, db_path) -> None:
    before = await _stored_history(store, db_path)
    garbage = ["not json at all", '{"actions": [1, 2]', "```json\n[1, 2]\n```",
               '{"response": 42}', "\x00\ud800" * 10, '{"actions": [{"name": "nope"}]}',
               '{"actions": [{"name": "note", "args": {"text": 5}}]}']
    agent = Agent(llm=ScriptedLLM(garbage), tools=[note], store=store,
                  invalid_retries=len(garbage) - 1)
    result = await agent.run("next", user_id="u", conversation_id="c")
    assert result.stop_reason == "invalid_response"
    after = _rows(db_path)
    assert after[: len(before)] == before and [r[2] for r in after[len(before):]] == ["user"]


async def test_a_hanging_model_can_be_cancelled_and_the_task_resumed(store, db_path) -> None:
    before = await _stored_history(store, db_path)
    never = asyncio.Event()

    async def hang(messages):
        await never.wait()

    agent = Agent(llm=ScriptedLLM([FIRST, hang]), tools=[note], store=store)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(agent.run("next", user_id="u", conversation_id="c"), 1.0)
    after = _rows(db_path)
    assert after[: len(before)] == before
    assert [r[2] for r in after[len(before):]] == ["user", "assistant", "tool"]
    [(task_id, runner)] = _workspaces(db_path)
    assert runner is None
    resumed = await Agent(llm=ScriptedLLM([DONE]), tools=[note], store=store).resume(task_id, "u")
    assert resumed.stop_reason == "completed"


async def test_a_raising_or_hanging_tool_is_a_result_the_model_sees(store, db_path) -> None:
    @tool
    def explode(x: int) -> str:
        """Fail loudly."""
        raise OSError(f"device on fire ({x})")

    async def forever() -> str:
        await asyncio.sleep(3600)
        return "never"

    hang = Tool("hang", "Never returns.", {"type": "object", "properties": {}}, forever, timeout=0.3)
    llm = ScriptedLLM([
        {"secure": True, "actions": [{"name": "explode", "args": {"x": 1}}, {"name": "hang", "args": {}}]},
        DONE,
    ])
    result = await Agent(llm=llm, tools=[explode, hang], store=store).run("try", user_id="u")
    assert result.stop_reason == "completed"
    tools = [json.loads(r[3]) for r in _rows(db_path) if r[2] == "tool"]
    assert [t["ok"] for t in tools] == [False, False]
    assert tools[0]["error"] == "OSError: device on fire (1)"
    assert tools[1]["error"] == "timed out after 0.3s"
    assert "device on fire" in llm.calls[1][-2]["content"] and "timed out" in llm.calls[1][-1]["content"]


async def test_a_locked_database_gives_a_clear_storage_error_and_loses_nothing(db_path) -> None:
    store = SQLiteStore(db_path, busy_timeout=0.2)
    try:
        before = await _stored_history(store, db_path)
        locker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)

        @tool
        def grab_lock() -> str:
            """Another process takes the write lock and keeps it."""
            locker.execute("BEGIN IMMEDIATE")
            return "locked"

        llm = ScriptedLLM([{"secure": True, "actions": [{"name": "grab_lock", "args": {}}]}, DONE])
        agent = Agent(llm=llm, tools=[grab_lock], store=store)
        with pytest.raises(StoreUnavailableError, match="locked"):
            await agent.run("next", user_id="u", conversation_id="c")
        locker.execute("ROLLBACK")
        locker.close()
        after = _rows(db_path)
        assert after[: len(before)] == before
        assert [r[2] for r in after[len(before):]] == ["user"]  # saved before the lock
        [(task_id, _)] = _workspaces(db_path)
        resumed = await Agent(llm=ScriptedLLM([DONE]), tools=[grab_lock], store=store).resume(
            task_id, "u")
        assert resumed.stop_reason == "completed"
    finally:
        await store.close()


@contextlib.contextmanager
def _tiny_disk(path: Path, size: str = "512k"):
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        if IN_CI:
            raise RuntimeError(f"cannot mount a tmpfs in CI: {mounted.stderr!r}")
        pytest.skip("a small tmpfs cannot be mounted here (needs root); the disk-full test needs one")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def test_a_full_disk_gives_a_clear_storage_error_and_loses_nothing(tmp_path) -> None:
    with _tiny_disk(tmp_path / "disk") as disk:
        db_path = disk / "cogency.db"
        store = SQLiteStore(db_path)
        try:
            before = await _stored_history(store, db_path)
            big = "x" * 40_000

            @tool
            def fill_disk() -> str:
                """Something else fills the disk, then this tool returns a large result."""
                with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:
                    while True:
                        filler.write(b"\0" * 4096)
                        filler.flush()
                return big

            llm = ScriptedLLM([{"secure": True, "actions": [{"name": "fill_disk", "args": {}}]}, DONE])
            with pytest.raises(StorageError, match="full"):
                await Agent(llm=llm, tools=[fill_disk], store=store).run(
                    "next", user_id="u", conversation_id="c")
            (disk / "filler").unlink()
            after = _rows(db_path)
            assert after[: len(before)] == before
            assert [r[2] for r in after[len(before):]] == ["user"]
            db = sqlite3.connect(db_path)
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            db.close()
        finally:
            await store.close()
