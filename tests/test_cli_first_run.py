"""What a new user meets first on the command line (issue 26): what can be checked is checked
before a model is made (the offline one takes seconds to load), a path's missing directories
are not created, and a closed standard output ends a run quietly with its task kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from cli_run import Cli, rows, step
from conftest import IN_CI


@pytest.fixture
def cli(tmp_path, db_path):
    return Cli(tmp_path, db_path)


def _refused_before_the_model(done, tmp_path, message: str) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"error: {message}") and done.stderr.count("\n") == 1, \
        done.stderr
    assert "loading the model" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "model-made").exists()  # cli_models never made the model


def test_an_empty_query_is_refused_before_anything(cli, tmp_path, db_path):
    for query in ("", "   "):
        done = cli("run", query, script=[step(response="x")],
                   COGENCY_TEST_STARTED=str(tmp_path / "model-made"))
        _refused_before_the_model(done, tmp_path, "the query is empty: say what to do")
    assert not db_path.exists()


def test_a_db_in_a_missing_directory_is_refused_and_nothing_is_created(cli, tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    done = cli("run", "hi", "--db", str(missing), db=False, script=[step(response="x")],
               COGENCY_TEST_STARTED=str(tmp_path / "model-made"))
    _refused_before_the_model(done, tmp_path, f"cannot create the database '{missing}': there "
                                              f"is no directory '{missing.parent}'")
    assert not (tmp_path / "nonexistent").exists()
    # The default database's own directory is still made for it.
    default = cli("run", "hi", db=False, script=[step(response="made it")])
    assert default.returncode == 0, default.stderr
    assert (tmp_path / "default" / "cogency.db").is_file()  # COGENCY_DB (tests/conftest.py)


def test_a_missing_postgres_database_is_refused_before_the_model(cli, tmp_path):
    pytest.importorskip("asyncpg")
    url = "postgresql://postgres@127.0.0.1:5432/cogency_no_such_database"
    done = cli("run", "hi", "--db", url, db=False, script=[step(response="x")],
               COGENCY_TEST_STARTED=str(tmp_path / "model-made"))
    _refused_before_the_model(done, tmp_path, f"the database in {url} does not exist")


def test_a_read_only_database_is_refused_before_the_model(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    database = shared / "team.db"
    setup = Cli(tmp_path, database)("run", "hello", script=[step(response="hi")])
    assert setup.returncode == 0, setup.stderr
    if shutil.which("unshare") is None:
        if IN_CI:
            raise AssertionError("unshare (util-linux) is needed to mount a read-only directory")
        pytest.skip("unshare is not installed: cannot make a read-only file system here")
    cli = Cli(tmp_path, database)
    argv = " ".join(cli.argv(("run", "again"), "cli_models:scripted", False, True))
    env = cli.env([step(response="x")], COGENCY_TEST_STARTED=str(tmp_path / "model-made"))
    done = subprocess.run(  # a read-only bind mount: read-only even for root
        ["unshare", "-rm", "sh", "-c", f"mount --bind -o ro {shared} {shared} && {argv}"],
        capture_output=True, text=True, env=env, timeout=60)
    _refused_before_the_model(done, tmp_path, f"the database '{database}' cannot be written "
                                              "by this process")
    assert rows(database, "SELECT COUNT(*) FROM conversation_messages") == [(2,)]


@pytest.mark.parametrize("answer_stored", [True, False], ids=["completes", "pauses"])
def test_a_closed_stdout_ends_quietly_and_keeps_the_task(tmp_path, db_path, answer_stored):
    """`cogency run … --json | head -1`: the reader goes away after the first line; the run
    goes on to its end unseen (its answer stored, or its task paused for approval)."""
    gate = tmp_path / "gate"
    then = (step(response="the whole answer") if answer_stored else
            step(actions=[{"name": "file_write", "args": {"path": "x.txt", "content": "y"}}]))
    cli = Cli(tmp_path, db_path)
    process = subprocess.Popen(
        [*cli.argv(("run", "hi", "--json", "--tools", "files"), "cli_models:scripted", False,
                   True)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env=cli.env([{"<gate>": str(gate), "reply": then}]),
    )
    try:
        assert json.loads(process.stdout.readline())["type"] == "start"
        process.stdout.close()  # as `head -1` does once it has its line
        gate.touch()  # only now does the model answer: every later line meets a closed pipe
        err = process.stderr.read().decode()
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert "Broken pipe" not in err and "Traceback" not in err and "BrokenPipe" not in err
    if answer_stored:
        assert (code, err) == (0, "")
        assert rows(db_path, "SELECT role, content FROM conversation_messages ORDER BY seq") == [
            ("user", "hi"), ("assistant", "the whole answer")]
        assert rows(db_path, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    else:  # paused for approval (no terminal): the task waits, and stderr says how to decide
        assert code == 3 and "waits for your approval" in err
        assert rows(db_path, "SELECT COUNT(*) FROM task_workspaces") == [(1,)]
        assert not (tmp_path / "x.txt").exists()


def test_a_closed_stdout_ends_a_listing_quietly(cli, tmp_path, db_path):
    assert cli("run", "hello", script=[step(response="a")]).returncode == 0
    reader, writer = os.pipe()
    os.close(reader)  # no reader at all: the first line written meets a closed pipe
    try:
        done = subprocess.run(cli.argv(("conversations",), None, False, True), stdout=writer,
                              stderr=subprocess.PIPE, env=cli.env(), timeout=60, cwd=tmp_path)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (0, b"")
