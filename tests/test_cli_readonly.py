"""Read-only commands never create, migrate or write a database (issues 11 and 13)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess

import pytest
from cli_run import COMMAND, Cli, rows, step

from cogency import Agent
from cogency.errors import CogencyError, NotFoundError, StorageError
from cogency.state import State
from cogency.storage import SQLiteStore, open_store
from cogency.storage.base import MIGRATION_NAMES
from cogency.storage.sqlite import migrate
from cogency.testing import ScriptedLLM

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
READ_COMMANDS = [("tasks",), ("conversations", "--user", "ann"), ("profile", "show", "ann")]


@pytest.fixture
def cli(tmp_path, db_path):
    return Cli(tmp_path, db_path)


async def _stored(path) -> None:
    """A database holding ann's finished task and one of her unfinished ones."""
    llm = ScriptedLLM([step(response="hello"), step(objective="count")])
    async with Agent(llm=llm, store=str(path), max_iterations=1) as agent:
        await agent.run("hi", user_id="ann")
        await agent.run("count to three", user_id="ann")


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_mistyped_db_is_an_error_and_leaves_nothing_behind(cli, tmp_path, command):
    done = cli(*command, "--db", "typo/x.db", db=False)
    assert done.returncode == 1
    assert done.stderr == ("error: there is no database at 'typo/x.db' (nothing was ever stored "
                           "there); check the path\n")
    assert not (tmp_path / "typo").exists()


def test_nothing_stored_yet_creates_nothing(cli, tmp_path):
    default = tmp_path / "default"  # COGENCY_DB points inside it (tests/conftest.py)
    listed = cli("tasks", db=False)
    assert listed.returncode == 0 and listed.stdout == "no unfinished tasks (nothing is stored yet)\n"
    assert not default.exists()


async def test_read_commands_work_on_a_read_only_file(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    await _stored(shared / "team.db")
    before = sorted(os.listdir(shared))
    if shutil.which("unshare") is None:
        if IN_CI:
            raise AssertionError("unshare (util-linux) is needed to mount a read-only directory")
        pytest.skip("unshare is not installed: cannot make a read-only file system here")
    # A read-only bind mount in a private mount namespace: read-only even for root.
    database = shared / "team.db"
    script = " && ".join(
        [f"mount --bind -o ro {shared} {shared}"]
        + [" ".join([*COMMAND, *command, "--db", str(database)]) for command in READ_COMMANDS]
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                          env=Cli(tmp_path, database).env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "count to three" in done.stdout  # tasks
    assert "2 messages" in done.stdout  # conversations
    assert '"user_id": "ann"' in done.stdout  # profile show
    assert sorted(os.listdir(shared)) == before


def test_an_old_schema_read_only_says_to_upgrade_and_is_left_alone(cli, tmp_path):
    old = tmp_path / "old.db"
    connection = sqlite3.connect(old, isolation_level=None)
    migrate(connection, upto="m003_task_workspace_columns")
    connection.close()
    done = cli("tasks", "--db", str(old), db=False)
    assert done.returncode == 1
    assert "has an older schema (missing " in done.stderr and "m008_task_settings" in done.stderr
    assert "open it once for writing" in done.stderr
    assert [name for (name,) in rows(old, "SELECT name FROM schema_migrations")] == [
        "m001_initial", "m002_conversation_messages", "m003_task_workspace_columns"]


async def test_read_only_stores_read_and_never_write(any_store, tmp_path):
    """Both backends: a read-only store lists what a writable one stored (a task's settings
    included), and refuses writes."""
    await any_store.forget_user("nobody")  # opens and migrates the schema
    async with Agent(llm=ScriptedLLM([step(objective="count")]), store=any_store,
                     max_iterations=1) as agent:
        await agent.run("count to three", user_id="ann")
    kept = await State.start_task("later", "ann", store=any_store,
                                  settings={"tools": "files", "root": "/srv/x"})
    where = any_store.path if isinstance(any_store, SQLiteStore) else any_store.dsn
    reader = open_store(where, read_only=True)
    try:
        task, later = await reader.list_tasks("ann")
        assert task.query == "count to three" and task.settings == {}
        assert (later.task_id, later.settings) == (kept.task_id, {"tools": "files",
                                                                   "root": "/srv/x"})
        assert (await reader.load_task(later.task_id, "ann")).settings == later.settings
        assert (await reader.load_profile("ann")).user_id == "ann"
        with pytest.raises(CogencyError):
            await reader.forget_user("ann")
    finally:
        await reader.close()
    assert [t.task_id for t in await any_store.list_tasks("ann")] == [task.task_id, kept.task_id]


async def test_read_only_postgres_never_migrates():
    import pgutil

    from cogency.storage import postgres

    async with pgutil.fresh_database() as url:
        empty = postgres.PostgresStore(url, read_only=True)
        with pytest.raises(StorageError, match="holds no Cogency tables"):
            await empty.list_tasks()
        await empty.close()
        import asyncpg

        connection = await asyncpg.connect(url)
        try:
            await postgres.migrate(connection, upto="m003_task_workspace_columns")
            old = postgres.PostgresStore(url, read_only=True)
            with pytest.raises(StorageError, match="older schema .missing .*m008_task_settings"):
                await old.list_tasks()
            await old.close()
            applied = {row[0] for row in await connection.fetch("SELECT name FROM schema_migrations")}
        finally:
            await connection.close()
    assert applied == set(MIGRATION_NAMES[:3])


async def test_read_only_sqlite_missing_file_is_not_found(tmp_path):
    store = SQLiteStore(tmp_path / "missing" / "x.db", read_only=True)
    with pytest.raises(NotFoundError, match="no database"):
        await store.list_tasks()
    await store.close()
    assert not (tmp_path / "missing").exists()
