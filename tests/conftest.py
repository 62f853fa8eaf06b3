"""Shared fixtures: a fresh store per test, on SQLite and (for the contract suite) PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cogency.storage import SQLiteStore

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "cogency.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteStore]:
    """A SQLite store on a fresh file, closed after the test."""
    sqlite_store = SQLiteStore(db_path)
    yield sqlite_store
    await sqlite_store.close()


@pytest.fixture
def db(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to the test database, to assert on what is really stored."""
    connection = sqlite3.connect(db_path)
    yield connection
    connection.close()


@pytest.fixture(autouse=True)
def _isolated_default_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code that falls back to the default database writes under tmp_path, never ~/.local."""
    monkeypatch.setenv("COGENCY_DB", str(tmp_path / "default" / "cogency.db"))


@pytest.fixture
def tokenizer_unloaded(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], int]:
    """The test starts as a fresh process does: the exact encoding not loaded, so messages are
    stored with the upper bound of their tokens until the code under test needs an exact count
    (the encoding then loads, into a cache dropped after the test). Returns an exact counter
    for the test's own expectations that leaves the module as it found it (loaded or not)."""
    import cogency.tokens as tokens

    monkeypatch.setattr(tokens, "_loaded", [])
    kept: list[object] = []

    def exact(text: str) -> int:
        before = list(tokens._loaded)
        if kept:
            tokens._loaded[:] = kept
        try:
            return tokens.count_tokens(text)
        finally:
            kept[:] = tokens._loaded
            tokens._loaded[:] = before

    return exact


# -- the contract suite: every test using `any_store` runs on SQLite and on PostgreSQL ----------

BACKENDS = ["sqlite", "postgres"]


@asynccontextmanager
async def open_backend(kind: str, tmp_path: Path) -> AsyncIterator[object]:
    """A fresh, empty store: ``sqlite``; ``postgres`` (a uniquely named database, dropped
    after, used by an ordinary role, so row-level security holds); ``pgbouncer`` (the same,
    through this session's PgBouncer in transaction mode)."""
    if kind == "sqlite":
        sqlite_store = SQLiteStore(tmp_path / "contract.db")
        yield sqlite_store
        await sqlite_store.close()
        return
    import pgutil  # tests/pgutil.py: creates and drops a database per test

    port = pgutil.pgbouncer("transaction").port if kind == "pgbouncer" else None
    async with pgutil.fresh_store(as_app=True, port=port) as pg_store:
        yield pg_store


@pytest.fixture(params=BACKENDS)
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    """A fresh, empty store of each backend."""
    async with open_backend(request.param, tmp_path) as store:
        yield store


@pytest.fixture
def raw(any_store: object):
    """``await raw(sql, *params)``: rows straight from the backing database (``?`` placeholders)."""
    if isinstance(any_store, SQLiteStore):

        async def sqlite_rows(sql: str, *params: object) -> list[tuple]:
            connection = sqlite3.connect(any_store.path)
            try:
                return connection.execute(sql, params).fetchall()
            finally:
                connection.close()

        return sqlite_rows
    import pgutil

    return pgutil.raw_rows(any_store)


@pytest.fixture
def raw_write(any_store: object, raw):
    """``await raw_write(sql, *params)``: change rows behind the store's back, committed.

    (``raw`` reads; on SQLite its connection closes without committing, so writes through it
    would be rolled back.)
    """
    if isinstance(any_store, SQLiteStore):

        async def sqlite_write(sql: str, *params: object) -> None:
            connection = sqlite3.connect(any_store.path, isolation_level=None)
            try:
                connection.execute(sql, params)
            finally:
                connection.close()

        return sqlite_write

    async def server_write(sql: str, *params: object) -> None:
        await raw(sql, *params)  # a server session commits each statement on its own

    return server_write


# -- PostgreSQL only --------------------------------------------------------------------------


@pytest.fixture
async def pg() -> AsyncIterator[object]:
    """A PostgresStore on a fresh, uniquely named database (dropped after the test)."""
    import pgutil

    async with pgutil.fresh_store() as store:
        yield store


@pytest.fixture
async def observer(pg: object) -> AsyncIterator[object]:
    """A plain asyncpg connection to ``pg``'s database, outside the store."""
    import pgutil

    await pg.list_tasks()  # type: ignore[attr-defined]  # creates the schema
    connection = await pgutil.connect(pg.dsn)  # type: ignore[attr-defined]
    yield connection
    await connection.close()


# -- real model servers (tests/realservers.py): one of each per session -----------------------


def pytest_collection_finish(session: pytest.Session) -> None:
    """LiteLLM's proxy takes tens of seconds to start: begin as soon as a test will need it."""
    if any("litellm_proxy" in getattr(item, "fixturenames", ()) for item in session.items):
        from realservers import SERVERS

        try:
            SERVERS.start_litellm()
        except Exception as exc:  # reported by the fixture, in the tests that need it
            SERVERS.litellm_error = f"could not start LiteLLM's proxy: {exc}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    import sys

    if "realservers" in sys.modules:
        sys.modules["realservers"].SERVERS.stop()
    if "pgutil" in sys.modules:
        sys.modules["pgutil"].stop_pgbouncers()


def _need(what: str, error: Exception) -> None:
    if IN_CI:
        raise error  # in CI a real-server test never skips
    pytest.skip(f"{what} is not available here: {error}")


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The root URL of llama.cpp's server with SmolLM2-135M (OpenAI and Anthropic APIs)."""
    from realservers import SERVERS

    try:
        return SERVERS.llama()
    except Exception as exc:
        _need("llama.cpp's server (the 'local' extra and the offline model)", exc)
        raise


@pytest.fixture(scope="session")
def litellm_proxy(llama_server: str) -> str:
    """The URL of LiteLLM's proxy in front of ``llama_server`` (Gemini's API)."""
    from realservers import SERVERS

    try:
        return SERVERS.litellm()
    except Exception as exc:
        _need("LiteLLM's proxy", exc)
        raise
