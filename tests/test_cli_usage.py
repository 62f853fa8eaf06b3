"""The command line as a new user meets it (issue 13): every point through the real command."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import pytest
from cli_run import TESTS, Cli, learned, rows, step

from cogency.cli import build_parser


@pytest.fixture
def cli(tmp_path, db_path):
    return Cli(tmp_path, db_path)


def test_version_and_help_for_every_argument_and_subcommand(cli):
    from cogency import __version__

    version = cli("--version", db=False)
    assert version.returncode == 0 and version.stdout.strip() == f"cogency {__version__}"
    top = cli("--help", db=False)
    for command in ("run", "resume", "tasks", "conversations", "profile"):
        assert command in top.stdout
    run = cli("run", "--help", db=False, llm=None, memory=True)
    assert run.returncode == 0
    assert "--no-memory" in run.stdout and "cogency run -" in run.stdout
    # Every option and operand of every subcommand says what it is for.
    def check(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            assert action.help, f"`{name}` has {action.dest} without help"
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                assert set(helps) == set(action.choices) and all(helps.values()), name
                for sub_name, sub in action.choices.items():
                    check(sub, f"{name} {sub_name}")

    check(build_parser(), "cogency")


def test_the_cli_learns_the_profile_unless_told_not_to(cli, db_path):
    quiet = cli("run", "hello", "--user", "dana",
                script=[step(response="hi"), learned(interests=["chess"])])
    assert quiet.returncode == 0, quiet.stderr
    assert "chess" not in cli("profile", "show", "dana").stdout  # --no-memory learned nothing
    taught = cli("run", "I write Rust at work", "--user", "dana", memory=True,
                 script=[step(response="noted"),
                         learned(preferences=[{"key": "language", "value": "Rust"}])])
    assert taught.returncode == 0, taught.stderr
    assert taught.stderr == "learning about 'dana' from this task… (--no-memory skips this)\n"
    shown = cli("profile", "show", "--user", "dana")
    assert shown.returncode == 0
    profile = json.loads(shown.stdout)
    assert profile["preferences"] == {"language": "Rust"} and profile["interests"] == []
    (stored,) = rows(db_path, "SELECT profile_data FROM user_profiles WHERE user_id = 'dana'")[0]
    assert json.loads(stored)["preferences"] == {"language": "Rust"}
    # A model too small to learn (the default offline one) is not asked, and not warned about.
    small = cli("run", "hi", "--user", "dana", memory=True, llm="cli_models:cannot_learn",
                script=[step(response="hello")])
    assert small.returncode == 0 and small.stderr == ""


def test_hints_work_as_printed_and_resume_keeps_tools_and_root(cli, tmp_path, db_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("the code is 7\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stalled = cli("run", "What code is in notes.txt?", "--user", "bob", "--tools", "files",
                  "--root", str(work), "--max-iterations", "1",
                  script=[step(objective="find the code")])
    assert stalled.returncode == 1
    (task,) = rows(db_path, "SELECT task_id FROM task_workspaces")[0]
    hint = stalled.stderr.split("resume with: ")[1].strip()
    assert hint == f"cogency resume {task} --user bob --db {shlex.quote(str(db_path))}"
    listed = cli("tasks")
    assert f"resume: {hint}" in listed.stdout
    # The printed command, run from another directory with no --tools/--root/--llm: the task
    # still has its model, its files tools and its root.
    script = [step(actions=[{"name": "file_read", "args": {"path": "notes.txt"}}]),
              step(response="The code is 7."), learned()]
    resumed = subprocess.run(shlex.split(hint), capture_output=True, text=True,
                             env=cli.env(script), cwd=elsewhere, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "✓ file_read: the code is 7" in resumed.stdout and "The code is 7." in resumed.stdout
    assert rows(db_path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    # The conversation listing's hint works as printed too.
    conversations = cli("conversations", "--user", "bob")
    show = conversations.stdout.strip().splitlines()[-1].removeprefix("show the newest: ")
    shown = subprocess.run(shlex.split(show), capture_output=True, text=True,
                           env=cli.env(), timeout=60)
    assert shown.returncode == 0 and "assistant: The code is 7." in shown.stdout


def test_a_task_held_by_a_live_run_names_the_release_command(cli, db_path):
    held = subprocess.Popen(
        cli.argv(("run", "a long task", "--json", "--user", "bob"), "cli_models:scripted",
                 False, True),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli.env(["<hang>"]), cwd=cli.tmp,
    )
    try:
        task = json.loads(held.stdout.readline())["task_id"]
        busy = cli("resume", task, "--user", "bob", script=[step(response="x")])
        assert busy.returncode == 1 and "is running in another process" in busy.stderr
        release = f"cogency tasks release {task} --user bob --db {db_path}"
        assert release in busy.stderr
        released = subprocess.run(shlex.split(release), capture_output=True, text=True,
                                  env=cli.env(), timeout=60)
        assert released.returncode == 0, released.stderr
        assert f"Resume it with: cogency resume {task} --user bob --db {db_path}" in \
            released.stdout
    finally:
        held.kill()
        held.communicate()
    assert rows(db_path, "SELECT runner FROM task_workspaces") == [(None,)]


def test_unknown_conversation_is_an_error_and_an_id_alone_shows_one(cli, db_path):
    first = cli("run", "first", "--user", "erin", "--json", script=[step(response="one")])
    conversation = json.loads(first.stdout.splitlines()[0])["conversation_id"]
    typo = cli("run", "second", "--user", "erin", "--conversation", conversation + "x",
               script=[step(response="two")])
    assert typo.returncode == 1
    assert typo.stderr.startswith(f"error: no conversation '{conversation}x' for user 'erin'")
    assert f"cogency conversations --user erin --db {db_path}" in typo.stderr
    assert rows(db_path, "SELECT conversation_id FROM conversations") == [(conversation,)]
    assert rows(db_path, "SELECT COUNT(*) FROM conversation_messages") == [(2,)]
    shown = cli("conversations", conversation, "--user", "erin")
    assert shown.returncode == 0 and shown.stdout.splitlines() == ["user: first", "assistant: one"]
    wrong = cli("conversations", "a", "b", "--user", "erin")
    assert wrong.returncode == 1 and "cogency conversations b --user erin" in wrong.stderr


def test_the_query_comes_from_stdin(cli, db_path):
    big = ("a line of the long input\n" * 44_000).encode()  # ~1 MB
    assert len(big) > 1_000_000
    done = cli("run", "-", "--json", input=big, script=[step(response="read it")],
               llm="cli_models:big_window")
    assert done.returncode == 0, done.stderr
    piped = cli("run", "--json", input="piped question\n".encode(), script=[step(response="ok")])
    assert piped.returncode == 0, piped.stderr
    stored = rows(db_path, "SELECT content FROM conversation_messages WHERE role = 'user' "
                           "ORDER BY rowid")
    assert [len(text) for (text,) in stored] == [len(big) - 1, len("piped question")]
    empty = cli("run", "-", input=b"  \n", script=[step(response="x")])
    assert empty.returncode == 1 and "empty" in empty.stderr
    huge = cli("run", "-", input=b"x" * (16 * 2**20 + 1), script=[step(response="x")])
    assert huge.returncode == 1 and "larger than 16 MB" in huge.stderr
    assert rows(db_path, "SELECT COUNT(*) FROM conversation_messages WHERE role = 'user'") == [(2,)]


def test_model_loading_and_waits_are_shown_as_they_happen(cli, tmp_path):
    """Driven by gates, not by sleeps: the model loads when the test has seen "loading…",
    and answers once the test has seen two "still waiting" notices; only bounds that any
    delay keeps true are checked (each notice needs --wait-notice seconds of silence)."""
    load_gate, reply_gate = tmp_path / "loaded", tmp_path / "answer"
    began = time.monotonic()
    process = subprocess.Popen(
        cli.argv(("run", "hi", "--wait-notice", "0.4"), "cli_models:slow", False, True),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env=cli.env([{"<gate>": str(reply_gate),
                                    "reply": step(response="late but here")}],
                                  COGENCY_TEST_DELAY="0", COGENCY_TEST_LOAD_GATE=str(load_gate)),
    )
    lines: list[str] = []
    try:
        def next_line() -> str:
            line = process.stderr.readline()
            assert line, f"the command ended early: {lines}"
            lines.append(line.rstrip("\n"))
            return lines[-1]

        assert next_line() == "loading the model (slow-test-model)…"
        load_gate.touch()
        assert next_line().startswith("model loaded in ")
        while sum(line.startswith("… still waiting for the model") for line in lines) < 2:
            next_line()
        quiet = time.monotonic() - began  # at least as long as the silence so far
        reply_gate.touch()
        out, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, lines + rest.splitlines()
    waits = [line for line in lines if line.startswith("… still waiting for the model")]
    assert len(waits) <= quiet / 0.4 + 1, waits  # one per 0.4 s of silence, not one per poll
    assert "late but here" in out


def test_retries_are_shown_as_they_happen(cli):
    done = cli("run", "hi", script=["<rate-limit>", "<rate-limit>", step(response="made it")])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    retries = [line for line in lines if line.startswith("! ")]
    assert retries == ["! RateLimitError: HTTP 429: slow down: retrying in 0.5 s (retry 1)",
                       "! RateLimitError: HTTP 429: slow down: retrying in 1.0 s (retry 2)"]
    assert lines.index(retries[1]) < lines.index("made it")


def test_json_prints_tokens_only_when_asked(cli):
    plain = cli("run", "hi", "--json", llm="cli_models:streaming",
                script=[step(response="a long enough answer to stream in pieces")])
    types = [json.loads(line)["type"] for line in plain.stdout.splitlines()]
    assert "token" not in types and len(types) <= 6, types
    tokens = cli("run", "hi", "--json", "--tokens", llm="cli_models:streaming",
                 script=[step(response="a long enough answer to stream in pieces")])
    pieces = [json.loads(line) for line in tokens.stdout.splitlines()]
    text = "".join(event["text"] for event in pieces if event["type"] == "token")
    assert "a long enough answer" in text


def test_profile_forget_asks_first_and_says_when_there_is_nothing(cli, db_path):
    cli("run", "hi", "--user", "carol", script=[step(response="hello")])
    refused = cli("profile", "forget", "carol")
    assert refused.returncode == 1 and "add --yes" in refused.stderr
    assert rows(db_path, "SELECT COUNT(*) FROM conversations") == [(1,)]
    status, screen = cli.tty("profile", "forget", "carol", answer=b"y\n")
    assert "erase everything stored about 'carol'" in screen and "[y/N]" in screen
    assert status == 0 and "forgot 'carol'" in screen
    for table in ("user_profiles", "conversations", "conversation_messages"):
        assert rows(db_path, f"SELECT COUNT(*) FROM {table}") == [(0,)]
    nothing = cli("profile", "forget", "carol", "--yes")
    assert nothing.returncode == 0 and "nothing to forget" in nothing.stdout


def test_the_readme_test_example_runs_outside_this_repository(tmp_path):
    readme = (TESTS.parent / "README.md").read_text()
    example = readme.split("```python\n# test_my_agent.py")[1].split("```")[0]
    project = tmp_path / "elsewhere"
    project.mkdir()
    (project / "test_my_agent.py").write_text("# test_my_agent.py" + example)
    # Only pytest-asyncio's plugin (other installed plugins would just slow the start-up).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "pytest_asyncio.plugin", "test_my_agent.py"],
        capture_output=True, text=True, cwd=project, timeout=120,
        env={**os.environ, "PYTEST_ADDOPTS": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
