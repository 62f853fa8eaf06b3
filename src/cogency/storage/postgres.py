"""PostgreSQL storage: one database shared by many agent processes on many machines.

Same tables, columns and migration names as :mod:`cogency.storage.sqlite` (but for how a lease
is held); the JSON columns have PostgreSQL's ``json`` type, which rejects invalid JSON yet keeps
the text exactly as written (``jsonb`` would refuse a ``\\u0000`` that SQLite stores). Writers
serialize on row locks, not on the whole database. A running task's row names its store's
session advisory lock, which PostgreSQL drops by itself when that store's connection dies: the
task is then free, and every write of the old runner is fenced out by the lease epoch.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .. import _time
from .._history import History
from .._json import dumps
from ..errors import (
    CogencyError,
    ConfigurationError,
    ConflictError,
    ConversationBusyError,
    CorruptDataError,
    ForgottenError,
    NotFoundError,
    StorageError,
    StoreLockedError,
    StoreUnavailableError,
    UsageError,
)
from ..memory.entries import ProfileBook, ProfileEntry
from ..memory.profile import Profile
from ._window import Window, Windows
from .base import (
    ENTRY_COLUMNS,
    ENTRY_UPDATE,
    LEARN_BATCH,
    LEARNING_QUEUE_TABLE,
    LEARN_LEASE,
    MIGRATION_NAMES,
    PROFILE_ENTRIES_TABLE,
    ApiKeyRecord,
    ConversationData,
    ConversationRecord,
    ForgetReceipt,
    LearningClaim,
    LearningStatus,
    SaveBatch,
    TaskData,
    TaskRecord,
    UserData,
    book_of,
    claim_lost,
    claimable,
    entry_changes,
    entry_record,
    entry_row,
    import_conflict,
    learning_status_of,
    pending_count,
    queue_task,
    queued_tasks,
    take_claim,
    approval_data,
    approval_record,
    check_decisions,
    api_key_record,
    busy_conversation,
    conflict,
    conversation_record,
    decode,
    decode_profile,
    generation_key,
    lease_lost,
    legacy_messages,
    no_conversation,
    no_workspace,
    abandon_runner,
    runner_alive,
    schema_problem,
    task_record,
    task_running,
    too_new,
)

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")

_MIGRATION_LOCK = 0x636F67656E6379  # "cogency": one key for every process migrating this database
_RETRIES = 3
"""Attempts of one transaction: deadlock victims and connections lost before COMMIT."""
_LOST_CONNECTION_RETRIES = 1
_MESSAGE_BATCH = 256
"""Rows fetched per round trip while windowing history (newest first, stops at the budget)."""
_TASK_KEY = "task_id = $1 AND user_id IS NOT DISTINCT FROM $2"
"""A task of its user: found by its key, the owner checked on that one row. ``IS NOT DISTINCT
FROM`` is never an index condition, so no plan walks the user's index instead (one row per
task the user has open, read by every save)."""


# -- migrations: the same names, in the same order, as SQLite ------------------------------


async def _m001_initial(db: asyncpg.Connection) -> None:
    # The seeds' schema (v3.0) with PostgreSQL types.
    await db.execute(
        """
        CREATE TABLE IF NOT EXISTS user_profiles (
            user_id TEXT PRIMARY KEY,
            profile_data JSON NOT NULL,          -- Profile as one flat JSON object
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE TABLE IF NOT EXISTS conversations (
            conversation_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES user_profiles(user_id),
            conversation_data JSON NOT NULL,     -- the conversation's own fields, no messages
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE TABLE IF NOT EXISTS task_workspaces (
            task_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES user_profiles(user_id),
            workspace_data JSON NOT NULL,        -- the 4 workspace fields as JSON
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        """
    )


async def _m002_conversation_messages(db: asyncpg.Connection) -> None:
    # Messages as appended rows: one write per message whatever the history length.
    await db.execute(
        """
        ALTER TABLE conversations ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE conversation_messages (
            conversation_id TEXT NOT NULL
                REFERENCES conversations(conversation_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,                -- 1, 2, 3 ... per conversation, no gaps
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            task_id TEXT,                        -- the task that wrote it (resume skips done calls)
            tokens INTEGER NOT NULL DEFAULT 0,   -- counted once, so windowing reads no text twice
            created_at TEXT NOT NULL,            -- as the writer stamped it (ISO 8601)
            PRIMARY KEY (conversation_id, seq)
        );
        CREATE INDEX conversations_by_user ON conversations(user_id, updated_at);
        """
    )
    # Tables made before migrations existed may keep timestamps without a zone (or as text):
    # make them UTC instants like the rest.
    for table in ("user_profiles", "conversations", "task_workspaces"):
        kind = await db.fetchval(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = $1 AND column_name = 'updated_at'",
            table,
        )
        if kind == "timestamp without time zone":
            await db.execute(
                f"ALTER TABLE {table} ALTER COLUMN updated_at TYPE TIMESTAMPTZ "
                "USING updated_at AT TIME ZONE 'UTC'"
            )
        elif kind in ("text", "character varying"):
            await db.execute(
                f"ALTER TABLE {table} ALTER COLUMN updated_at TYPE TIMESTAMPTZ "
                "USING updated_at::timestamptz"
            )
    # Seed-era tables may name users with no profile row (their keys were not declared);
    # give those a default profile so the keys hold from here on.
    stamp = _time.now()
    for (user_id,) in await db.fetch(
        "SELECT user_id FROM conversations UNION SELECT user_id FROM task_workspaces "
        "EXCEPT SELECT user_id FROM user_profiles"
    ):
        await db.execute(
            "INSERT INTO user_profiles (user_id, profile_data, updated_at) VALUES ($1, $2, $3)",
            user_id, dumps(Profile(user_id).to_dict()), stamp,
        )
    # Databases of the seeds kept messages as a JSON list inside conversation_data.
    rows = await db.fetch("SELECT conversation_id, conversation_data::text FROM conversations")
    for conversation_id, text in rows:
        data = decode(text, "conversations", conversation_id, "conversation_data")
        messages = legacy_messages(conversation_id, data, stamp.isoformat())
        if messages is None:
            continue
        await db.executemany(
            "INSERT INTO conversation_messages VALUES ($1, $2, $3, $4, NULL, $5, $6)",
            [(conversation_id, *message) for message in messages],
        )
        await db.execute(
            "UPDATE conversations SET conversation_data = $1, message_count = $2 "
            "WHERE conversation_id = $3",
            dumps(data), len(messages), conversation_id,
        )


async def _m003_task_workspace_columns(db: asyncpg.Connection) -> None:
    # A workspace knows its conversation (continue_task restores both), its version
    # (stale saves conflict) and who runs it (shown to people; the advisory lock decides).
    await db.execute(
        """
        ALTER TABLE task_workspaces ADD COLUMN conversation_id TEXT
            REFERENCES conversations(conversation_id) ON DELETE CASCADE;
        ALTER TABLE task_workspaces ADD COLUMN query TEXT NOT NULL DEFAULT '';
        ALTER TABLE task_workspaces ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE task_workspaces ADD COLUMN runner TEXT;
        CREATE INDEX task_workspaces_by_user ON task_workspaces(user_id);
        CREATE INDEX task_workspaces_by_conversation ON task_workspaces(conversation_id);
        """
    )
    # Seed-era workspaces had no conversation: give each an empty one.
    stamp = _time.now()
    orphans = await db.fetch(
        "SELECT task_id, user_id FROM task_workspaces WHERE conversation_id IS NULL"
    )
    for task_id, user_id in orphans:
        conversation_id = f"migrated-{task_id}"
        await db.execute(
            "INSERT INTO conversations (conversation_id, user_id, conversation_data, updated_at) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (conversation_id) DO NOTHING",
            conversation_id, user_id,
            dumps({"conversation_id": conversation_id, "user_id": user_id,
                   "created_at": stamp.isoformat()}),
            stamp,
        )
        await db.execute(
            "UPDATE task_workspaces SET conversation_id = $1 WHERE task_id = $2",
            conversation_id, task_id,
        )


async def _m004_run_leases(db: asyncpg.Connection) -> None:
    # Runs hold tasks by fenced leases; messages carry their writer's id.
    await db.execute(
        """
        ALTER TABLE task_workspaces ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
            -- bumped by each claim and force-release; a run's writes must carry the current one
        ALTER TABLE task_workspaces ADD COLUMN lease_holder BIGINT;
            -- the key of the session advisory lock its store holds while it lives: a row whose
            -- key nobody holds (that session died) is free
        ALTER TABLE task_workspaces ADD COLUMN lease_until TIMESTAMPTZ;
            -- SQLite's lease expiry; unused here (the columns are the same on both)
        ALTER TABLE task_workspaces ADD COLUMN last_save TEXT;
            -- the save that wrote this version: a retry of it finds that it landed
        ALTER TABLE conversation_messages ADD COLUMN message_id TEXT;
            -- the writer's id: a save retried after an unknown outcome stores it once
        CREATE UNIQUE INDEX conversation_messages_by_id
            ON conversation_messages(conversation_id, message_id);
        CREATE INDEX conversation_messages_by_task ON conversation_messages(task_id);
            -- resume finds a task's recorded results however long its conversation is
        """
    )


async def _m005_forget_generation(db: asyncpg.Connection) -> None:
    # Outlives the user's other rows on purpose: learning that began before a forget
    # compares its generation inside its write, so a forgotten user can never be re-learned
    # from erased data, whichever process or Memory learns. Keyed by a hash of the user id:
    # nothing readable of a forgotten user stays behind.
    await db.execute(
        "CREATE TABLE user_generations (user_key TEXT PRIMARY KEY, "
        "generation INTEGER NOT NULL)"
    )


async def _m006_approvals(db: asyncpg.Connection) -> None:
    # Tool calls that wait for a person, one row each, so another process (or the HTTP
    # service) can list and decide them, and an approved call is never started twice.
    await db.execute(
        """
        CREATE TABLE task_approvals (
            task_id TEXT NOT NULL REFERENCES task_workspaces(task_id) ON DELETE CASCADE,
            call_id TEXT NOT NULL,
            user_id TEXT NOT NULL,               -- the task's user: every read is scoped by it
            position INTEGER NOT NULL,           -- the order the model asked for the calls
            call_data JSON NOT NULL,             -- {"name", "args"}
            status TEXT NOT NULL,                -- pending, approved, denied, running, done
            created_at TEXT NOT NULL,
            decided_at TEXT,
            PRIMARY KEY (task_id, call_id)
        );
        CREATE INDEX task_approvals_by_user ON task_approvals(user_id, status);
        """
    )


async def _m007_service(db: asyncpg.Connection) -> None:
    # The HTTP service (`cogency serve`): its API keys. Which conversation has a run is a
    # session advisory lock here (SQLite keeps a conversation_runs table instead): it dies
    # with the replica that held it.
    await db.execute(
        """
        CREATE TABLE api_keys (
            key_id TEXT PRIMARY KEY,             -- the key's public part, shown by `keys list`
            user_id TEXT NOT NULL,               -- every request with the key acts as this user
            key_hash TEXT NOT NULL,              -- SHA-256 of the secret part; never the key
            name TEXT NOT NULL DEFAULT '',
            created_at TIMESTAMPTZ NOT NULL,
            revoked_at TIMESTAMPTZ               -- set by `keys revoke`: the key stops working
        );
        CREATE INDEX api_keys_by_user ON api_keys(user_id);
        """
    )


async def _m008_task_settings(db: asyncpg.Connection) -> None:
    # What the task's starter needs to run it again as it was started (the CLI keeps its
    # tools, root and model here), so a resume does not silently run with other tools.
    await db.execute("ALTER TABLE task_workspaces ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'")


async def _m009_profile_entries(db: asyncpg.Connection) -> None:
    await db.execute(PROFILE_ENTRIES_TABLE)  # (its columns, and why: storage/base.py)
    # Profiles learned before entries existed: their values become entries without sources.
    for user_id, text in await db.fetch("SELECT user_id, profile_data::text FROM user_profiles"):
        try:
            book = ProfileBook.adopt(decode_profile(text, user_id))
        except CorruptDataError:
            continue  # reported when it is read; a change then adopts what it holds
        await db.executemany(_INSERT_ENTRY, [_entry_row(e) for e in book.added])


async def _m010_learning_queue(db: asyncpg.Connection) -> None:
    await db.execute(LEARNING_QUEUE_TABLE)  # (its columns, and why: storage/base.py)


MIGRATIONS: tuple[tuple[str, Callable[[Any], Awaitable[None]]], ...] = (
    ("m001_initial", _m001_initial),
    ("m002_conversation_messages", _m002_conversation_messages),
    ("m003_task_workspace_columns", _m003_task_workspace_columns),
    ("m004_run_leases", _m004_run_leases),
    ("m005_forget_generation", _m005_forget_generation),
    ("m006_approvals", _m006_approvals),
    ("m007_service", _m007_service),
    ("m008_task_settings", _m008_task_settings),
    ("m009_profile_entries", _m009_profile_entries),
    ("m010_learning_queue", _m010_learning_queue),
)
assert tuple(name for name, _ in MIGRATIONS) == MIGRATION_NAMES


async def migrate(db: asyncpg.Connection, upto: str | None = None) -> list[str]:
    """Apply the missing migrations in order (through ``upto``); returns the names applied.

    Runs in one transaction under an advisory lock, so processes opening a new database at the
    same moment take turns: the first migrates, the others find it done.
    """
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        done = {row[0] for row in await db.fetch("SELECT name FROM schema_migrations")}
        newer = too_new(done)
        if newer is not None:
            raise newer
        if not done and await db.fetchval("SELECT to_regclass('user_profiles') IS NOT NULL"):
            done.add("m001_initial")  # a seed-era database made without migrations
            await db.execute(
                "INSERT INTO schema_migrations VALUES ('m001_initial', $1)",
                _time.now().isoformat(),
            )
        applied = []
        for name, step in MIGRATIONS:
            if name not in done:
                await step(db)
                await db.execute(
                    "INSERT INTO schema_migrations VALUES ($1, $2)", name, _time.now().isoformat()
                )
                applied.append(name)
            if name == upto:
                break
        return applied


async def _check_schema(db: asyncpg.Connection, where: str) -> None:
    """Raise unless the schema is current; never changes it (for read-only stores)."""
    if await db.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        done = {row[0] for row in await db.fetch("SELECT name FROM schema_migrations")}
    elif await db.fetchval("SELECT to_regclass('user_profiles') IS NOT NULL"):
        done = {"m001_initial"}
    else:
        done = set()
    problem = schema_problem(done, repr(where))
    if problem is not None:
        raise problem


# -- the store ------------------------------------------------------------------------------


class PostgresStore:
    """A :class:`~cogency.storage.Store` on a PostgreSQL database (``asyncpg`` pool).

    Nothing connects until the first call; then a pool of at most ``max_size`` connections
    opens and the schema is migrated. Waiting longer than ``acquire_timeout`` seconds for a free
    connection, or ``lock_timeout`` for a row lock, raises
    :class:`~cogency.errors.StoreUnavailableError`. Tasks being run are held through one session
    advisory lock on one extra connection per store (taken once, named in the task rows), so a
    process that dies frees its tasks at once, and holding a task costs no round trip.

    ``read_only=True`` never migrates or writes (every session is read-only): a database with
    an older schema is a :class:`~cogency.errors.StorageError` saying to open it once for
    writing.

    ``synchronous_commit=None`` keeps the server's setting (by default every commit waits for
    its disk flush, a few ms on ordinary disks). ``False`` answers before the flush: a crash of
    any process loses nothing and the database stays consistent, but an OS crash or power cut
    may lose the last fraction of a second of commits, as SQLite's WAL mode with
    ``synchronous=NORMAL`` (the SQLite store's setting) may.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        acquire_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        lock_timeout: float = 10.0,
        command_timeout: float | None = 60.0,
        synchronous_commit: bool | None = None,
        read_only: bool = False,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise UsageError(
                f"PostgresStore needs a postgresql:// URL, not {redact(str(dsn))!r}"
            )
        if max_size < 1 or min_size < 0 or min_size > max_size:
            raise UsageError("the pool needs 0 <= min_size <= max_size and max_size >= 1")
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.acquire_timeout = acquire_timeout
        self.connect_timeout = connect_timeout
        self.lock_timeout = lock_timeout
        self.command_timeout = command_timeout
        self.synchronous_commit = synchronous_commit
        self.read_only = read_only
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._lease_db: asyncpg.Connection | None = None
        self._lease_lock: asyncio.Lock | None = None
        self._key: int | None = None
        """This store's lease key: the session advisory lock its lease connection holds."""
        self._leases: dict[str, tuple[str, int]] = {}
        """task_id -> (runner, epoch) of the tasks this store's runs hold."""
        self._windows = _Windows()
        self._holds: dict[str, str] = {}
        """conversation_id -> runner of the conversations held (``hold_conversation``): session
        advisory locks on the lease connection, gone with it."""
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.dsn)!r})"

    # -- plumbing -------------------------------------------------------------------------

    def _where(self) -> str:
        parts = urlsplit(self.dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
        return f"{host}:{port}{parts.path or '/'}"

    async def _ready(self) -> asyncpg.Pool:
        """The pool, opened (and the schema migrated) on first use in this event loop."""
        if self._closed:
            raise UsageError("this store is closed; open a new one")
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._loop is loop:
            return self._pool
        if self._loop is not loop:
            # A new event loop (e.g. one run_sync after another): the old loop's connections
            # cannot be used from here.
            self._forget_loop()
            self._loop = loop
            self._opening = asyncio.Lock()
            self._lease_lock = asyncio.Lock()
        assert self._opening is not None
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open_pool()
        return self._pool

    async def _open_pool(self) -> asyncpg.Pool:
        asyncpg = _driver()
        try:
            pool = await asyncpg.create_pool(
                self.dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                timeout=self.connect_timeout,
                command_timeout=self.command_timeout,
                server_settings=self._settings("cogency"),
                reset=_keep_session,
            )
        except Exception as exc:
            raise self._connect_error(exc) from exc
        try:
            async with pool.acquire(timeout=self.acquire_timeout) as db:
                if self.read_only:
                    await _check_schema(db, redact(self.dsn))
                else:
                    await migrate(db)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, CogencyError) or not isinstance(exc, Exception):
                raise
            raise self._error(exc, "migrating the schema") from exc
        return pool

    def _settings(self, name: str) -> dict[str, str]:
        settings = {
            "application_name": name,
            "lock_timeout": str(int(self.lock_timeout * 1000)),
            "timezone": "UTC",
            "plan_cache_mode": "force_generic_plan",
        }
        if name == "cogency-leases":
            # The lease session writes only the runner column, shown to people; the lock
            # itself is never on disk. Not waiting for the WAL flush saves a disk sync per
            # claim and per release.
            settings["synchronous_commit"] = "off"
        elif self.synchronous_commit is not None:
            settings["synchronous_commit"] = "on" if self.synchronous_commit else "off"
        if self.read_only:
            settings["default_transaction_read_only"] = "on"
        return settings

    def _forget_loop(self) -> None:
        for resource in (self._pool, self._lease_db):
            if resource is not None:
                try:
                    resource.terminate()
                except RuntimeError:  # its loop is closed; the socket closes with it
                    pass
        self._pool = None
        self._lease_db = None
        self._key = None
        self._leases.clear()
        self._holds.clear()

    async def _use(
        self,
        operation: str,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        write: bool = True,
        transaction: bool = True,
        idempotent: bool = False,
    ) -> T:
        """Run ``work`` on a pooled connection, in one transaction unless told otherwise.

        Run again from the start: a deadlock victim; a transaction whose connection died before
        its COMMIT was sent (the server rolled it back, nothing of it is stored); a read, or a
        ``write=False`` statement that may safely repeat; an ``idempotent`` write (one that
        finds its own earlier landing). Another write whose connection was lost during its
        COMMIT (or its single statement) is reported, never retried: that change may have
        landed.
        """
        asyncpg = _driver()
        pool = await self._ready()
        lost_connections = 0
        for attempt in range(_RETRIES):
            try:
                db = await pool.acquire(timeout=self.acquire_timeout)
            except asyncio.TimeoutError as exc:
                raise StoreUnavailableError(
                    f"no PostgreSQL connection to {self._where()} became free within "
                    f"{self.acquire_timeout:g}s while {operation}: all {self.max_size} "
                    "connections of the pool are in use. Run fewer tasks at once, or raise "
                    "max_size or acquire_timeout. Nothing was written."
                ) from exc
            except Exception as exc:
                raise self._connect_error(exc) from exc
            committing = False
            try:
                if not transaction:
                    committing = write  # a lone statement commits as it runs
                    return await work(db)
                async with db.transaction():
                    result = await work(db)
                    committing = write
                return result
            except asyncpg.exceptions.TransactionRollbackError as exc:
                if attempt + 1 < _RETRIES:
                    continue
                raise ConflictError(
                    f"PostgreSQL kept rolling back {operation} for concurrent writers ({exc}); "
                    "nothing was written: retry"
                ) from exc
            except CogencyError:
                raise
            except Exception as exc:
                if _lost(exc):
                    _drop(db)
                if _lost(exc) and (idempotent or not committing and (transaction or not write)):
                    lost_connections += 1
                    if lost_connections <= _LOST_CONNECTION_RETRIES and attempt + 1 < _RETRIES:
                        continue  # nothing of it is stored: run it again on a new connection
                raise self._error(exc, operation, committing=committing) from exc
            finally:
                await pool.release(db)
        raise AssertionError("unreachable")

    async def _read(self, operation: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """One read statement (atomic by itself: no BEGIN/COMMIT round trips)."""
        return await self._use(operation, work, write=False, transaction=False)

    def _error(
        self, exc: BaseException, operation: str, *, committing: bool = False
    ) -> StorageError:
        """A driver error as the package's own, saying what happened to the data."""
        asyncpg = _driver()
        if isinstance(exc, asyncpg.exceptions.LockNotAvailableError):
            return StoreLockedError(
                f"a row stayed locked past lock_timeout={self.lock_timeout:g}s while {operation} "
                f"on {self._where()} ({exc}); another process holds it too long: retry. "
                "Nothing was written."
            )
        if isinstance(exc, (asyncio.TimeoutError, asyncpg.exceptions.QueryCanceledError)):
            return StoreUnavailableError(
                f"PostgreSQL at {self._where()} did not answer in time while {operation} ({exc}); "
                "the transaction was rolled back: retry, or raise command_timeout"
            )
        if _lost(exc) and committing:
            return StoreUnavailableError(
                f"the connection to PostgreSQL at {self._where()} was lost before the outcome "
                f"of {operation} was known ({type(exc).__name__}: {exc}); the change may or may "
                "not have been stored: reload before retrying"
            )
        if _lost(exc):
            return StoreUnavailableError(
                f"the connection to PostgreSQL at {self._where()} was lost while {operation} "
                f"({type(exc).__name__}: {exc}), again after a retry on a new connection; the "
                "transaction was rolled back, so nothing of it was stored: check the server, "
                "then retry"
            )
        if isinstance(exc, (asyncpg.exceptions.CharacterNotInRepertoireError,
                            asyncpg.exceptions.UntranslatableCharacterError)):
            return StorageError(
                f"PostgreSQL cannot store this text while {operation} ({exc}). Nothing was "
                "written."
            )
        return StorageError(
            f"PostgreSQL error on {self._where()} while {operation}: "
            f"{type(exc).__name__}: {exc}"
        )

    def _connect_error(self, exc: BaseException) -> StorageError:
        asyncpg = _driver()
        where = redact(self.dsn)
        if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
            return StoreUnavailableError(
                f"the database in {where} does not exist ({exc}); create it "
                f"(createdb {urlsplit(self.dsn).path.lstrip('/')!r}) or fix the URL"
            )
        if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
            return StoreUnavailableError(
                f"PostgreSQL refused the login for {where} ({exc}); check the user and password "
                "in the URL and pg_hba.conf"
            )
        if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
            return StoreUnavailableError(
                f"PostgreSQL at {where} has no connection slots left ({exc}); lower max_size in "
                "your processes or raise max_connections on the server"
            )
        if isinstance(exc, (OSError, asyncio.TimeoutError,
                            asyncpg.exceptions.PostgresConnectionError,
                            asyncpg.exceptions.CannotConnectNowError,
                            asyncpg.exceptions.InterfaceError)):
            return StoreUnavailableError(
                f"cannot reach PostgreSQL at {where} ({type(exc).__name__}: {exc}); check that "
                "the server is running and accepts TCP connections on that host and port, and "
                "that the URL is right"
            )
        return StorageError(f"cannot open PostgreSQL at {where}: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        """Close the pool and give up every task this store holds. Safe to call twice."""
        self._closed = True
        pool, lease_db = self._pool, self._lease_db
        self._pool, self._lease_db, self._key = None, None, None
        self._leases.clear()
        self._holds.clear()
        try:
            if lease_db is not None and not lease_db.is_closed():
                await lease_db.close(timeout=5)  # closing the session frees its advisory locks
        finally:
            if pool is not None:
                await pool.close()

    # -- task leases: one session advisory lock per store, named in the rows it holds -----

    async def _holder(self) -> int:
        """This store's lease key, taken once on its own connection (which then idles)."""
        await self._ready()
        assert self._lease_lock is not None
        async with self._lease_lock:
            if self._key is not None and self._lease_db is not None \
                    and not self._lease_db.is_closed():
                return self._key
            asyncpg = _driver()
            try:
                db = await asyncpg.connect(
                    self.dsn, timeout=self.connect_timeout,
                    server_settings=self._settings("cogency-leases"),
                )
            except Exception as exc:
                raise self._connect_error(exc) from exc
            try:
                while not await db.fetchval(
                    "SELECT pg_try_advisory_lock($1)",
                    key := int.from_bytes(os.urandom(8), "big", signed=True),
                ):
                    pass  # another store drew the same 64 bits: draw again
            except Exception as exc:
                db.terminate()
                raise self._error(exc, "taking this store's lease") from exc
            db.add_termination_listener(self._lease_connection_lost)
            self._lease_db, self._key = db, key
            return key

    def _lease_connection_lost(self, db: asyncpg.Connection) -> None:
        if db is self._lease_db:
            # The lock went with the session: other stores may claim this store's tasks now,
            # and the runs still going here are fenced out when they do.
            self._lease_db, self._key = None, None
            self._holds.clear()

    async def claim_task(self, task_id: str, user_id: str, runner: str) -> int:
        holder = self._leases.get(task_id)
        if holder is not None and holder[0] == runner:
            return holder[1]
        if holder is not None and runner_alive(holder[0]):
            raise task_running(task_id)  # another run of this store holds (or claims) it
        key = await self._holder()

        async def work(db: asyncpg.Connection) -> int:
            # One statement: take the task if nobody holds it, or its holder's lock is gone
            # (or it was this store's, from a run that ended without letting go).
            epoch = await db.fetchval(
                "UPDATE task_workspaces t SET runner = $3, lease_holder = $4, epoch = t.epoch + 1 "
                "WHERE t." + _TASK_KEY + " AND (t.lease_holder IS NULL "
                "OR t.lease_holder = $4 OR NOT " + _HELD + ") RETURNING t.epoch",
                task_id, user_id, runner, key,
            )
            if epoch is None:
                if await db.fetchval(
                    "SELECT 1 FROM task_workspaces WHERE " + _TASK_KEY,
                    task_id, user_id,
                ) is None:
                    raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
                raise task_running(task_id)
            return int(epoch)

        self._leases[task_id] = (runner, 0)  # a second claim from this store meanwhile waits
        try:
            epoch = await self._use("claiming a task", work, transaction=False)
        except BaseException:
            del self._leases[task_id]
            raise
        self._leases[task_id] = (runner, epoch)
        return epoch

    async def release_task(self, task_id: str, runner: str) -> None:
        if self._leases.get(task_id, (None,))[0] == runner:
            del self._leases[task_id]
        try:
            await self._use(
                "releasing a task",
                lambda db: db.execute(
                    "UPDATE task_workspaces SET runner = NULL, lease_holder = NULL "
                    "WHERE task_id = (SELECT task_id FROM task_workspaces WHERE task_id = $1 "
                    "AND runner = $2 FOR UPDATE SKIP LOCKED)",  # never waits to let go
                    task_id, runner,
                ),
                write=False, transaction=False,
            )
        except BaseException:
            abandon_runner(runner)  # the run is over even if its row still names it
            raise

    async def force_release(self, task_id: str, user_id: str) -> str | None:
        async def work(db: asyncpg.Connection) -> Any:
            return await db.fetchrow(
                "UPDATE task_workspaces t SET runner = NULL, lease_holder = NULL, "
                "epoch = t.epoch + 1 FROM (SELECT task_id, runner FROM task_workspaces "
                "WHERE " + _TASK_KEY + " FOR UPDATE) old "
                "WHERE t.task_id = old.task_id RETURNING old.runner",
                task_id, user_id,
            )

        row = await self._use("releasing a task by force", work, transaction=False)
        if row is None:
            raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
        self._leases.pop(task_id, None)
        return cast("str | None", row["runner"])

    async def hold_conversation(self, conversation_id: str, user_id: str, runner: str) -> None:
        await self._holder()  # the lease connection: holds live (and die) with its session
        assert self._lease_lock is not None
        async with self._lease_lock:
            holder = self._holds.get(conversation_id)
            if holder == runner:
                return
            db = self._lease_db
            if db is None or db.is_closed():
                raise StoreUnavailableError(
                    f"the lease connection to PostgreSQL at {self._where()} was just lost; "
                    "nothing is held: retry"
                )
            try:
                # NULL: another user's conversation (it must look "not found", not "busy").
                # Advisory locks nest within a session, so one this store holds is busy here.
                got = await db.fetchval(
                    "SELECT CASE WHEN EXISTS (SELECT 1 FROM conversations WHERE "
                    "conversation_id = $2 AND user_id <> $3) THEN NULL "
                    "WHEN $4 THEN false ELSE pg_try_advisory_lock($1) END",
                    _hold_key(conversation_id), conversation_id, user_id,
                    holder is not None,
                )
            except Exception as exc:
                raise self._error(exc, "holding a conversation") from exc
            if got is None:
                raise NotFoundError(no_conversation(conversation_id, user_id))
            if not got:
                raise ConversationBusyError(busy_conversation(conversation_id))
            self._holds[conversation_id] = runner

    async def release_conversation(self, conversation_id: str, runner: str) -> None:
        await self._ready()
        assert self._lease_lock is not None
        async with self._lease_lock:
            if self._holds.get(conversation_id) != runner:
                return
            del self._holds[conversation_id]
            if self._lease_db is None or self._lease_db.is_closed():
                return  # the session is gone, and its locks with it
            try:
                await self._lease_db.fetchval(
                    "SELECT pg_advisory_unlock($1)", _hold_key(conversation_id)
                )
            except Exception as exc:
                raise self._error(exc, "releasing a conversation") from exc

    # -- API keys -------------------------------------------------------------------------

    async def create_api_key(self, key: ApiKeyRecord) -> None:
        driver = _driver()

        async def work(db: asyncpg.Connection) -> None:
            try:
                await db.execute(
                    "INSERT INTO api_keys (key_id, user_id, key_hash, name, created_at) "
                    "VALUES ($1, $2, $3, $4, $5)",
                    key.key_id, key.user_id, key.key_hash, key.name,
                    key.created_at or _time.now(),
                )
            except driver.exceptions.UniqueViolationError as exc:
                raise ConflictError(f"an API key {key.key_id!r} exists already") from exc

        await self._use("creating an API key", work)

    async def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        async def work(db: asyncpg.Connection) -> ApiKeyRecord | None:
            row = await db.fetchrow(_SELECT_KEYS + " WHERE key_id = $1", key_id)
            return None if row is None else api_key_record(row)

        return await self._read("checking an API key", work)

    async def list_api_keys(self, user_id: str | None = None) -> list[ApiKeyRecord]:
        async def work(db: asyncpg.Connection) -> list[ApiKeyRecord]:
            if user_id is None:
                rows = await db.fetch(_SELECT_KEYS + " ORDER BY created_at, key_id")
            else:
                rows = await db.fetch(
                    _SELECT_KEYS + " WHERE user_id = $1 ORDER BY created_at, key_id", user_id
                )
            return [api_key_record(row) for row in rows]

        return await self._read("listing API keys", work)

    async def revoke_api_key(self, key_id: str) -> ApiKeyRecord:
        async def work(db: asyncpg.Connection) -> ApiKeyRecord:
            await db.execute(
                "UPDATE api_keys SET revoked_at = $2 WHERE key_id = $1 AND revoked_at IS NULL",
                key_id, _time.now(),
            )
            row = await db.fetchrow(_SELECT_KEYS + " WHERE key_id = $1", key_id)
            if row is None:
                raise NotFoundError(f"no API key {key_id!r} (`cogency keys list` lists them)")
            return api_key_record(row)

        return await self._use("revoking an API key", work)

    # -- tasks ----------------------------------------------------------------------------

    async def begin_task(
        self,
        task: TaskRecord,
        conversation_data: dict[str, Any],
        messages: Sequence[dict[str, Any]] = (),
        history_tokens: int | None = None,
    ) -> ConversationRecord:
        driver = _driver()
        key = await self._holder() if task.runner else None
        cached = self._windows.get(task.conversation_id, history_tokens)
        known = cached.last_seq if cached else 0

        async def work(db: asyncpg.Connection) -> list[Any]:
            stamp = _time.now()
            for _ in range(2):
                try:
                    rows = await db.fetch(
                        _BEGIN, task.user_id, dumps(Profile(task.user_id).to_dict()), stamp,
                        task.conversation_id, dumps(conversation_data), task.task_id,
                        _put_text(task.query), dumps(task.workspace), task.version,
                        task.runner, 1 if task.runner else 0, key,
                        [m["role"] for m in messages],
                        [_put_text(m["content"]) for m in messages],
                        [m.get("task_id") for m in messages],
                        [m.get("tokens", 0) for m in messages],
                        [m.get("created_at") or stamp.isoformat() for m in messages],
                        [m.get("id") for m in messages],
                        known, 0 if history_tokens is None else _MESSAGE_BATCH,
                        dumps(task.settings),
                    )
                except driver.exceptions.UniqueViolationError as exc:
                    raise ConflictError(
                        f"task {task.task_id!r} already exists; start tasks with a new id"
                    ) from exc
                if any(row["kind"] == 3 for row in rows):
                    raise NotFoundError(no_conversation(task.conversation_id, task.user_id))
                if any(row["kind"] == 0 for row in rows):
                    return rows
                # Another process created this new conversation meanwhile: it exists now.
            raise ConflictError(
                f"conversation {task.conversation_id!r} kept changing while starting a task; "
                "nothing was written: retry"
            )

        rows = await self._use("starting a task", work, transaction=False)
        head = next(row for row in rows if row["kind"] == 0)
        for offset, message in enumerate(messages, start=1):
            message["seq"] = head["seq"] + offset
        conversation = ConversationRecord(
            task.conversation_id, task.user_id,
            decode(head["data"], "conversations", task.conversation_id, "conversation_data"),
            head["seq"] + len(messages), head["updated"],
        )
        if task.runner is not None:
            self._leases[task.task_id] = (task.runner, 1)
        if history_tokens is not None:
            recent = self._windows.update(
                task.conversation_id, history_tokens, cached, rows, messages
            )
            if recent is None:
                recent = self._windows.loaded(
                    task.conversation_id, history_tokens,
                    await self.load_messages(task.conversation_id, task.user_id,
                                             token_budget=history_tokens),
                )
            conversation.recent = recent
        return conversation

    async def load_task_messages(self, task_id: str, user_id: str) -> list[dict[str, Any]]:
        async def work(db: asyncpg.Connection) -> list[dict[str, Any]]:
            rows = await db.fetch(
                "SELECT m.seq, m.role, m.content, m.task_id, m.tokens, m.created_at, m.message_id "
                "FROM conversation_messages m JOIN conversations c USING (conversation_id) "
                "WHERE m.task_id = $1 AND c.user_id = $2 ORDER BY m.seq",
                task_id, user_id,
            )
            return [_message(row) for row in rows]

        return await self._read("loading a task's messages", work)

    async def load_task(self, task_id: str, user_id: str) -> TaskRecord:
        async def work(db: asyncpg.Connection) -> TaskRecord:
            row = await db.fetchrow(_TASK_COLUMNS + " WHERE " + _TASK_KEY, task_id, user_id)
            if row is None:
                raise NotFoundError(_no_task(task_id, user_id))
            task = task_record(row, _get_text)
            task.pending_approvals = (await _approvals(db, [task_id], "pending")).get(task_id, [])
            return task

        return await self._use("loading a task", work, write=False)

    async def list_tasks(self, user_id: str | None = None) -> list[TaskRecord]:
        async def work(db: asyncpg.Connection) -> list[TaskRecord]:
            if user_id is None:
                rows = await db.fetch(_TASK_COLUMNS + " ORDER BY updated_at, task_id")
            else:
                rows = await db.fetch(
                    _TASK_COLUMNS + " WHERE user_id = $1 ORDER BY updated_at, task_id", user_id
                )
            tasks = [task_record(row, _get_text) for row in rows]
            waiting = await _approvals(db, [task.task_id for task in tasks], "pending")
            for task in tasks:
                task.pending_approvals = waiting.get(task.task_id, [])
            return tasks

        return await self._use("listing tasks", work, write=False)

    async def load_approvals(
        self, task_id: str, user_id: str, status: str | None = None
    ) -> list[dict[str, Any]]:
        async def work(db: asyncpg.Connection) -> list[dict[str, Any]]:
            await _owned_task(db, task_id, user_id)
            return (await _approvals(db, [task_id], status)).get(task_id, [])

        return await self._use("loading approvals", work, write=False)

    async def decide_approvals(
        self, task_id: str, user_id: str, decisions: Mapping[str, bool]
    ) -> list[dict[str, Any]]:
        async def work(db: asyncpg.Connection) -> list[dict[str, Any]]:
            await _owned_task(db, task_id, user_id)
            # Locks the task's calls: a second decider waits, then sees them decided.
            rows = await db.fetch(
                "SELECT call_id, status FROM task_approvals WHERE " + _TASK_KEY + " FOR UPDATE",
                task_id, user_id,
            )
            check_decisions(task_id, {row[0]: row[1] for row in rows}, decisions)
            await db.executemany(
                "UPDATE task_approvals SET status = $1, decided_at = $2 "
                "WHERE task_id = $3 AND call_id = $4 AND status = 'pending'",
                [("approved" if verdict else "denied", _time.now().isoformat(), task_id, call_id)
                 for call_id, verdict in decisions.items()],
            )
            decided = (await _approvals(db, [task_id])).get(task_id, [])
            return [call for call in decided if call["id"] in decisions]

        return await self._use("deciding approvals", work)

    async def start_approvals(self, task_id: str, user_id: str, call_ids: Sequence[str]) -> None:
        async def work(db: asyncpg.Connection) -> None:
            started = await db.fetchval(
                "WITH started AS (UPDATE task_approvals SET status = 'running' "
                "WHERE " + _TASK_KEY + " AND call_id = ANY($3::text[]) "
                "AND status = 'approved' RETURNING 1) SELECT count(*) FROM started",
                task_id, user_id, list(call_ids),
            )
            if started != len(set(call_ids)):
                raise ConflictError(
                    f"calls {', '.join(call_ids)} of task {task_id!r} are not all approved and "
                    "waiting to run (another runner may have started them); nothing was started"
                )

        await self._use("starting approved calls", work)

    async def save(self, batch: SaveBatch) -> int:
        check = batch.workspace is not None or batch.complete or batch.epoch is not None
        messages = batch.messages

        async def work(db: asyncpg.Connection) -> int:
            # One statement, so one round trip and atomic without BEGIN/COMMIT: the fence, the
            # version check and the writes. A second writer of this task waits for the first
            # one's row lock, then finds the row moved on.
            stamp = _time.now()
            version, step = batch.expected_version, 1 if batch.workspace is not None else 0
            while True:
                rows = await db.fetch(
                    _SAVE, batch.conversation_id, stamp, batch.user_id, batch.task_id,
                    batch.epoch, None if batch.workspace is None else dumps(batch.workspace),
                    version, step, batch.save_id, batch.complete, check,
                    [m["role"] for m in messages],
                    [_put_text(m["content"]) for m in messages],
                    [m.get("task_id") for m in messages],
                    [m.get("tokens", 0) for m in messages],
                    [m.get("created_at") or stamp.isoformat() for m in messages],
                    [m.get("id") for m in messages],
                    None,  # a profile is written below, through its entries
                )
                if any(row["kind"] == 0 for row in rows):
                    break
                if not check:
                    raise NotFoundError(no_conversation(batch.conversation_id, batch.user_id))
                landed = await _save_problem(db, batch)
                if landed is None:
                    return version  # an earlier attempt of this completion landed
                version, step = landed, 0  # write the landed version again
            _number(messages, rows)
            if (batch.approvals or batch.settled) and not batch.complete:
                await _record_approvals(db, batch, stamp)  # in the same transaction (below)
            if batch.profile is not None:  # in the same transaction (below)
                given = batch.profile
                await _change_profile(db, batch.user_id, lambda book: book.take(given), stamp)
            if batch.complete and batch.learn:
                await _queue_learning(db, batch, stamp)  # in the same transaction (below)
            return int(next(row["seq"] for row in rows if row["kind"] == 0))

        if not batch.complete:
            # A step that pauses for approval, or settles decided calls, also writes
            # task_approvals: one transaction then, so both land or neither.
            return await self._use(
                "saving a task", work, idempotent=True,
                transaction=bool(batch.approvals or batch.settled or batch.profile))
        try:
            # With memory on, the task is queued for learning in the same transaction.
            return await self._use("completing a task", work, idempotent=True,
                                   transaction=batch.learn or batch.profile is not None)
        finally:
            # A completed task needs no runner; one whose completion failed is released by
            # its runner.
            self._leases.pop(batch.task_id, None)

    # -- conversations --------------------------------------------------------------------

    async def load_conversation(self, conversation_id: str, user_id: str) -> ConversationRecord:
        async def work(db: asyncpg.Connection) -> ConversationRecord:
            row = await db.fetchrow(
                _CONVERSATION_COLUMNS + " WHERE conversation_id = $1 AND user_id = $2",
                conversation_id, user_id,
            )
            if row is None:
                raise NotFoundError(no_conversation(conversation_id, user_id))
            return conversation_record(row)

        return await self._read("loading a conversation", work)

    async def list_conversations(
        self, user_id: str, *, limit: int | None = None
    ) -> list[ConversationRecord]:
        async def work(db: asyncpg.Connection) -> list[ConversationRecord]:
            rows = await db.fetch(
                _CONVERSATION_COLUMNS + " WHERE user_id = $1 "
                "ORDER BY updated_at DESC, conversation_id LIMIT $2",
                user_id, limit,
            )
            return [conversation_record(row) for row in rows]

        return await self._read("listing conversations", work)

    async def load_messages(
        self,
        conversation_id: str,
        user_id: str,
        *,
        token_budget: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        async def work(db: asyncpg.Connection) -> list[dict[str, Any]]:
            # Newest first, a page at a time: a long history is read only as far as the window
            # reaches, and the usual window takes one round trip. Messages are only appended,
            # so pages by seq need no snapshot.
            picked: list[dict[str, Any]] = []
            used = 0
            below = None
            page = _MESSAGE_BATCH if limit is None else max(1, min(limit + 1, _MESSAGE_BATCH))
            while True:
                rows = await db.fetch(_PAGE, conversation_id, user_id, below, page)
                if not rows:
                    raise NotFoundError(no_conversation(conversation_id, user_id))
                for row in rows:
                    if row[0] is None:
                        return picked[::-1]  # the conversation has no more messages
                    if limit is not None and len(picked) >= limit:
                        return picked[::-1]
                    if token_budget is not None and used + row[4] > token_budget:
                        return picked[::-1]
                    used += row[4]
                    picked.append(_message(row))
                if len(rows) < page:
                    return picked[::-1]
                below = picked[-1]["seq"]

        return await self._read("loading messages", work)

    # -- profiles -------------------------------------------------------------------------

    async def load_profile(self, user_id: str) -> Profile | None:
        async def work(db: asyncpg.Connection) -> Profile | None:
            text = await db.fetchval(
                "SELECT profile_data::text FROM user_profiles WHERE user_id = $1", user_id
            )
            return None if text is None else decode_profile(text, user_id)

        return await self._read("loading a profile", work)

    async def update_profile(
        self, user_id: str, apply: Callable[[Profile], None], *, generation: int | None = None
    ) -> Profile:
        book = await self.change_profile(user_id, lambda book: book.edit(apply),
                                          generation=generation)
        return book.profile

    async def change_profile(
        self, user_id: str, change: Callable[[ProfileBook], Any], *,
        generation: int | None = None, claim: LearningClaim | None = None,
    ) -> ProfileBook:
        async def work(db: asyncpg.Connection) -> ProfileBook:
            if generation is not None:
                # Locks the user's generation row (made if missing) until commit; forget_user
                # takes the same lock first, so one of the two waits for the other to finish,
                # and the value read here is the latest committed one.
                now = await db.fetchval(
                    "INSERT INTO user_generations (user_key, generation) VALUES ($1, 0) "
                    "ON CONFLICT (user_key) DO UPDATE SET generation = "
                    "user_generations.generation RETURNING generation",
                    generation_key(user_id),
                )
                if now != generation:
                    raise ForgottenError(user_id)
            queued = None
            if claim is not None:
                row = await db.fetchrow(
                    "SELECT tasks, holder FROM learning_queue WHERE user_id = $1 FOR UPDATE",
                    claim.user_id,
                )
                if row is None or row["holder"] != claim.holder:
                    raise claim_lost(claim)
                queued = queued_tasks(row["tasks"], claim.user_id)  # besides the claim's
            stamp = _time.now()
            book = await _change_profile(db, user_id, change, stamp)
            if claim is not None and queued is not None:
                if not queued:
                    await db.execute("DELETE FROM learning_queue WHERE user_id = $1", user_id)
                else:
                    await db.execute(
                        "UPDATE learning_queue SET claimed = '[]', holder = NULL, "
                        "lease_until = NULL, attempts = 0, last_error = NULL, dropped = 0, "
                        "next_attempt_at = $2, updated_at = $2 WHERE user_id = $1",
                        user_id, stamp.isoformat(),
                    )
            return book

        return await self._use("updating a profile", work)

    async def load_entries(self, user_id: str, *, history: bool = False) -> list[ProfileEntry]:
        async def work(db: asyncpg.Connection) -> list[ProfileEntry]:
            return await _entries(db, user_id, history=history)

        return await self._read("loading profile entries", work)

    async def forget_user(self, user_id: str) -> ForgetReceipt:
        async def work(db: asyncpg.Connection) -> ForgetReceipt:
            # First: from here on, learning that began before waits for this transaction and
            # then sees the new generation (see change_profile).
            generation = await db.fetchval(
                "INSERT INTO user_generations (user_key, generation) VALUES ($1, 1) "
                "ON CONFLICT (user_key) DO UPDATE SET generation = user_generations.generation + 1 "
                "RETURNING generation",
                generation_key(user_id),
            )
            receipt = ForgetReceipt(user_id, int(generation))
            # In the order completions and learning lock these rows (conversations, then the
            # learning queue, then the profile), so none of them deadlocks with a forget.
            # Messages and workspaces go with their conversations (ON DELETE CASCADE); the
            # explicit deletes also cover rows written before the cascades existed, and count.
            receipt.messages = await _deleted(
                db, "conversation_messages WHERE conversation_id IN "
                "(SELECT conversation_id FROM conversations WHERE user_id = $1)", user_id)
            receipt.approvals = await _deleted(db, "task_approvals WHERE user_id = $1", user_id)
            receipt.tasks = await _deleted(db, "task_workspaces WHERE user_id = $1", user_id)
            receipt.conversations = await _deleted(db, "conversations WHERE user_id = $1",
                                                   user_id)
            queued = await db.fetchrow(
                "DELETE FROM learning_queue WHERE user_id = $1 RETURNING tasks, claimed", user_id)
            receipt.pending_learning = (0 if queued is None
                                        else pending_count(*queued, user_id=user_id))
            receipt.entries = await _deleted(
                db, "profile_entries WHERE user_id = $1 AND superseded_at IS NULL", user_id)
            receipt.history = await _deleted(db, "profile_entries WHERE user_id = $1", user_id)
            receipt.profiles = await _deleted(db, "user_profiles WHERE user_id = $1", user_id)
            return receipt

        receipt = await self._use("forgetting a user", work)
        self._windows.clear()
        return receipt

    # -- learning as durable work ---------------------------------------------------------

    async def claim_learning(
        self, holder: str, *, user_id: str | None = None, limit: int = 1,
        batch: int = LEARN_BATCH, lease: float = LEARN_LEASE,
    ) -> list[LearningClaim]:
        async def work(db: asyncpg.Connection) -> list[LearningClaim]:
            now = _time.now()
            stamp = now.isoformat()
            columns = ("SELECT user_id, tasks, claimed, dropped, attempts, holder, lease_until "
                       "FROM learning_queue WHERE next_attempt_at <= $1")
            # SKIP LOCKED: a row another transaction writes (a completion queueing a task,
            # another claim) is left for the next sweep instead of waited for.
            if user_id is None:
                rows = await db.fetch(columns + " ORDER BY next_attempt_at LIMIT $2 "
                                      "FOR UPDATE SKIP LOCKED", stamp, limit + 50)
            else:
                rows = await db.fetch(columns + " AND user_id = $2 FOR UPDATE SKIP LOCKED",
                                      stamp, user_id)
            until = (now + timedelta(seconds=lease)).isoformat()
            claims: list[LearningClaim] = []
            for row in rows:
                if len(claims) >= limit:
                    break
                if not claimable(row["holder"], row["lease_until"], holder, stamp):
                    continue
                user = row["user_id"]
                taken, left = take_claim(queued_tasks(row["tasks"], user),
                                         queued_tasks(row["claimed"], user), batch)
                await db.execute(
                    "UPDATE learning_queue SET tasks = $2, claimed = $3, holder = $4, "
                    "lease_until = $5 WHERE user_id = $1",
                    user, dumps(left), dumps(taken), holder, until,
                )
                claims.append(LearningClaim(user, holder, taken, row["attempts"],
                                            row["dropped"]))
            return claims

        return await self._use("claiming learning", work)

    async def release_learning(
        self, claim: LearningClaim, *, error: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        async def work(db: asyncpg.Connection) -> None:
            row = await db.fetchrow(
                "SELECT tasks, claimed FROM learning_queue WHERE user_id = $1 AND holder = $2 "
                "FOR UPDATE", claim.user_id, claim.holder)
            if row is None:
                return  # no longer held: nothing of it is ours
            tasks = [*queued_tasks(row["claimed"], claim.user_id),
                     *queued_tasks(row["tasks"], claim.user_id)]
            await db.execute(
                "UPDATE learning_queue SET tasks = $2, claimed = '[]', holder = NULL, "
                "lease_until = NULL, attempts = attempts + $3, last_error = COALESCE($4, "
                "last_error), next_attempt_at = $5, updated_at = $6 WHERE user_id = $1",
                claim.user_id, dumps(tasks), 1 if error is not None else 0,
                None if error is None else _put_text(error),
                (retry_at or _time.now()).isoformat(), _time.now().isoformat(),
            )

        await self._use("releasing learning", work)

    async def learning_status(self, user_id: str) -> LearningStatus | None:
        async def work(db: asyncpg.Connection) -> LearningStatus | None:
            row = await db.fetchrow(
                "SELECT tasks, claimed, dropped, attempts, last_error, next_attempt_at, holder, "
                "lease_until, created_at FROM learning_queue WHERE user_id = $1", user_id)
            if row is None:
                return None
            values = list(row)
            values[4] = None if values[4] is None else _get_text(values[4])
            return learning_status_of(values, user_id, _time.now().isoformat())

        return await self._read("reading a user's learning", work)

    async def prune_history(self, before: datetime, user_id: str | None = None) -> int:
        async def work(db: asyncpg.Connection) -> int:
            where = "profile_entries WHERE superseded_at IS NOT NULL AND superseded_at < $1"
            if user_id is None:
                return await _deleted(db, where, before.isoformat())
            return await _deleted(db, where + " AND user_id = $2", before.isoformat(), user_id)

        return await self._use("pruning profile history", work, transaction=False)

    # -- export and import ----------------------------------------------------------------

    async def export_user(self, user_id: str) -> UserData:
        async def work(db: asyncpg.Connection) -> UserData:
            # One snapshot of everything the user has.
            async with db.transaction(isolation="repeatable_read", readonly=True):
                return await _export(db, user_id)

        return await self._use("exporting a user", work, write=False, transaction=False)

    async def import_user(self, data: UserData) -> None:
        async def work(db: asyncpg.Connection) -> None:
            await _import(db, data, _time.now())

        await self._use("importing a user", work)
        self._windows.clear()

    async def user_generation(self, user_id: str) -> int:
        async def work(db: asyncpg.Connection) -> int:
            value = await db.fetchval(
                "SELECT generation FROM user_generations WHERE user_key = $1",
                generation_key(user_id),
            )
            return 0 if value is None else int(value)

        return await self._read("reading a user's generation", work)


# -- row helpers ----------------------------------------------------------------------------

_TASK_COLUMNS = (
    "SELECT task_id, user_id, conversation_id, query, workspace_data::text, version, runner, "
    "updated_at, epoch, settings FROM task_workspaces"
)
_CONVERSATION_COLUMNS = (
    "SELECT conversation_id, user_id, conversation_data::text, message_count, updated_at "
    "FROM conversations"
)


_PAGE = (
    # The conversation's row (so a missing or foreign one is told apart from an empty one)
    # and up to $4 of its messages below seq $3, newest first.
    "SELECT m.seq, m.role, m.content, m.task_id, m.tokens, m.created_at, m.message_id "
    "FROM conversations c LEFT JOIN LATERAL (SELECT seq, role, content, task_id, tokens, "
    "created_at, message_id "
    "FROM conversation_messages WHERE conversation_id = c.conversation_id "
    "AND ($3::int IS NULL OR seq < $3::int) ORDER BY seq DESC LIMIT $4) m ON true "
    "WHERE c.conversation_id = $1 AND c.user_id = $2 ORDER BY m.seq DESC"
)


def _no_task(task_id: str, user_id: str) -> str:
    return (
        f"no unfinished task {task_id!r} for user {user_id!r} "
        "(it may have completed; `cogency tasks` lists the unfinished ones)"
    )


async def _owned_task(db: asyncpg.Connection, task_id: str, user_id: str) -> None:
    if await db.fetchval(
        "SELECT 1 FROM task_workspaces WHERE " + _TASK_KEY, task_id, user_id
    ) is None:
        raise NotFoundError(_no_task(task_id, user_id))


async def _approvals(
    db: asyncpg.Connection, task_ids: Sequence[str], status: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The approval rows of these tasks (in ``status`` when given), by task, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    if not task_ids:
        return found
    rows = await db.fetch(
        "SELECT call_id, task_id, call_data::text, status, created_at, decided_at "
        "FROM task_approvals WHERE task_id = ANY($1::text[]) "
        "AND ($2::text IS NULL OR status = $2::text) ORDER BY task_id, position",
        list(task_ids), status,
    )
    for row in rows:
        found.setdefault(row[1], []).append(approval_record(row))
    return found


async def _record_approvals(db: asyncpg.Connection, batch: SaveBatch, stamp: datetime) -> None:
    if batch.approvals:
        last = await db.fetchval(
            "SELECT COALESCE(MAX(position), 0) FROM task_approvals WHERE task_id = $1",
            batch.task_id,
        )
        await db.executemany(
            # ON CONFLICT: a save retried after an unknown outcome stores each call once.
            "INSERT INTO task_approvals (task_id, call_id, user_id, position, call_data, "
            "status, created_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6) "
            "ON CONFLICT (task_id, call_id) DO NOTHING",
            [(batch.task_id, call["id"], batch.user_id, last + number, approval_data(call),
              stamp.isoformat()) for number, call in enumerate(batch.approvals, start=1)],
        )
    if batch.settled:
        await db.execute(
            "UPDATE task_approvals SET status = 'done' WHERE task_id = $1 "
            "AND call_id = ANY($2::text[])",
            batch.task_id, list(batch.settled),
        )


async def _keep_session(db: asyncpg.Connection) -> None:
    """Pool reset: nothing to undo (no session state is set on pool connections; the leases
    live on their own), so the default reset's round trip per release is saved. The pool
    still rolls back a transaction left open."""


_INSERT_ENTRY = (
    f"INSERT INTO profile_entries ({ENTRY_COLUMNS}) VALUES "
    f"({', '.join(f'${n}' for n in range(1, 16))})"
)


def _entry_row(entry: ProfileEntry) -> tuple[Any, ...]:
    row = list(entry_row(entry))
    row[3], row[4] = _put_text(row[3]), _put_text(row[4])  # key, value: text may hold NUL
    return tuple(row)


async def _entries(db: asyncpg.Connection, user_id: str, *, history: bool = False
                   ) -> list[ProfileEntry]:
    if history:
        where = " WHERE user_id = $1 ORDER BY created_at, rank"
    else:
        where = " WHERE user_id = $1 AND superseded_at IS NULL ORDER BY rank"
    rows = await db.fetch(f"SELECT {ENTRY_COLUMNS} FROM profile_entries" + where, user_id)
    entries = []
    for row in rows:
        values = list(row)
        values[3], values[4] = _get_text(values[3]), _get_text(values[4])
        entries.append(entry_record(values))
    return entries


async def _change_profile(db: asyncpg.Connection, user_id: str,
                          change: Callable[[ProfileBook], Any], stamp: datetime) -> ProfileBook:
    """Read the profile (locked) and its current entries, apply ``change``, write what it
    changed: the one place that writes ``profile_entries`` and ``profile_data`` together."""
    # Create the row first so that concurrent updaters of a new profile also queue on its
    # lock instead of both starting from an empty profile.
    text = await db.fetchval(
        "WITH created AS (INSERT INTO user_profiles (user_id, profile_data, updated_at) "
        "VALUES ($1, $2, $3) ON CONFLICT (user_id) DO NOTHING RETURNING profile_data) "
        "SELECT profile_data::text FROM created",
        user_id, dumps(Profile(user_id).to_dict()), stamp,
    )
    stored = None
    if text is None:
        stored = decode_profile(await db.fetchval(
            "SELECT profile_data::text FROM user_profiles WHERE user_id = $1 FOR UPDATE",
            user_id,
        ), user_id)
    book = book_of(stored, user_id, await _entries(db, user_id))
    change(book)
    await _put_profile(db, book.finish(), stamp)
    if book.added:
        await db.executemany(_INSERT_ENTRY, [_entry_row(e) for e in book.added])
    if book.changed:
        await db.executemany(
            "UPDATE profile_entries SET "
            + ENTRY_UPDATE.format(*(f"${n}" for n in range(1, 8)))
            + " WHERE entry_id = $8 AND user_id = $9",
            [entry_changes(e) for e in book.changed.values()],
        )
    return book


async def _deleted(db: asyncpg.Connection, where: str, *args: Any) -> int:
    """Delete ``FROM where`` and count the rows (a forget's receipt)."""
    return int(await db.fetchval(
        f"WITH gone AS (DELETE FROM {where} RETURNING 1) SELECT count(*) FROM gone", *args))


async def _queue_learning(db: asyncpg.Connection, batch: SaveBatch, stamp: datetime) -> None:
    """Queue the completed task for learning: one row per user, its tasks bounded."""
    # The upsert takes the row's lock (a concurrent completion of this user waits for it,
    # then reads what this one queued), and reads what is queued.
    now = stamp.isoformat()
    row = await db.fetchrow(
        "INSERT INTO learning_queue (user_id, tasks, next_attempt_at, created_at, updated_at) "
        "VALUES ($1, '[]', $2, $2, $2) ON CONFLICT (user_id) DO UPDATE SET "
        "updated_at = excluded.updated_at RETURNING tasks, claimed",
        batch.user_id, now,
    )
    tasks, over = queue_task(queued_tasks(row["tasks"], batch.user_id),
                             queued_tasks(row["claimed"], batch.user_id), batch, now)
    # A new task makes the user's learning due now, also after failures (as each new
    # interaction did before learning was durable): at most one attempt per interaction.
    await db.execute(
        "UPDATE learning_queue SET tasks = $2, dropped = dropped + $3, next_attempt_at = $4 "
        "WHERE user_id = $1",
        batch.user_id, dumps(tasks), over, now,
    )


async def _export(db: asyncpg.Connection, user_id: str) -> UserData:
    text = await db.fetchval(
        "SELECT profile_data::text FROM user_profiles WHERE user_id = $1", user_id)
    conversations = []
    for row in await db.fetch(
            _CONVERSATION_COLUMNS + " WHERE user_id = $1 ORDER BY updated_at, conversation_id",
            user_id):
        record = conversation_record(row)
        messages = [_message(m) for m in await db.fetch(
            "SELECT seq, role, content, task_id, tokens, created_at, message_id "
            "FROM conversation_messages WHERE conversation_id = $1 ORDER BY seq",
            record.conversation_id)]
        conversations.append(ConversationData(record.conversation_id, record.data,
                                              record.updated_at, messages))
    tasks = [task_record(row, _get_text) for row in await db.fetch(
        _TASK_COLUMNS + " WHERE user_id = $1 ORDER BY updated_at, task_id", user_id)]
    approvals = await _approvals(db, [task.task_id for task in tasks])
    queued = await db.fetchrow("SELECT claimed, tasks FROM learning_queue WHERE user_id = $1",
                               user_id)
    return UserData(
        user_id, None if text is None else decode_profile(text, user_id),
        await _entries(db, user_id, history=True), conversations,
        [TaskData(t.task_id, t.conversation_id, t.query, t.workspace, t.settings, t.version,
                  t.updated_at, approvals.get(t.task_id, [])) for t in tasks],
        [] if queued is None else [*queued_tasks(queued["claimed"], user_id),
                                   *queued_tasks(queued["tasks"], user_id)],
    )


async def _import(db: asyncpg.Connection, data: UserData, stamp: datetime) -> None:
    user = data.user_id
    if await db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM user_profiles WHERE user_id = $1) OR EXISTS "
            "(SELECT 1 FROM conversations WHERE user_id = $1)", user):
        raise import_conflict(user, "the store already holds data of this user")
    taken = await db.fetchval(
        "SELECT conversation_id FROM conversations WHERE conversation_id = ANY($1::text[]) "
        "LIMIT 1", [c.conversation_id for c in data.conversations])
    if taken is not None:
        raise import_conflict(user, f"conversation {taken!r} exists")
    taken = await db.fetchval(
        "SELECT task_id FROM task_workspaces WHERE task_id = ANY($1::text[]) LIMIT 1",
        [t.task_id for t in data.tasks])
    if taken is not None:
        raise import_conflict(user, f"task {taken!r} exists")
    taken = await db.fetchval(
        "SELECT entry_id FROM profile_entries WHERE entry_id = ANY($1::text[]) LIMIT 1",
        [e.entry_id for e in data.entries])
    if taken is not None:
        raise import_conflict(user, f"profile entry {taken!r} exists")
    await _put_profile(db, data.profile or Profile(user), stamp)
    await db.executemany(_INSERT_ENTRY, [_entry_row(e) for e in data.entries])
    now = stamp.isoformat()
    for conversation in data.conversations:
        await db.execute(
            "INSERT INTO conversations (conversation_id, user_id, conversation_data, updated_at, "
            "message_count) VALUES ($1, $2, $3, $4, $5)",
            conversation.conversation_id, user, dumps(conversation.data),
            conversation.updated_at or stamp, len(conversation.messages),
        )
        await db.executemany(
            "INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, "
            "tokens, created_at, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            [(conversation.conversation_id, seq, m["role"], _put_text(m["content"]),
              m.get("task_id"), m.get("tokens", 0), m.get("created_at") or now, m.get("id"))
             for seq, m in enumerate(conversation.messages, start=1)],
        )
    for task in data.tasks:
        await db.execute(
            "INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, "
            "workspace_data, version, updated_at, epoch, settings) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8)",
            task.task_id, user, task.conversation_id, _put_text(task.query),
            dumps(task.workspace), task.version, task.updated_at or stamp, dumps(task.settings),
        )
        await db.executemany(
            "INSERT INTO task_approvals (task_id, call_id, user_id, position, call_data, "
            "status, created_at, decided_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            [(task.task_id, call["id"], user, position, approval_data(call), call["status"],
              call.get("created_at") or now, call.get("decided_at"))
             for position, call in enumerate(task.approvals, start=1)],
        )
    if data.learning:
        await db.execute(
            "INSERT INTO learning_queue (user_id, tasks, next_attempt_at, created_at, "
            "updated_at) VALUES ($1, $2, $3, $3, $3)",
            user, dumps(data.learning), now,
        )


async def _put_profile(db: asyncpg.Connection, profile: Profile, stamp: datetime) -> None:
    await db.execute(
        "INSERT INTO user_profiles (user_id, profile_data, updated_at) VALUES ($1, $2, $3) "
        "ON CONFLICT (user_id) DO UPDATE SET profile_data = excluded.profile_data, "
        "updated_at = excluded.updated_at",
        profile.user_id, dumps(profile.to_dict()), stamp,
    )


_BEGIN = (
    # $1 user, $2 a default profile, $3 stamp, $4 conversation, $5 its data if new, $6-$12 the
    # task row, $13-$18 its first messages, $19 the last seq this store saw of the conversation,
    # $20 how many newer messages to return (newest first). Rows: kind 0 the conversation
    # (data, seq before the first new message, updated_at) when the task was stored; kind 1 the
    # messages after $19 as they were before this statement; kind 2 the created_at of seq $19
    # (to check a cached window); kind 3 when the conversation is another user's. $21 the
    # task's settings.
    "WITH existing AS (SELECT user_id, conversation_data::text AS data, updated_at "
    "FROM conversations WHERE conversation_id = $4), "
    "mine AS (SELECT 1 FROM existing WHERE user_id = $1), "
    "profile AS (INSERT INTO user_profiles (user_id, profile_data, updated_at) "
    "SELECT $1, $2::json, $3 WHERE NOT EXISTS (SELECT 1 FROM existing WHERE user_id <> $1) "
    "ON CONFLICT (user_id) DO NOTHING), "
    "m AS (SELECT * FROM unnest($13::text[], $14::text[], $15::text[], $16::int[], "
    "$17::text[], $18::text[]) WITH ORDINALITY "
    "AS m(role, content, task_id, tokens, created_at, message_id, ord)), "
    "created AS (INSERT INTO conversations (conversation_id, user_id, conversation_data, "
    "updated_at, message_count) SELECT $4, $1, $5::json, $3, (SELECT count(*) FROM m) "
    "WHERE NOT EXISTS (SELECT 1 FROM existing) ON CONFLICT (conversation_id) DO NOTHING "
    "RETURNING conversation_data::text AS data, 0::bigint AS base, updated_at), "
    "counter AS (UPDATE conversations SET message_count = message_count + "
    "(SELECT count(*) FROM m), updated_at = CASE WHEN EXISTS (SELECT 1 FROM m) THEN $3 "
    "ELSE updated_at END WHERE conversation_id = $4 AND EXISTS (SELECT 1 FROM mine) "
    "RETURNING message_count - (SELECT count(*) FROM m) AS base, updated_at), "
    "conv AS (SELECT data, base, updated_at FROM created UNION ALL "
    "SELECT e.data, c.base, c.updated_at FROM existing e, counter c), "
    "task AS (INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, "
    "workspace_data, version, runner, updated_at, epoch, lease_holder, settings) "
    "SELECT $6, $1, $4, $7, $8::json, $9::int, $10::text, $3, $11::int, $12::bigint, "
    "$21::text FROM conv RETURNING 1), "
    "ins AS (INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, "
    "tokens, created_at, message_id) SELECT $4, conv.base + m.ord, m.role, m.content, "
    "m.task_id, m.tokens, m.created_at, m.message_id FROM conv, m "
    "WHERE EXISTS (SELECT 1 FROM task)) "
    "SELECT 0 AS kind, base::int AS seq, NULL AS role, NULL AS content, NULL AS task_id, "
    "NULL::int AS tokens, NULL AS created_at, NULL AS message_id, data, updated_at AS updated "
    "FROM conv WHERE EXISTS (SELECT 1 FROM task) "
    "UNION ALL (SELECT 1, seq, role, content, task_id, tokens, created_at, message_id, NULL, "
    "NULL FROM conversation_messages WHERE conversation_id = $4 AND seq > $19::int "
    "AND EXISTS (SELECT 1 FROM mine) ORDER BY seq DESC LIMIT $20::int) "
    "UNION ALL SELECT 2, seq, NULL, NULL, NULL, NULL, created_at, NULL, NULL, NULL "
    "FROM conversation_messages WHERE conversation_id = $4 AND seq = $19::int "
    "AND EXISTS (SELECT 1 FROM mine) "
    "UNION ALL SELECT 3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL "
    "FROM existing WHERE user_id <> $1"
)


class _Windows(Windows):
    """The windows of recently used conversations, so starting a task reads only the
    messages added since (in the same statement that stores the task)."""

    def update(
        self,
        conversation_id: str,
        budget: int,
        cached: Window | None,
        rows: Sequence[Any],
        added: Sequence[dict[str, Any]],
    ) -> History | None:
        """The window after ``begin_task`` stored ``added``, from the cached one and the newer
        ``rows``; ``None`` when it cannot be told from them (read it afresh)."""
        newer = [_message(tuple(row)[1:8]) for row in rows if row["kind"] == 1]  # newest first
        stamp = next((row["created_at"] for row in rows if row["kind"] == 2), None)
        fresh = [*reversed(newer), *({**m, "tokens": m.get("tokens", 0)} for m in added)]
        seqs = [m["seq"] for m in fresh]
        start = cached.last_seq + 1 if cached is not None else seqs[0] if seqs else 1
        if seqs != list(range(start, start + len(seqs))) or (
            cached is not None
            and ((stamp or "") != cached.last_stamp or len(newer) >= _MESSAGE_BATCH)
        ):
            # A writer committed between this statement's snapshot and its append, the
            # conversation was made again, or more is new than one page: read it afresh.
            self.drop(conversation_id)
            return None
        last_seq, last_stamp = (
            (fresh[-1]["seq"], fresh[-1].get("created_at") or "") if fresh else (0, ""))
        if cached is not None:
            entry = cached.advanced(fresh, last_seq, last_stamp) if fresh else cached
        else:
            entry = Window.newest(budget, reversed(fresh), last_seq, last_stamp)
            if len(entry.messages) == len(fresh) and len(newer) >= _MESSAGE_BATCH:
                return None  # older messages may still fit: the caller reads them
        return self.put(conversation_id, entry)

    def loaded(self, conversation_id: str, budget: int, messages: list[dict[str, Any]]
               ) -> History:
        """Keep the window ``load_messages`` read (``messages``, oldest first)."""
        if not messages:  # not even the newest fits: nothing to validate a cache with
            return History()
        newest = messages[-1]
        return self.put(conversation_id, Window.newest(
            budget, reversed(messages), newest["seq"], newest.get("created_at") or ""))


_SAVE = (
    # $1 conversation, $2 stamp, $3 user, $4 task, $5 epoch (fence when set), $6 workspace
    # (written when set), $7 expected version, $8 version step, $9 save id, $10 complete,
    # $11 check the task row at all, $12-$17 the messages, $18 profile (written when set).
    # Returns one row of kind 0 (the version) when it wrote, kind 1 per message stored
    # before (a retry), kind 2 the seq before the first new message. The task row is found by
    # its key (the owner as in _TASK_KEY).
    "WITH conv AS (SELECT 1 FROM conversations WHERE conversation_id = $1 AND user_id = $3), "
    "task AS (UPDATE task_workspaces SET workspace_data = COALESCE($6::json, workspace_data), "
    "version = version + $8::int, updated_at = $2, last_save = COALESCE($9::text, last_save) "
    "WHERE $11::bool AND NOT $10::bool AND task_id = $4 AND user_id IS NOT DISTINCT FROM $3 "
    "AND EXISTS (SELECT 1 FROM conv) AND ($6::json IS NULL OR version = $7::int) "
    "AND ($5::int IS NULL OR epoch = $5::int) RETURNING version), "
    "gone AS (DELETE FROM task_workspaces WHERE $11::bool AND $10::bool AND task_id = $4 "
    "AND user_id IS NOT DISTINCT FROM $3 AND EXISTS (SELECT 1 FROM conv) AND version = $7::int "
    "AND ($5::int IS NULL OR epoch = $5::int) RETURNING version), "
    "ok AS (SELECT version FROM task UNION ALL SELECT version FROM gone "
    "UNION ALL SELECT $7::int WHERE NOT $11::bool AND EXISTS (SELECT 1 FROM conv)), "
    "m AS (SELECT * FROM unnest($12::text[], $13::text[], $14::text[], $15::int[], "
    "$16::text[], $17::text[]) WITH ORDINALITY "
    "AS m(role, content, task_id, tokens, created_at, message_id, ord)), "
    # One probe of the (conversation_id, message_id) index per message: a join (or
    # = ANY) was planned, in the generic plan made while the table was small, as a scan of
    # the whole conversation, so a save cost more every turn.
    "old AS (SELECT message_id, seq FROM (SELECT m.message_id, (SELECT x.seq "
    "FROM conversation_messages x WHERE x.conversation_id = $1 "
    "AND x.message_id = m.message_id) AS seq FROM m) probe WHERE seq IS NOT NULL), "
    "fresh AS (SELECT m.*, row_number() OVER (ORDER BY ord) AS n FROM m "
    "WHERE m.message_id IS NULL OR m.message_id NOT IN (SELECT message_id FROM old)), "
    "counter AS (UPDATE conversations SET message_count = message_count + "
    "(SELECT count(*) FROM fresh), updated_at = $2 WHERE conversation_id = $1 "
    "AND user_id = $3 AND EXISTS (SELECT 1 FROM ok) AND EXISTS (SELECT 1 FROM fresh) "
    "RETURNING message_count - (SELECT count(*) FROM fresh) AS base), "
    "ins AS (INSERT INTO conversation_messages (conversation_id, seq, role, content, "
    "task_id, tokens, created_at, message_id) SELECT $1, counter.base + fresh.n, "
    "fresh.role, fresh.content, fresh.task_id, fresh.tokens, fresh.created_at, "
    "fresh.message_id FROM counter, fresh), "
    "profile AS (INSERT INTO user_profiles (user_id, profile_data, updated_at) "
    "SELECT $3, $18::json, $2 WHERE $18::json IS NOT NULL AND EXISTS (SELECT 1 FROM ok) "
    "ON CONFLICT (user_id) DO UPDATE SET profile_data = excluded.profile_data, "
    "updated_at = excluded.updated_at) "
    "SELECT 0 AS kind, NULL AS message_id, version AS seq FROM ok "
    "UNION ALL SELECT 1, message_id, seq FROM old "
    "UNION ALL SELECT 2, NULL, base FROM counter"
)


def _number(messages: Sequence[dict[str, Any]], rows: Sequence[Any]) -> None:
    """Give each message its seq: a stored one's (kind 1 rows), else the next new one."""
    stored = {row["message_id"]: row["seq"] for row in rows if row["kind"] == 1}
    base = next((row["seq"] for row in rows if row["kind"] == 2), 0)
    for message in messages:
        if message.get("id") in stored:
            message["seq"] = stored[message["id"]]
        else:
            base += 1
            message["seq"] = base


async def _save_problem(db: asyncpg.Connection, batch: SaveBatch) -> int | None:
    """Why a fenced, versioned write matched no row: raises what went wrong (the run lost its
    lease, the task is gone, someone saved first); or, when an earlier attempt of this same
    save landed unseen, returns the version to write over (``None``: a completion landed)."""
    row = await db.fetchrow(
        "SELECT version, epoch, last_save FROM task_workspaces WHERE " + _TASK_KEY,
        batch.task_id, batch.user_id,
    )
    if row is None:
        if batch.complete and batch.messages:
            ids = [m.get("id") for m in batch.messages]
            stored = await db.fetchval(
                "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 "
                "AND message_id = ANY($2::text[])",
                batch.conversation_id, ids,
            )
            if stored == len(batch.messages):
                return None
        if batch.epoch is not None:
            raise lease_lost(batch.task_id)
        raise NotFoundError(no_workspace(batch))
    version, epoch, last_save = row
    if batch.epoch is not None and epoch != batch.epoch:
        raise lease_lost(batch.task_id)
    if batch.save_id and last_save == batch.save_id and version == batch.expected_version + 1:
        return int(version)  # this save's earlier attempt landed: write it again
    raise ConflictError(conflict(batch, version))


_SELECT_KEYS = "SELECT key_id, user_id, key_hash, name, created_at, revoked_at FROM api_keys"


# PostgreSQL text cannot hold NUL, which SQLite stores (a model may emit "\u0000"). Text with
# NUL is stored with it escaped; the escape character is escaped too, so the mapping is
# reversible, and text holding neither (nearly all of it) is stored verbatim.
_ESCAPE = "\ue000"  # private use: no meaning of its own
_ESCAPED = re.compile("\ue000([0e])")


def _put_text(text: str) -> str:
    if "\x00" not in text and _ESCAPE not in text:
        return text
    return text.replace(_ESCAPE, _ESCAPE + "e").replace("\x00", _ESCAPE + "0")


def _get_text(text: str) -> str:
    if _ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda match: "\x00" if match.group(1) == "0" else _ESCAPE, text)


_HELD = (
    # Whether the session holding advisory lock t.lease_holder (a bigint key: classid holds
    # its high 32 bits, objid its low ones) is alive.
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.objsubid = 1 AND l.classid::int8 = (t.lease_holder >> 32) & 4294967295 "
    "AND l.objid::int8 = t.lease_holder & 4294967295)"
)


def _hold_key(conversation_id: str) -> int:
    """The advisory-lock key of a conversation's hold: 64 bits of a hash (the stores' random
    lease keys share the space; meeting one is a 1 in 2**64 chance)."""
    digest = hashlib.blake2b(b"cogency.conversation\0" + conversation_id.encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _message(row: Any) -> dict[str, Any]:
    seq, role, content, task_id, tokens, created, message_id = row
    return {"role": role, "content": _get_text(content), "seq": seq, "task_id": task_id,
            "tokens": tokens, "created_at": created, "id": message_id}


def redact(dsn: str) -> str:
    """``dsn`` without its password (in the user part or the query string)."""
    try:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostinfo = netloc.rpartition("@")
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}"
        query = urlencode(
            [(k, "***" if k.lower() in ("password", "passfile") else v)
             for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unreadable PostgreSQL URL>"


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (not the statement) failed."""
    asyncpg = _driver()
    if isinstance(exc, (asyncio.TimeoutError, asyncpg.exceptions.QueryCanceledError)):
        return False
    return isinstance(exc, (
        asyncpg.exceptions.PostgresConnectionError,
        asyncpg.exceptions.OperatorInterventionError,  # e.g. pg_terminate_backend, shutdown
        asyncpg.exceptions.InterfaceError,
        asyncpg.exceptions.InternalClientError,  # the server's goodbye crossed our query
        ConnectionError,
        OSError,
    ))


def _drop(db: asyncpg.Connection) -> None:
    """Close a half-dead or out-of-step pooled connection so the pool opens a new one."""
    asyncpg = _driver()
    try:
        if not db.is_closed():
            db.terminate()
    except asyncpg.exceptions.InterfaceError:
        pass  # it closed meanwhile and is back in the pool already, to be replaced


def _driver() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise ConfigurationError(
            "PostgreSQL support needs asyncpg: pip install 'cogency[postgres]'"
        ) from exc
    return asyncpg
