"""The squashed SQLite schema: a new database made in one step is exactly the one replaying every
migration makes, the generated module is what its script writes today, and older databases
still migrate step by step. A new file is the image of that schema (``_sqlite_image``), made
whole or not at all, never over a log left beside it."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import os
import shutil
import sqlite3
import zlib
from pathlib import Path

from cogency import Agent, _time
from cogency.storage import SQLiteStore
from cogency.storage import _sqlite_image, _sqlite_schema
from cogency.storage.base import MIGRATION_NAMES
from cogency.storage.sqlite import PAGE_BYTES, migrate
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


def rows(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def stamps(path: Path) -> list[tuple[str, str]]:
    return rows(path, "SELECT name, applied_at FROM schema_migrations ORDER BY name")


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


def image() -> bytes:
    return zlib.decompress(base64.b64decode(_sqlite_image.IMAGE))


def test_the_image_holds_what_every_migration_replayed_makes(tmp_path):
    assert _sqlite_image.THROUGH == MIGRATION_NAMES[-1], (
        f"src/cogency/storage/_sqlite_image.py is for other migrations: {REGENERATE}")
    path = tmp_path / "image.db"
    path.write_bytes(image())
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True)), REGENERATE
    assert stamps(path) == sorted((name, "") for name in MIGRATION_NAMES)  # stamped when used
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA page_size").fetchone() == (PAGE_BYTES,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA freelist_count").fetchone() == (0,)
    finally:
        db.close()


async def test_a_new_file_is_the_image_flushed_once_then_stamped(tmp_path, monkeypatch):
    flushed: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    path = tmp_path / "new.db"
    before = _time.now()
    store = SQLiteStore(path)
    try:
        agent = Agent(llm=ScriptedLLM([{"response": "Hello, Ada."}]), store=store)
        assert (await agent.run("hello", user_id="ada")).response == "Hello, Ada."
        # The turn is in the log; the file itself is still the image's bytes, made unnamed,
        # flushed once, then named (no journal, no SQLite flush of its own to make it).
        assert path.read_bytes() == image()
        assert len(flushed) == 1 and flushed[0].endswith(" (deleted)")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db", "new.db-shm",
                                                              "new.db-wal"]
    finally:
        await store.close()
    applied = dict(stamps(path))
    assert sorted(applied) == sorted(MIGRATION_NAMES)
    assert len(set(applied.values())) == 1
    assert before <= _time.parse(applied[MIGRATION_NAMES[0]]) <= _time.now()
    assert rows(path, "SELECT role, content FROM conversation_messages ORDER BY seq") == [
        ("user", "hello"), ("assistant", "Hello, Ada.")]
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True))


async def test_a_log_left_beside_a_missing_file_is_never_read_into_a_new_one(tmp_path):
    # Another database's write-ahead log, left under the new file's name (its file deleted,
    # the log not): the new file must not be made of the image, or SQLite would replay those
    # pages over it. SQLite makes the file, and drops a log beside an empty file.
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    try:
        other.execute(f"PRAGMA page_size = {PAGE_BYTES}")
        other.execute("PRAGMA journal_mode = WAL")
        other.execute("PRAGMA wal_autocheckpoint = 0")
        other.execute("CREATE TABLE stranger (secret TEXT)")
        other.execute("INSERT INTO stranger VALUES ('not yours')")
        shutil.copy(tmp_path / "other.db-wal", tmp_path / "new.db-wal")
    finally:
        other.close()
    store = SQLiteStore(tmp_path / "new.db")
    try:
        agent = Agent(llm=ScriptedLLM([{"response": "hi"}]), store=store)
        assert (await agent.run("hello", user_id="ada")).response == "hi"
    finally:
        await store.close()
    assert schema(tmp_path / "new.db") == schema(made(tmp_path / "replayed.db", replay=True))
    assert rows(tmp_path / "new.db", "PRAGMA integrity_check") == [("ok",)]


async def test_stores_making_one_new_file_at_once_all_use_the_one_made(tmp_path):
    path = tmp_path / "shared.db"
    stores = [SQLiteStore(path) for _ in range(4)]
    try:
        agents = [Agent(llm=ScriptedLLM([{"response": f"hi {n}"}]), store=store)
                  for n, store in enumerate(stores)]
        results = await asyncio.gather(*(agent.run("hello", user_id=f"user{n}")
                                         for n, agent in enumerate(agents)))
        assert [result.response for result in results] == [f"hi {n}" for n in range(4)]
    finally:
        for store in stores:
            await store.close()
    assert rows(path, "SELECT COUNT(*) FROM conversation_messages") == [(8,)]
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    assert len(set(dict(stamps(path)).values())) == 1  # made once


async def test_without_unnamed_files_sqlite_makes_the_new_file(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "O_TMPFILE")  # (macOS, and file systems that lack them)
    path = tmp_path / "new.db"
    store = SQLiteStore(path)
    try:
        agent = Agent(llm=ScriptedLLM([{"response": "hi"}]), store=store)
        assert (await agent.run("hello", user_id="ada")).response == "hi"
    finally:
        await store.close()
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True))
    assert [name for name, _ in stamps(path)] == list(MIGRATION_NAMES)
    assert "" not in dict(stamps(path)).values()


async def test_an_image_not_regenerated_is_never_used(tmp_path, monkeypatch):
    # A migration added without running the script: new files are made by SQLite (not wrong).
    monkeypatch.setattr(_sqlite_image, "THROUGH", MIGRATION_NAMES[-2])
    path = tmp_path / "new.db"
    store = SQLiteStore(path)
    try:
        assert await store.list_tasks() == []  # opens, so makes the file
        assert path.read_bytes()[:16] == b"SQLite format 3\x00"
        assert path.read_bytes() != image()
    finally:
        await store.close()
    assert schema(path) == schema(made(tmp_path / "replayed.db", replay=True))
