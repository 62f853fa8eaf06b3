"""PostgreSQL test support: a uniquely named database per test, dropped afterwards, and
PgBouncer in front of the server.

The server is the local one on 127.0.0.1:5432 (trust auth), which ``.ci/run`` starts when it is
down; ``COGENCY_TEST_PG`` overrides the admin URL. Outside CI an unreachable server skips the test
(saying why); under ``CI=true`` it fails it.

Stores of the shared suites connect as :data:`APP_ROLE`, an ordinary role that owns its test
database (and so its tables), as a deployment would: row-level security holds it to each
user's rows. The admin role (a superuser, which row-level security does not restrict) reads
the rows behind the store's back.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ (its PgBouncer)

import pytest

from bench.pooler import Pooler
from cogency import _time
from cogency.storage.postgres import PostgresStore

ADMIN_DSN = os.environ.get("COGENCY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
APP_ROLE = "cogency_app"
"""An ordinary role (no superuser, no BYPASSRLS), made once per server."""


def dsn_for(database: str, *, user: str | None = None, port: int | None = None) -> str:
    """The admin URL pointed at ``database`` (as ``user``, on ``port``, when given)."""
    parts = urlsplit(ADMIN_DSN)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user or parts.username or 'postgres'}@{host}:{port or parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, "/" + database, parts.query, parts.fragment))


def admin_dsn(dsn: str) -> str:
    """The admin's direct URL to the database of ``dsn`` (which may go through PgBouncer)."""
    return dsn_for(urlsplit(dsn).path.lstrip("/"))


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


async def ensure_app_role(admin: Any) -> None:
    import asyncpg

    if not await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", APP_ROLE):
        try:
            await admin.execute(f"CREATE ROLE {APP_ROLE} LOGIN")
        except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            pass  # another test process made it meanwhile


@asynccontextmanager
async def fresh_database(*, as_app: bool = False, port: int | None = None
                         ) -> AsyncIterator[str]:
    """Create a uniquely named database; yield its URL; drop it (and its sessions) after.

    ``as_app``: the database belongs to :data:`APP_ROLE` and the URL connects as it;
    ``port``: the URL goes there (a PgBouncer in front of the server).
    """
    name = f"cogency_test_{uuid.uuid4().hex[:16]}"
    admin = await admin_connect()
    try:
        if as_app:
            await ensure_app_role(admin)
            await admin.execute(f'CREATE DATABASE "{name}" OWNER {APP_ROLE}')
        else:
            await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield dsn_for(name, user=APP_ROLE if as_app else None, port=port)
    finally:
        admin = await admin_connect()
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@asynccontextmanager
async def fresh_store(*, as_app: bool = False, port: int | None = None, **options: Any
                      ) -> AsyncIterator[PostgresStore]:
    """A :class:`PostgresStore` on a fresh database, closed and dropped afterwards."""
    async with fresh_database(as_app=as_app, port=port) as dsn:
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
    """``await rows(sql, *params)``: rows straight from the store's database, as tuples (read
    by the admin, directly: every user's rows)."""

    async def rows(sql: str, *params: Any) -> list[tuple]:
        import asyncpg

        connection = await asyncpg.connect(admin_dsn(store.dsn), timeout=5)
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


class PgBouncer(Pooler):
    """:class:`bench.pooler.Pooler` in front of the test server, for its admin and
    :data:`APP_ROLE`."""

    def __init__(self, mode: str, **options: Any) -> None:
        server = urlsplit(ADMIN_DSN)
        super().__init__(mode, host=server.hostname or "127.0.0.1", port=server.port or 5432,
                         users=(server.username or "postgres", APP_ROLE), **options)


def pgbouncer(mode: str) -> PgBouncer:
    """This test session's PgBouncer in ``mode``, started on first use (stopped at exit)."""
    if mode not in _BOUNCERS:
        try:
            _BOUNCERS[mode] = PgBouncer(mode)
        except RuntimeError as exc:
            if IN_CI:
                raise
            pytest.skip(f"{exc}; under CI=true this is a failure")
    return _BOUNCERS[mode]


_BOUNCERS: dict[str, PgBouncer] = {}


def stop_pgbouncers() -> None:
    for bouncer in _BOUNCERS.values():
        bouncer.stop()
    _BOUNCERS.clear()
