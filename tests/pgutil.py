"""PostgreSQL test support: a uniquely named database per test, dropped afterwards.

The server is the local one on 127.0.0.1:5432 (trust auth), which ``.ci/run`` starts when it is
down; ``COGENCY_TEST_PG`` overrides the admin URL. Outside CI an unreachable server skips the test
(saying why); under ``CI=true`` it fails it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from cogency import _time
from cogency.storage.postgres import PostgresStore

ADMIN_DSN = os.environ.get("COGENCY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def dsn_for(database: str) -> str:
    """The admin URL pointed at ``database``."""
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


async def admin_connect() -> Any:
    """A plain asyncpg connection to the server's maintenance database, or a skip outside CI."""
    try:
        import asyncpg
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("asyncpg is not installed (pip install -e '.[test]'); under CI=true this fails")

    try:
        return await asyncpg.connect(ADMIN_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if IN_CI:
            raise
        pytest.skip(
            f"PostgreSQL is not reachable at {ADMIN_DSN} ({type(exc).__name__}: {exc}); start it "
            "(`.ci/run` does) or set COGENCY_TEST_PG. Under CI=true this is a failure."
        )


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """Create a uniquely named database; yield its URL; drop it (and its sessions) after."""
    name = f"cogency_test_{uuid.uuid4().hex[:16]}"
    admin = await admin_connect()
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield dsn_for(name)
    finally:
        admin = await admin_connect()
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@asynccontextmanager
async def fresh_store(**options: Any) -> AsyncIterator[PostgresStore]:
    """A :class:`PostgresStore` on a fresh database, closed and dropped afterwards."""
    async with fresh_database() as dsn:
        store = PostgresStore(dsn, **options)
        try:
            yield store
        finally:
            await store.close()


_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\?")


def to_dollar(sql: str) -> str:
    """``?`` placeholders (outside string literals) as ``$1``, ``$2`` …"""
    counter = 0

    def number(match: re.Match[str]) -> str:
        nonlocal counter
        if match.group(0) != "?":
            return match.group(0)
        counter += 1
        return f"${counter}"

    return _PLACEHOLDER.sub(number, sql)


def _as_type(value: Any, kind: str) -> Any:
    # Tests written for both backends pass timestamps as ISO text, as SQLite stores them.
    if isinstance(value, str) and kind in ("timestamptz", "timestamp"):
        return _time.parse(value)
    return value


def raw_rows(store: PostgresStore) -> Callable[..., Awaitable[list[tuple]]]:
    """``await rows(sql, *params)``: rows straight from the store's database, as tuples."""

    async def rows(sql: str, *params: Any) -> list[tuple]:
        import asyncpg

        connection = await asyncpg.connect(store.dsn, timeout=5)
        try:
            statement = await connection.prepare(to_dollar(sql))
            wanted = [parameter.name for parameter in statement.get_parameters()]
            values = [_as_type(value, kind) for value, kind in zip(params, wanted)]
            return [tuple(record) for record in await statement.fetch(*values)]
        finally:
            await connection.close()

    return rows


async def connect(dsn: str) -> Any:
    """A plain asyncpg connection to ``dsn`` (to hold locks or kill sessions from outside)."""
    import asyncpg

    return await asyncpg.connect(dsn, timeout=5)


async def wait_for_blocked_backend(
    observer: Any, *, exclude: set[int] = frozenset(), timeout: float = 10.0
) -> int:
    """The pid of a session of the store waiting on a lock in ``observer``'s database.

    Polls ``pg_stat_activity`` (a condition, not a guess at timing) and fails after ``timeout``.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        pid = await observer.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'cogency' AND wait_event_type = 'Lock' "
            "AND NOT (pid = ANY($1::int[])) LIMIT 1",
            list(exclude),
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.01)
    raise AssertionError(f"no store session blocked on a lock within {timeout}s")
