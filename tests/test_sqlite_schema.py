"""The squashed SQLite schema: a new database made in one step is exactly the one replaying every
migration makes, the generated module is what its script writes today, and older databases
still migrate step by step."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

from cogency import Agent
from cogency.storage import SQLiteStore
from cogency.storage import _sqlite_schema
from cogency.storage.base import MIGRATION_NAMES
from cogency.storage.sqlite import migrate
from cogency.testing import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "regenerate it: python scripts/squash_sqlite_schema.py"


def schema(path: Path) -> dict[str, list[tuple]]:
    """All of a database's schema, read by a new connection: ``sqlite_master`` and each
    table's columns, indexes (with their columns) and foreign keys."""
    db = sqlite3.connect(path)
    try:
        master = db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
        found = {"master": master, "user_version": db.execute("PRAGMA user_version").fetchall()}
        for kind, name, _, _ in master:
            pragmas = (("table_info", "index_list", "foreign_key_list") if kind == "table"
                       else ("index_xinfo",) if kind == "index" else ())
            for pragma in pragmas:
                found[f"{pragma}({name})"] = db.execute(f"PRAGMA {pragma}('{name}')").fetchall()
        return found
    finally:
        db.close()


def made(path: Path, *, replay: bool = False, upto: str | None = None) -> Path:
    """A database at ``path`` migrated with ``migrate`` as asked."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(db, upto, replay=replay)
    finally:
        db.close()
    return path


def stamps(path: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT name, applied_at FROM schema_migrations ORDER BY name").fetchall()
    finally:
        db.close()


def test_a_new_database_made_in_one_step_equals_every_migration_replayed(tmp_path):
    squashed, replayed = made(tmp_path / "squashed.db"), made(tmp_path / "replayed.db", replay=True)
    assert schema(squashed) == schema(replayed)
    assert len(schema(squashed)["master"]) > 20  # not two empty files
    # One step recorded every migration (at one moment); the replay, each at its own.
    assert [name for name, _ in stamps(squashed)] == list(MIGRATION_NAMES)
    assert len({stamp for _, stamp in stamps(squashed)}) == 1
    assert len({stamp for _, stamp in stamps(replayed)}) == len(MIGRATION_NAMES)


def test_the_generated_module_is_what_the_script_writes_now():
    assert _sqlite_schema.MIGRATION_NAMES == MIGRATION_NAMES, (
        f"src/cogency/storage/_sqlite_schema.py is for other migrations: {REGENERATE}")
    spec = importlib.util.spec_from_file_location(
        "squash_sqlite_schema", ROOT / "scripts" / "squash_sqlite_schema.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    written = (ROOT / "src" / "cogency" / "storage" / "_sqlite_schema.py").read_text()
    assert written == script.render(), (
        f"src/cogency/storage/_sqlite_schema.py differs from the migrations: {REGENERATE}")


async def test_a_new_database_works_end_to_end_with_every_migration_recorded(tmp_path):
    path = tmp_path / "new.db"
    store = SQLiteStore(path)
    try:
        agent = Agent(llm=ScriptedLLM([{"response": "Hello, Ada.", "actions": []}]), store=store)
        result = await agent.run("hello", user_id="ada")
        assert result.stop_reason == "completed" and result.response == "Hello, Ada."
        messages = await store.load_messages(result.conversation_id, "ada")
        assert [m["role"] for m in messages] == ["user", "assistant"]
    finally:
        await store.close()
    assert [name for name, _ in stamps(path)] == list(MIGRATION_NAMES)
    assert len({stamp for _, stamp in stamps(path)}) == 1  # made in one step
    assert schema(path)["master"] == schema(made(tmp_path / "replayed.db", replay=True))["master"]


async def test_an_older_database_still_migrates_step_by_step(tmp_path):
    path = made(tmp_path / "old.db", upto=MIGRATION_NAMES[4])
    assert [name for name, _ in stamps(path)] == sorted(MIGRATION_NAMES[:5])
    store = SQLiteStore(path)
    try:
        assert await store.list_tasks() == []  # opens, so migrates
    finally:
        await store.close()
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True))
    applied = dict(stamps(path))
    assert sorted(applied) == sorted(MIGRATION_NAMES)
    assert len({applied[name] for name in MIGRATION_NAMES[5:]}) == len(MIGRATION_NAMES) - 5


def test_a_squashed_schema_not_regenerated_is_never_used(tmp_path, monkeypatch):
    # A migration added without running the script: new databases replay (slow, not wrong).
    monkeypatch.setattr(_sqlite_schema, "MIGRATION_NAMES", MIGRATION_NAMES[:-1])
    monkeypatch.setattr(_sqlite_schema, "STATEMENTS", ())
    path = made(tmp_path / "new.db")
    monkeypatch.undo()
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True))
    assert len({stamp for _, stamp in stamps(path)}) == len(MIGRATION_NAMES)
