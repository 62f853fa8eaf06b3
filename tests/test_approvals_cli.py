"""Approvals through the real ``cogency`` command and across processes killed with SIGKILL."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli import TESTS, rows, step

from cogency.errors import ConflictError
from cogency.storage import SQLiteStore

ORIGINAL = "the secret number is 42\n"
QUERY = "Use the read_file tool to read notes.txt"


def write(path, content):
    return {"name": "file_write", "args": {"path": path, "content": content}}


@pytest.fixture
def env(tmp_path):
    script = tmp_path / "script.json"
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]), "COGENCY_TEST_SCRIPT": str(script), "NO_COLOR": "1"}


@pytest.fixture
def cogency(tmp_path, db_path, env):
    """``cogency(*args, script=[...])``: the real command, with no terminal on stdin."""

    def run(*args, script=()):
        Path(env["COGENCY_TEST_SCRIPT"]).write_text(json.dumps(list(script)))
        command = [sys.executable, "-m", "cogency.cli", *args, "--db", str(db_path)]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60,
                              cwd=tmp_path, stdin=subprocess.DEVNULL)

    (tmp_path / "notes.txt").write_text(ORIGINAL)
    return run


def pending(db_path):
    return rows(db_path, "SELECT task_id, call_id, status FROM task_approvals")


def stored_results(db_path):
    return [json.loads(c) for (c,) in rows(
        db_path, "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY seq")]


def test_without_a_terminal_the_task_pauses_and_approve_decides_it(cogency, tmp_path, db_path):
    llm = ["--llm", "cli_models:scripted", "--tools", "files", "--no-memory"]
    done = cogency("run", QUERY, "--user", "bob", *llm,
                   script=[step(actions=[write("notes.txt", "overwritten")])])
    assert done.returncode == 3, done.stderr
    [(task_id, call_id, status)] = pending(db_path)
    assert status == "pending"
    assert (tmp_path / "notes.txt").read_text() == ORIGINAL
    assert f"{call_id}  file_write(" in done.stderr
    command = f"cogency approve {task_id} --user bob --db {db_path}"  # the task keeps its tools
    assert f"approve: {command}\n" in done.stderr
    assert f"deny:    {command} --deny CALL_ID" in done.stderr

    listed = cogency("tasks", "--user", "bob")
    assert f"waits for approval: {call_id}  file_write(" in listed.stdout
    [line] = cogency("tasks", "--json").stdout.splitlines()
    assert [p["id"] for p in json.loads(line)["pending_approvals"]] == [call_id]

    resumed = cogency("resume", task_id, "--user", "bob", *llm)  # deciding is required
    assert resumed.returncode == 1 and call_id in resumed.stderr
    wrong = cogency("approve", task_id, "--user", "bob", "--deny", "call_nope", *llm)
    assert wrong.returncode == 1 and "no call 'call_nope'" in wrong.stderr

    denied = cogency("approve", task_id, "--user", "bob", "--deny", call_id, "--no-memory",
                     script=[step(response="I left the file alone.")])
    assert denied.returncode == 0, denied.stderr
    assert "I left the file alone." in denied.stdout
    assert (tmp_path / "notes.txt").read_text() == ORIGINAL
    [result] = stored_results(db_path)
    assert result["name"] == "file_write" and "denied by the user" in result["error"]
    assert pending(db_path) == [] and rows(db_path, "SELECT * FROM task_workspaces") == []

    # The same request, approved this time: the file changes, once.
    cogency("run", QUERY, "--user", "bob", *llm,
            script=[step(actions=[write("notes.txt", "overwritten")])])
    approved = cogency("approve", pending(db_path)[0][0], "--user", "bob", *llm,
                       script=[step(response="Done.")])
    assert approved.returncode == 0, approved.stderr
    assert (tmp_path / "notes.txt").read_text() == "overwritten"


def test_deny_all_denies_every_waiting_call(cogency, tmp_path, db_path):
    llm = ["--llm", "cli_models:scripted", "--tools", "files", "--no-memory"]
    paused = cogency("run", QUERY, *llm, script=[step(actions=[
        write("notes.txt", "overwritten"), write("other.txt", "new")])])
    assert paused.returncode == 3, paused.stderr
    calls = pending(db_path)
    assert len(calls) == 2 and "(or --deny-all)" in paused.stderr
    denied = cogency("approve", calls[0][0], "--deny-all",
                     script=[step(response="I changed nothing.")])
    assert denied.returncode == 0, denied.stderr
    assert "I changed nothing." in denied.stdout
    assert (tmp_path / "notes.txt").read_text() == ORIGINAL
    assert not (tmp_path / "other.txt").exists()
    results = stored_results(db_path)
    assert len(results) == 2 and all("denied by the user" in r["error"] for r in results)
    assert pending(db_path) == []


def test_yes_allows_and_read_only_offers_no_writing_tool(cogency, tmp_path, db_path):
    llm = ["--llm", "cli_models:scripted", "--tools", "files", "--no-memory"]
    blocked = cogency("run", QUERY, "--read-only", *llm,
                      script=[step(actions=[write("notes.txt", "x")])] * 3)
    assert blocked.returncode == 1
    assert "unknown tool 'file_write'" in blocked.stdout  # the model was told, nothing asked
    assert (tmp_path / "notes.txt").read_text() == ORIGINAL and pending(db_path) == []
    shell = cogency("run", QUERY, "--read-only", "--llm", "cli_models:scripted",
                    "--tools", "shell")
    assert shell.returncode == 1 and "--read-only cannot include the shell tool" in shell.stderr
    mcp = cogency("run", QUERY, "--read-only", "--llm", "cli_models:scripted", "--mcp",
                  "some-mcp-server")
    assert mcp.returncode == 1 and "--read-only cannot include --mcp" in mcp.stderr

    allowed = cogency("run", QUERY, "--yes", *llm,
                      script=[step(actions=[write("notes.txt", "x")]), step(response="ok")])
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "notes.txt").read_text() == "x" and pending(db_path) == []


def test_terminal_prompt_shows_the_call_escaped_and_only_yes_runs_it(tmp_path, db_path, env):
    (tmp_path / "notes.txt").write_text(ORIGINAL)
    hostile = "pwned\x1b[2J\x1b]0;title\x07\u202e"
    Path(env["COGENCY_TEST_SCRIPT"]).write_text(json.dumps([
        step(actions=[write("notes.txt", hostile), write("other.txt", "fine")]),
        step(response="One written, one refused."),
    ]))
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "cogency.cli", "run", QUERY, "--tools", "files", "--llm",
         "cli_models:scripted", "--db", str(db_path)],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env,
    )
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, count: int) -> None:
        nonlocal seen
        deadline = time.monotonic() + 30
        while seen.count(marker) < count:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break

    try:
        read_until(b"[y/N]", 1)
        os.write(master, b"n\n")
        read_until(b"[y/N]", 2)
        os.write(master, b"y\n")
        read_until(b"One written, one refused.", 1)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    text = seen.decode(errors="replace")
    assert 'allow file_write({"path": "notes.txt", "content": "pwned\\u001b[2J' in text
    assert "\\u202e" in text and "\u202e" not in text  # shown, never applied
    assert "\x1b[2J" not in text and "\x1b]0;" not in text
    assert (tmp_path / "notes.txt").read_text() == ORIGINAL
    assert (tmp_path / "other.txt").read_text() == "fine"
    assert ["denied by the user" in r.get("error", "") for r in stored_results(db_path)] == [
        True, False]


def test_decided_from_another_process_after_sigkill_and_run_once_across_a_crash(
    tmp_path, db_path, env
):
    log = tmp_path / "runs.log"
    worker = [sys.executable, str(TESTS / "approval_worker.py"), str(db_path), str(log)]

    # 1. A process pauses the task, then is killed.
    first = subprocess.Popen([*worker, "pause"], stdout=subprocess.PIPE, env=env, text=True)
    paused = json.loads(first.stdout.readline())
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert paused["stop_reason"] == "awaiting_approval"
    assert pending(db_path) == [(paused["task_id"], paused["call_id"], "pending")]
    assert not log.exists()

    # 2. Another process approves it; the call starts and the process dies during it.
    second = subprocess.Popen([*worker, "approve", paused["task_id"], paused["call_id"]],
                              env=env)
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text()):
        assert time.monotonic() < deadline and second.poll() is None
        time.sleep(0.05)
    second.send_signal(signal.SIGKILL)
    second.wait(timeout=10)
    assert pending(db_path) == [(paused["task_id"], paused["call_id"], "running")]

    # A second decision, from this process, is refused.
    async def decide_again() -> None:
        store = SQLiteStore(db_path)
        try:
            with pytest.raises(ConflictError, match="already decided"):
                await store.decide_approvals(paused["task_id"], "ada", {paused["call_id"]: True})
        finally:
            await store.close()

    import asyncio

    asyncio.run(decide_again())

    # 3. A third process resumes: the interrupted call is never run again.
    third = subprocess.run([*worker, "finish", paused["task_id"]], capture_output=True,
                           text=True, env=env, timeout=60)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["stop_reason"] == "completed"
    assert log.read_text() == "once\n"  # exactly one run across the crash
    [result] = stored_results(db_path)
    assert result["interrupted"] is True and "will not run again" in result["error"]
    assert pending(db_path) == [] and rows(db_path, "SELECT * FROM task_workspaces") == []
    assert rows(db_path, "PRAGMA integrity_check") == [("ok",)]
