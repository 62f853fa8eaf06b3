"""The ``cogency`` command, run for real in a subprocess against a fresh database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cli_run import COMMAND, TESTS, Cli, rows, step


@pytest.fixture
def cli(tmp_path, db_path):
    """``cli(*args, script=[...])`` runs the ``cogency`` command and returns what it did."""
    return Cli(tmp_path, db_path)


def test_run_streams_thinking_tool_calls_and_the_answer(cli, tmp_path, db_path):
    (tmp_path / "notes.txt").write_text("the secret number is 42\n")
    done = cli("run", "What number is in notes.txt?", "--user", "alice", "--tools", "files",
               script=[step(actions=[{"name": "file_read", "args": {"path": "notes.txt"}}],
                            a="read the file"),
                       step(response="The number is 42.", u="the file says 42")])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "approach: read the file" in out
    assert "→ file_read" in out and '"path": "notes.txt"' in out
    assert "✓ file_read: the secret number is 42" in out
    assert "The number is 42." in out
    assert out.index("→ file_read") < out.index("✓ file_read") < out.index("The number is 42.")
    assert "completed · 2 iterations" in out
    assert done.stderr == ""
    stored = rows(db_path, "SELECT m.role, p.user_id FROM conversation_messages m JOIN "
                           "conversations p USING (conversation_id) ORDER BY m.seq")
    assert stored == [("user", "alice"), ("assistant", "alice"), ("tool", "alice"),
                      ("assistant", "alice")]
    assert rows(db_path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]


def test_json_prints_one_event_per_line(cli):
    done = cli("run", "hi", "--json", script=[step(response="hello")])
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    types = [event["type"] for event in events]
    assert types[0] == "start" and types[-1] == "end"
    assert types.index("reason") < types.index("response") < types.index("end")
    assert events[types.index("response")]["text"] == "hello"
    assert events[-1]["stop_reason"] == "completed"
    assert len({event["task_id"] for event in events}) == 1


def test_db_url_chooses_durability_and_a_bad_setting_is_one_line(cli, tmp_path):
    url = f"sqlite:///{tmp_path}/durable.db?synchronous=full"
    done = cli("run", "hi", "--db", url, script=[step(response="hello")], db=False)
    assert done.returncode == 0, done.stderr
    assert "hello" in done.stdout
    assert rows(tmp_path / "durable.db", "SELECT role FROM conversation_messages") == [
        ("user",), ("assistant",)]
    done = cli("run", "hi", "--db", f"sqlite:///{tmp_path}/x.db?synchronous=off",
               script=[step(response="never")], db=False)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("error: synchronous must be 'normal' or 'full', not 'off'")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


def test_errors_are_one_line_and_debug_shows_the_traceback(cli):
    done = cli("run", "hi", llm="nosuchprovider:model")
    assert done.returncode == 1
    assert done.stderr.startswith("error: unknown model 'nosuchprovider:model'")
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
    debug = cli("run", "hi", "--debug", llm="nosuchprovider:model")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("error: unknown model")


def test_a_failing_model_exits_non_zero_and_the_task_can_be_resumed(cli, db_path):
    done = cli("run", "hi", llm="cli_models:bad_key")
    assert done.returncode == 1
    assert "error: the provider rejected the key: set OPENAI_API_KEY" in done.stderr
    assert "resume with: cogency resume" in done.stderr
    assert len(rows(db_path, "SELECT task_id FROM task_workspaces")) == 1


def test_stopped_task_is_listed_and_resumed(cli, db_path):
    stalled = cli("run", "count to three", "--user", "bob", "--max-iterations", "1",
                  script=[step(objective="count")])
    assert stalled.returncode == 1
    assert "max_iterations" in stalled.stderr
    (task_id,) = rows(db_path, "SELECT task_id FROM task_workspaces")[0]
    assert f"cogency resume {task_id}" in stalled.stderr
    listed = cli("tasks")
    assert listed.returncode == 0 and task_id in listed.stdout and "count to three" in listed.stdout
    as_json = [json.loads(line) for line in cli("tasks", "--json").stdout.splitlines()]
    assert as_json[0]["task_id"] == task_id and as_json[0]["workspace"]["objective"] == "count"
    resumed = cli("resume", task_id, "--user", "bob", script=[step(response="1, 2, 3")])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming " + task_id in resumed.stdout and "1, 2, 3" in resumed.stdout
    assert cli("tasks").stdout.strip() == "no unfinished tasks"
    other = cli("resume", task_id, "--user", "mallory", script=[step(response="x")])
    assert other.returncode == 1 and other.stderr.startswith("error:")


def test_conversations_and_profile_commands(cli, db_path):
    first = cli("run", "first question", "--user", "carol", "--json",
                script=[step(response="first answer")])
    conversation = json.loads(first.stdout.splitlines()[0])["conversation_id"]
    again = cli("run", "second question", "--user", "carol", "--conversation", conversation,
                script=[step(response="second answer")])
    assert again.returncode == 0, again.stderr
    listed = cli("conversations", "--user", "carol")
    assert listed.returncode == 0 and conversation in listed.stdout and "4 messages" in listed.stdout
    shown = cli("conversations", "show", conversation, "--user", "carol")
    assert shown.stdout.splitlines() == ["user: first question", "assistant: first answer",
                                         "user: second question", "assistant: second answer"]
    stranger = cli("conversations", "show", conversation, "--user", "dave")
    assert stranger.returncode == 1 and stranger.stderr.startswith("error:")
    assert "first answer" not in stranger.stdout + stranger.stderr
    profile = cli("profile", "show", "carol")
    assert profile.returncode == 0 and '"user_id": "carol"' in profile.stdout
    forgot = cli("profile", "forget", "carol", "--yes")
    assert forgot.returncode == 0 and "forgot 'carol'" in forgot.stdout
    for table in ("user_profiles", "conversations", "conversation_messages", "task_workspaces"):
        assert rows(db_path, f"SELECT COUNT(*) FROM {table}") == [(0,)]
    assert "nothing is stored" in cli("profile", "show", "carol").stdout


def test_unknown_tool_set_is_an_error(cli):
    done = cli("run", "hi", "--tools", "files,teleport", script=[step(response="x")])
    assert done.returncode == 1
    assert "unknown tool set 'teleport'" in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery differs on Windows")
def test_ctrl_c_exits_130_and_leaves_the_task_resumable(tmp_path, db_path):
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(["<hang>"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]), "COGENCY_TEST_SCRIPT": str(script_file)}
    process = subprocess.Popen(
        [*COMMAND, "run", "a long task", "--json", "--db",
         str(db_path), "--llm", "cli_models:scripted"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # As a terminal starts it: Ctrl-C's default disposition, whatever this test's parent
        # had (a process started with SIGINT ignored rightly keeps ignoring it).
        preexec_fn=_sigint_default,
    )
    try:
        start = json.loads(process.stdout.readline())  # the run has begun
        assert start["type"] == "start"
        deadline = time.monotonic() + 20
        while not rows(db_path, "SELECT COUNT(*) FROM conversation_messages")[0][0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert f"resume with: cogency resume {start['task_id']}" in err
    assert rows(db_path, "SELECT task_id, runner FROM task_workspaces") == [
        (start["task_id"], None)]  # saved, and released so it can be resumed at once


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_query_too_long_for_the_window_is_a_clear_error(cli, db_path):
    from cogency.tokens import count_tokens

    query = " ".join(f"word{i}" for i in range(4_000))
    done = cli("run", query, script=[step(response="never")], llm="cli_models:small_window")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"the query is {count_tokens(query):,} tokens" in done.stderr
    assert "context window of 2,048 tokens" in done.stderr
    assert not db_path.exists() or rows(db_path, "SELECT COUNT(*) FROM conversation_messages") \
        == [(0,)]
