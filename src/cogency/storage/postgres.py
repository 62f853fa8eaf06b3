"""PostgreSQL storage: one database shared by many agent processes on many machines.

Same tables, columns and migration names as :mod:`cogency.storage.sqlite`; the JSON columns
have PostgreSQL's ``json`` type, which rejects invalid JSON yet keeps the text exactly as
written (``jsonb`` would refuse a ``\\u0000`` that SQLite stores). Writers serialize on row
locks, not on the whole database. Tasks and conversations are held by leases as rows
(:mod:`cogency.storage._lease`), as on SQLite.

Nothing a run depends on lives in a server session, so the store works behind a pooler that
hands each transaction another server connection (PgBouncer's ``pool_mode = transaction``):

- Every statement sets what its transaction needs itself, first thing, with
  ``set_config(…, true)``: the user it acts for (row-level security, see migration m013), a
  named scope for the few operations across users, ``lock_timeout`` and
  ``synchronous_commit``. A gate makes the order certain: the statement's body is a
  materialized CTE read only under a one-time filter whose InitPlan runs the ``set_config``
  calls, so no row of it is touched before (``_scoped``).
- On a direct connection, statements are prepared once per connection under names no other
  client uses, with generic plans (``plan_cache_mode``, sent at connection start). Behind a
  pooler that refuses that startup parameter (PgBouncer does), or that answers "prepared
  statement does not exist" (one that passes it on), statements are unnamed and parsed again
  with each execution, in the same round trip (``_Connection``).
"""

from __future__ import annotations

import asyncio
import logging
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
from ._lease import LEASE_SECONDS, Held, Leases, hold_lost, process_of
from ._window import Newest, Window, Windows, counts_held, recounted
from .base import (
    ENTRY_COLUMNS,
    ENTRY_UPDATE,
    CONVERSATION_RUNS_TABLE,
    IDEMPOTENCY_KEYS_TABLE,
    LEARN_BATCH,
    LEARNING_QUEUE_TABLE,
    LEARN_LEASE,
    MAX_PENDING_TASKS,
    MIGRATION_NAMES,
    PROFILE_ENTRIES_TABLE,
    ApiKeyRecord,
    ConversationData,
    ConversationRecord,
    ForgetReceipt,
    LearningClaim,
    LearningStatus,
    RequestRecord,
    SaveBatch,
    TaskData,
    TaskRecord,
    UserData,
    APPROVAL_COLUMNS,
    book_of,
    claim_lost,
    claimable,
    entry_changes,
    entry_record,
    entry_row,
    import_conflict,
    import_taken,
    learning_ref,
    learning_status_of,
    lease_free,
    pending_count,
    queued_tasks,
    take_claim,
    approval_data,
    approval_record,
    check_decisions,
    api_key_record,
    busy_conversation,
    chain_turns,
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
    schema_problem,
    task_record,
    task_running,
    too_new,
    turn_hash,
)

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")

_MIGRATION_LOCK = 0x636F67656E6379  # "cogency": one key for every process migrating this database
_RETRIES = 3
"""Attempts of one transaction: deadlock victims and connections lost before COMMIT."""
_LOST_CONNECTION_RETRIES = 1
_TAKE_ATTEMPTS = 3
"""Statements one claim (or hold) may take: again after finding its holder's process gone,
or a holder that committed in between."""
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


async def _m009_client_tool_calls(db: asyncpg.Connection) -> None:
    # A call of a tool the client declared (OpenAI function calling) waits in the same table
    # as a call waiting for a person: the client decides it by sending its result, kept
    # here until the resumed task stores it in the conversation.
    await db.execute(
        "ALTER TABLE task_approvals ADD COLUMN decider TEXT NOT NULL DEFAULT 'person', "
        "ADD COLUMN output TEXT"
    )


async def _m010_idempotency_keys(db: asyncpg.Connection) -> None:
    await db.execute(IDEMPOTENCY_KEYS_TABLE.format(timestamp="TIMESTAMPTZ"))  # (storage/base.py)


async def _m011_conversation_turns(db: asyncpg.Connection) -> None:
    # A digest of each conversation's turns (base.turn_hash), kept by every append (in the
    # same statement, by cogency_chain_turns, as base.chain_turns computes it), so the service
    # finds the conversation of a resent chat history by one indexed lookup.
    await db.execute(
        """
        ALTER TABLE conversations ADD COLUMN turns_digest TEXT;
        CREATE INDEX conversations_by_turns ON conversations(user_id, turns_digest);
        CREATE FUNCTION cogency_chain_turns(digest TEXT, turns TEXT[]) RETURNS TEXT
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            turn TEXT;
        BEGIN
            FOREACH turn IN ARRAY turns LOOP
                digest := encode(sha256(convert_to(coalesce(digest, '') || turn, 'UTF8')),
                                 'hex');
            END LOOP;
            RETURN digest;
        END $$;
        """
    )
    digests: dict[str, str | None] = {}
    async for conversation_id, role, content in db.cursor(
        "SELECT conversation_id, role, content FROM conversation_messages "
        "ORDER BY conversation_id, seq"
    ):
        piece = turn_hash(role, _get_text(content))
        if piece is not None:
            digests[conversation_id] = chain_turns(digests.get(conversation_id), (piece,))
    await db.executemany(
        "UPDATE conversations SET turns_digest = $1 WHERE conversation_id = $2",
        [(digest, conversation_id) for conversation_id, digest in digests.items()],
    )


async def _m012_leases_as_rows(db: asyncpg.Connection) -> None:
    # Tasks and conversations are held by leases as rows, as on SQLite, instead of session
    # advisory locks: a pooler in transaction mode keeps no session, and a lost session no
    # longer drops a conversation's hold unseen. A conversation's row keeps its epoch when
    # released (runner NULL), so each take moves it on and fences out the run before.
    await db.execute(CONVERSATION_RUNS_TABLE.format(timestamp="TIMESTAMPTZ"))  # (storage/base.py)


_USER = "current_setting('cogency.user_id', true)"
_SCOPE = "current_setting('cogency.scope', true)"
_POLICIES = {
    # table -> the named scopes (besides its user's own rows) that may see its rows
    "user_profiles": (),
    "conversations": ("holds",),
    "task_workspaces": ("all_tasks", "leases"),
    "task_approvals": ("all_tasks",),
    "api_keys": ("api_keys",),
    "idempotency_keys": (),
    "conversation_runs": ("holds", "leases"),
}


def _owner_policy(table: str, scopes: Sequence[str]) -> str:
    """Row-level security on ``table``: its user's rows, and every row for statements in one
    of ``scopes`` (or migrating)."""
    allowed = ", ".join(f"'{scope}'" for scope in (*scopes, "migration"))
    return (
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; "
        f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY; "
        f"CREATE POLICY cogency_owner ON {table} USING (user_id = {_USER} "
        f"OR {_SCOPE} IN ({allowed}))"
    )


async def _m013_row_level_security(db: asyncpg.Connection) -> None:
    # Every user's rows are visible only to statements that act for that user (the store sets
    # cogency.user_id in each one), so a query that forgets its WHERE user_id finds nothing of
    # another user's. Operations across users name their scope (cogency.scope): listing every
    # user's tasks, finding an API key before its user is known, renewing and releasing
    # leases, checking a conversation's owner before holding it, migrating. FORCE: the tables'
    # owner (usually the role the store connects as) is held to the policies too; superusers
    # and BYPASSRLS roles still see everything. user_generations holds hashes, no user id.
    for table, scopes in _POLICIES.items():
        await db.execute(_owner_policy(table, scopes))
    # A message is its conversation's: readable, changeable and deletable where that row is
    # visible. An insert needs a user scope: a new conversation and its first messages are
    # written by one statement, whose policy checks cannot see that statement's own rows;
    # the statements that append check the conversation's owner themselves.
    await db.execute(
        "ALTER TABLE conversation_messages ENABLE ROW LEVEL SECURITY; "
        "ALTER TABLE conversation_messages FORCE ROW LEVEL SECURITY; "
        "CREATE POLICY cogency_owner ON conversation_messages USING (EXISTS (SELECT 1 FROM "
        "conversations c WHERE c.conversation_id = conversation_messages.conversation_id)) "
        f"WITH CHECK ({_USER} <> '' OR {_SCOPE} = 'migration')"
    )


_MEMORY_POLICIES = {
    # The tables of memory, made after m013, under the same policy shape (_owner_policy).
    "profile_entries": ("history",),   # pruning old history across users
    "learning_queue": ("learning",),   # the sweep claiming any user's queued learning
}


async def _m014_profile_entries(db: asyncpg.Connection) -> None:
    await db.execute(PROFILE_ENTRIES_TABLE)  # (its columns, and why: storage/base.py)
    await db.execute(_owner_policy("profile_entries", _MEMORY_POLICIES["profile_entries"]))
    # Profiles learned before entries existed: their values become entries without sources.
    for user_id, text in await db.fetch("SELECT user_id, profile_data::text FROM user_profiles"):
        try:
            book = ProfileBook.adopt(decode_profile(text, user_id))
        except CorruptDataError:
            continue  # reported when it is read; a change then adopts what it holds
        await db.executemany(_INSERT_ENTRY_TEXT, [_entry_row(e) for e in book.added])


async def _m015_learning_queue(db: asyncpg.Connection) -> None:
    await db.execute(LEARNING_QUEUE_TABLE)  # (its columns, and why: storage/base.py)
    await db.execute(_owner_policy("learning_queue", _MEMORY_POLICIES["learning_queue"]))
    # base.queue_task's rule, so that a completion queues its task in the statement that
    # completes it (_SAVE): the queued tasks without this one, then it (unless a claim holds
    # it), the newest `bound` kept; `over` says how many older ones had to leave.
    await db.execute(
        """
        CREATE FUNCTION cogency_queue_task(tasks TEXT, claimed TEXT, ref JSON, bound INT,
                                           OUT queued TEXT, OUT over INT)
        LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
        DECLARE
            kept JSON[];
        BEGIN
            SELECT coalesce(array_agg(e.value ORDER BY e.ord), '{}') INTO kept
            FROM json_array_elements(tasks::json) WITH ORDINALITY AS e(value, ord)
            WHERE e.value->>'task_id' IS DISTINCT FROM ref->>'task_id';
            IF NOT EXISTS (SELECT 1 FROM json_array_elements(claimed::json) AS c(value)
                           WHERE c.value->>'task_id' = ref->>'task_id') THEN
                kept := kept || ref;
            END IF;
            over := greatest(0, coalesce(array_length(kept, 1), 0) - bound);
            queued := array_to_json(kept[over + 1:])::text;
        END $$;
        """
    )


MIGRATIONS: tuple[tuple[str, Callable[[Any], Awaitable[None]]], ...] = (
    ("m001_initial", _m001_initial),
    ("m002_conversation_messages", _m002_conversation_messages),
    ("m003_task_workspace_columns", _m003_task_workspace_columns),
    ("m004_run_leases", _m004_run_leases),
    ("m005_forget_generation", _m005_forget_generation),
    ("m006_approvals", _m006_approvals),
    ("m007_service", _m007_service),
    ("m008_task_settings", _m008_task_settings),
    ("m009_client_tool_calls", _m009_client_tool_calls),
    ("m010_idempotency_keys", _m010_idempotency_keys),
    ("m011_conversation_turns", _m011_conversation_turns),
    ("m012_leases_as_rows", _m012_leases_as_rows),
    ("m013_row_level_security", _m013_row_level_security),
    ("m014_profile_entries", _m014_profile_entries),
    ("m015_learning_queue", _m015_learning_queue),
)
assert tuple(name for name, _ in MIGRATIONS) == MIGRATION_NAMES


async def migrate(db: asyncpg.Connection, upto: str | None = None) -> list[str]:
    """Apply the missing migrations in order (through ``upto``); returns the names applied.

    Runs in one transaction under an advisory lock, so processes opening a new database at the
    same moment take turns: the first migrates, the others find it done.
    """
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        # Migrations work on every user's rows (row-level security, m013).
        await db.execute("SELECT set_config('cogency.scope', 'migration', true)")
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
                _time.stamp(),
            )
        applied = []
        for name, step in MIGRATIONS:
            if name not in done:
                await step(db)
                await db.execute(
                    "INSERT INTO schema_migrations VALUES ($1, $2)", name, _time.stamp()
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




# -- statements that carry their own settings ------------------------------------------------

_PARAMETER = re.compile(r"\$(\d+)")


class _Sql:
    """A statement of the store, made to set its transaction's scope and settings first.

    ``body`` (a query, or a data-modifying statement with RETURNING) becomes a materialized
    CTE, read under a one-time filter whose InitPlan runs the ``set_config`` calls: PostgreSQL
    runs a CTE only when it is read (or, one with a data change that nothing reads, after the
    main query), and evaluates the filter before reading anything under it, so every row the
    statement touches is touched with the user (row-level security), ``lock_timeout`` and
    ``synchronous_commit`` set. ``ctes`` are more CTEs (data-modifying ones must be at the top
    level); ``order`` orders the rows. The settings are the last four parameters; they last
    until the transaction ends (``true``: local), whichever server connection runs it.
    """

    __slots__ = ("text",)

    def __init__(self, body: str, *, ctes: str = "", order: str = "") -> None:
        used = [int(number) for number in _PARAMETER.findall(ctes + body)]
        n = max(used, default=0)
        user, scope, lock, sync = (f"${n + k}" for k in range(1, 5))
        self.text = (
            f"WITH cogency_scope AS (SELECT set_config('cogency.user_id', {user}::text, true), "
            f"set_config('cogency.scope', {scope}::text, true), "
            f"set_config('lock_timeout', {lock}::text, true), "
            f"CASE WHEN {sync}::text IS NOT NULL "
            f"THEN set_config('synchronous_commit', {sync}::text, true) END), "
            + (f"{ctes}, " if ctes else "")
            + f"cogency_body AS MATERIALIZED ({body}) "
            "SELECT * FROM cogency_body WHERE (SELECT true FROM cogency_scope)"
            + (f" ORDER BY {order}" if order else "")
        )


class _Db:
    """A pooled connection as the store's work sees it: every statement is a :class:`_Sql`,
    given the scope of the call (the user it acts for, or a named scope across users)."""

    __slots__ = ("connection", "_settings")

    def __init__(self, connection: asyncpg.Connection, settings: tuple[Any, ...]) -> None:
        self.connection = connection
        self._settings = settings

    async def fetch(self, sql: _Sql, *args: Any) -> list[Any]:
        return cast("list[Any]", await self.connection.fetch(sql.text, *args, *self._settings))

    async def fetchrow(self, sql: _Sql, *args: Any) -> Any:
        return await self.connection.fetchrow(sql.text, *args, *self._settings)

    async def fetchval(self, sql: _Sql, *args: Any) -> Any:
        return await self.connection.fetchval(sql.text, *args, *self._settings)

    async def executemany(self, sql: _Sql, rows: Sequence[Sequence[Any]]) -> None:
        await self.connection.executemany(sql.text, [(*row, *self._settings) for row in rows])


class _Mode:
    """How the connections of one store prepare statements (switched for all at once)."""

    __slots__ = ("unnamed",)

    def __init__(self, unnamed: bool = False) -> None:
        self.unnamed = unnamed


_CONNECTIONS: dict[str, Any] = {}


def _connection_class() -> Any:
    """asyncpg's connection, made safe behind a pooler (made once; asyncpg is optional).

    - Statements it prepares have names no other client uses, so a statement sent to a
      server connection that lacks it fails ("does not exist") instead of running another
      client's statement of the same name.
    - With its store's ``mode.unnamed`` set, statements are unnamed and parsed again in the same round trip as
      each execution (asyncpg re-parses an unprepared statement before Bind); their
      parameter and result types are kept here, so a statement costs one round trip, not the
      two of asyncpg's own ``statement_cache_size=0`` (describe, then execute).
    """
    if "class" in _CONNECTIONS:
        return _CONNECTIONS["class"]
    asyncpg = _driver()

    class _Connection(asyncpg.Connection):  # type: ignore[name-defined]
        def __init__(self, *args: Any, **options: Any) -> None:
            super().__init__(*args, **options)
            self.mode = _Mode()  # its store's, once the pool made it
            self._token = os.urandom(6).hex()
            self._count = 0
            self._described: dict[Any, Any] = {}

        def _get_unique_id(self, prefix: str) -> str:
            self._count += 1
            return f"__cogency_{self._token}_{prefix}_{self._count:x}__"

        async def _get_statement(self, query: str, timeout: Any, *, named: Any = False,
                                 use_cache: bool = True, ignore_custom_codec: bool = False,
                                 record_class: Any = None) -> Any:
            if not self.mode.unnamed or named or not use_cache:
                return await super()._get_statement(
                    query, timeout, named=named, use_cache=use_cache,
                    ignore_custom_codec=ignore_custom_codec, record_class=record_class)
            key = (query, record_class, ignore_custom_codec)
            statement = self._described.get(key)
            if statement is None:
                statement = await super()._get_statement(
                    query, timeout, named=False, use_cache=False,
                    ignore_custom_codec=ignore_custom_codec, record_class=record_class)
                if statement.prepared:
                    statement.mark_unprepared()  # parsed again with every execution
                if len(self._described) >= 512:
                    self._described.clear()
                self._described[key] = statement
            return statement

        def _drop_local_statement_cache(self) -> None:
            self._described.clear()
            super()._drop_local_statement_cache()

    _CONNECTIONS["class"] = _Connection
    return _Connection


log = logging.getLogger("cogency.storage")

# -- the store ------------------------------------------------------------------------------


class PostgresStore:
    """A :class:`~cogency.storage.Store` on a PostgreSQL database (``asyncpg`` pool).

    Nothing connects until the first call; then a pool of at most ``max_size`` connections
    opens and the schema is migrated. Waiting longer than ``acquire_timeout`` seconds for a free
    connection, or ``lock_timeout`` for a row lock, raises
    :class:`~cogency.errors.StoreUnavailableError`. Tasks and conversations being run are held
    by leases of ``lease`` seconds that this store renews while the runs go on (one statement
    every third of it, for all it holds); a runner whose process is gone (on this host) or
    whose lease lapsed (any host) holds nothing. The store opens no connection but its pool's.

    It works directly on PostgreSQL and behind a pooler in transaction or session mode
    (PgBouncer): ``pooled`` says which it found (``None`` until it connected). Behind a pooler
    statements are parsed with every execution (no server session keeps them).

    ``read_only=True`` never migrates or writes (every call is a read-only transaction): a
    database with an older schema is a :class:`~cogency.errors.StorageError` saying to open it
    once for writing.

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
        lease: float = LEASE_SECONDS,
        read_only: bool = False,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            raise UsageError(
                f"PostgresStore needs a postgresql:// URL, not {redact(str(dsn))!r}"
            )
        if max_size < 1 or min_size < 0 or min_size > max_size:
            raise UsageError("the pool needs 0 <= min_size <= max_size and max_size >= 1")
        if lease <= 0:
            raise UsageError("lease must be a positive number of seconds")
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self.acquire_timeout = acquire_timeout
        self.connect_timeout = connect_timeout
        self.lock_timeout = lock_timeout
        self.command_timeout = command_timeout
        self.synchronous_commit = synchronous_commit
        self.lease = lease
        self.read_only = read_only
        self.pooled: bool | None = None
        """Whether a pooler stands between this store and PostgreSQL (found on connecting)."""
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._leases = Leases(lease, self._renew)
        self._mode = _Mode()
        self._windows = _Windows()
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
        assert self._opening is not None
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open_pool()
        return self._pool

    async def _open_pool(self) -> asyncpg.Pool:
        asyncpg = _driver()
        while True:
            pooled = bool(self.pooled)
            settings = {"application_name": "cogency", "timezone": "UTC"}
            if not pooled:
                # Statements prepared once per connection keep one generic plan, so a turn
                # is not planned again each time. Poolers refuse (PgBouncer) or drop it.
                settings["plan_cache_mode"] = "force_generic_plan"

            async def init(db: Any) -> None:
                db.mode = self._mode

            try:
                pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=self.min_size,
                    max_size=self.max_size,
                    timeout=self.connect_timeout,
                    command_timeout=self.command_timeout,
                    server_settings=settings,
                    statement_cache_size=0 if pooled else 100,
                    connection_class=_connection_class(),
                    init=init,
                    reset=_keep_session,
                )
            except Exception as exc:
                if not pooled and _refused_setting(exc):
                    log.info("PostgreSQL at %s is behind a pooler (it refused the startup "
                             "parameter plan_cache_mode)", self._where())
                    self._found(True)
                    continue
                raise self._connect_error(exc) from exc
            break
        self._found(pooled)
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

    def _found(self, pooled: bool) -> None:
        """Behind a pooler (``pooled``) statements are unnamed, parsed with each execution."""
        self.pooled = pooled
        self._mode.unnamed = pooled

    def _forget_loop(self) -> None:
        if self._pool is not None:
            try:
                self._pool.terminate()
            except RuntimeError:  # its loop is closed; the sockets close with it
                pass
        self._pool = None
        self._leases.clear()

    async def _use(
        self,
        operation: str,
        work: Callable[[_Db], Awaitable[T]],
        *,
        user: str | None = None,
        scope: str | None = None,
        write: bool = True,
        transaction: bool = True,
        idempotent: bool = False,
    ) -> T:
        """Run ``work`` on a pooled connection, in one transaction unless told otherwise,
        acting for ``user`` (row-level security) or in the named ``scope`` across users.

        Run again from the start: a deadlock victim; a transaction whose connection died before
        its COMMIT was sent (the server rolled it back, nothing of it is stored); a read, or a
        ``write=False`` statement that may safely repeat; an ``idempotent`` write (one that
        finds its own earlier landing); a statement a pooler sent where it was never prepared
        (it ran nowhere: the store turns to unnamed statements). Another write whose
        connection was lost during its COMMIT (or its single statement) is reported, never
        retried: that change may have landed.
        """
        asyncpg = _driver()
        settings = (
            user, scope, str(int(self.lock_timeout * 1000)),
            None if self.synchronous_commit is None else
            "on" if self.synchronous_commit else "off",
        )
        lost_connections = 0
        for attempt in range(_RETRIES + 1):
            pool = await self._ready()
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
            named = not self._mode.unnamed
            try:
                scoped = _Db(db, settings)
                if self.read_only:
                    async with db.transaction(readonly=True):
                        return await work(scoped)
                if not transaction:
                    committing = write  # a lone statement commits as it runs
                    return await work(scoped)
                async with db.transaction():
                    result = await work(scoped)
                    committing = write
                return result
            except asyncpg.exceptions.InvalidSQLStatementNameError as exc:
                # A prepared statement went to a server connection that never saw it: a pooler
                # in transaction mode hands out server connections per transaction. It ran
                # nowhere (its names are this client's own), so run it again, unnamed.
                if not named:
                    raise self._error(exc, operation) from exc
                if not self._mode.unnamed:
                    log.info("PostgreSQL at %s is behind a pooler (a prepared statement was "
                             "missing on its server connection)", self._where())
                    self._found(True)
                continue
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

    async def _read(self, operation: str, work: Callable[[_Db], Awaitable[T]], *,
                    user: str | None = None, scope: str | None = None) -> T:
        """One read statement (atomic by itself: no BEGIN/COMMIT round trips)."""
        return await self._use(operation, work, user=user, scope=scope, write=False,
                               transaction=False)

    def _error(
        self, exc: BaseException, operation: str, *, committing: bool = False
    ) -> CogencyError:
        """A driver error as the package's own, saying what happened to the data."""
        asyncpg = _driver()
        pooler = _pooler_problem(exc)
        if pooler is not None:
            return ConfigurationError(
                f"the pooler in front of PostgreSQL at {self._where()} refused {operation} "
                f"({exc}): {pooler}. Nothing was written."
            )
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

    def _connect_error(self, exc: BaseException) -> CogencyError:
        asyncpg = _driver()
        where = redact(self.dsn)
        pooler = _pooler_problem(exc)
        if pooler is not None:
            return ConfigurationError(
                f"the pooler in front of PostgreSQL at {where} refused the connection ({exc}): "
                f"{pooler}"
            )
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
                "your processes, put a pooler (PgBouncer) in front, or raise max_connections "
                "on the server"
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
        """Give up every task and conversation this store holds, and close the pool. Safe to
        call twice."""
        tasks, holds = dict(self._leases.tasks), dict(self._leases.holds)
        self._leases.clear()
        for runner, _ in (*tasks.values(), *holds.values()):
            abandon_runner(runner)  # over, whatever the database says
        if (tasks or holds) and self._pool is not None and not self._closed:
            try:
                await self._use(
                    "letting go of leases",
                    lambda db: db.fetch(_LET_GO, list(tasks), [r for r, _ in tasks.values()],
                                        list(holds), [r for r, _ in holds.values()]),
                    scope="leases", write=False, transaction=False,
                )
            except CogencyError as exc:  # they lapse by themselves
                log.warning("could not let go of leases on closing: %s", exc)
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- leases: tasks and conversation holds, rows renewed by this store -----------------

    async def _renew(self, tasks: Held, holds: Held) -> tuple[set[str], set[str]]:
        async def work(db: _Db) -> tuple[set[str], set[str]]:
            rows = await db.fetch(
                _RENEW, list(tasks), [r for r, _ in tasks.values()],
                [e for _, e in tasks.values()], list(holds), [r for r, _ in holds.values()],
                [e for _, e in holds.values()], self.lease,
            )
            kept = {(row["kind"], row["id"]) for row in rows}
            return ({task for task in tasks if (0, task) not in kept},
                    {conv for conv in holds if (1, conv) not in kept})

        return await self._use("renewing leases", work, scope="leases", transaction=False)

    async def claim_task(self, task_id: str, user_id: str, runner: str) -> int:
        holder = self._leases.tasks.get(task_id)
        if holder is not None and holder[0] == runner:
            return holder[1]

        async def work(db: _Db) -> Any:
            dead = None
            for _ in range(_TAKE_ATTEMPTS):
                row = await db.fetchrow(_CLAIM, task_id, user_id, runner, dead, self.lease)
                if row is None:
                    raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
                if row["taken"] is not None or row["runner"] == runner:
                    return row
                if not lease_free(row["runner"], row["lease_until"], row["now"]):
                    raise task_running(task_id, row["lease_until"])
                dead = row["runner"]  # a runner of this host whose process is gone
            raise task_running(task_id)  # others kept taking it meanwhile

        row = await self._use("claiming a task", work, user=user_id, transaction=False)
        epoch = int(row["taken"] if row["taken"] is not None else row["epoch"])
        self._leases.hold_task(task_id, runner, epoch, row["conversation_id"])
        return epoch

    async def release_task(self, task_id: str, runner: str) -> None:
        if self._leases.tasks.get(task_id, (None,))[0] == runner:
            self._leases.drop_task(task_id)
        await self._let_go("releasing a task", _RELEASE_TASK, task_id, runner)

    async def _let_go(self, operation: str, sql: _Sql, key: str, runner: str) -> None:
        """Clear ``runner``'s hold on one row (never waits; a repeat is harmless)."""
        try:
            await self._use(operation, lambda db: db.fetch(sql, key, runner),
                            scope="leases", write=False, transaction=False)
        except BaseException:
            abandon_runner(runner)  # the run is over even if its row still names it
            raise

    async def force_release(self, task_id: str, user_id: str) -> str | None:
        async def work(db: _Db) -> Any:
            row = await db.fetchrow(_FORCE_RELEASE, task_id, user_id)
            if row is not None and row["runner"]:  # its process's hold dies with it
                await db.fetch(_CLEAR_HOLD, row["conversation_id"],
                               process_of(row["runner"]) + "|")
            return row

        row = await self._use("releasing a task by force", work, user=user_id)
        if row is None:
            raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
        self._leases.drop_task(task_id)
        return cast("str | None", row["runner"])

    async def hold_conversation(self, conversation_id: str, user_id: str, runner: str, *,
                                existing: bool = False) -> None:
        async def work(db: _Db) -> int:
            dead = None
            for _ in range(_TAKE_ATTEMPTS):
                # Across users (scope "holds"): another user's conversation is "not found".
                row = await db.fetchrow(_HOLD, conversation_id, user_id, runner, dead,
                                        self.lease, existing)
                if row["owner"] != user_id and (row["owner"] is not None or existing):
                    raise NotFoundError(no_conversation(conversation_id, user_id))
                if row["taken"] is not None:
                    return int(row["taken"])
                if row["holder"] == runner:
                    return int(row["epoch"])
                if not lease_free(row["holder"], row["lease_until"], row["now"]):
                    if row["holder_user"] != user_id:  # another user's, in the making
                        raise NotFoundError(no_conversation(conversation_id, user_id))
                    raise ConversationBusyError(busy_conversation(conversation_id))
                dead = row["holder"]  # a holder of this host whose process is gone
            raise ConversationBusyError(busy_conversation(conversation_id))

        epoch = await self._use("holding a conversation", work, user=user_id, scope="holds",
                                transaction=False)
        self._leases.hold_conversation(conversation_id, runner, epoch)

    async def release_conversation(self, conversation_id: str, runner: str) -> None:
        self._leases.drop_conversation(conversation_id, runner)
        await self._let_go("releasing a conversation", _RELEASE_HOLD, conversation_id, runner)

    # -- API keys (found before their user is known: scope "api_keys") --------------------

    async def create_api_key(self, key: ApiKeyRecord) -> None:
        driver = _driver()

        async def work(db: _Db) -> None:
            try:
                await db.fetch(
                    _CREATE_KEY, key.key_id, key.user_id, key.key_hash, key.name,
                    key.created_at or _time.now(),
                )
            except driver.exceptions.UniqueViolationError as exc:
                raise ConflictError(f"an API key {key.key_id!r} exists already") from exc

        await self._use("creating an API key", work, user=key.user_id)

    async def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        async def work(db: _Db) -> ApiKeyRecord | None:
            row = await db.fetchrow(_FIND_KEY, key_id)
            return None if row is None else api_key_record(row)

        return await self._read("checking an API key", work, scope="api_keys")

    async def list_api_keys(self, user_id: str | None = None) -> list[ApiKeyRecord]:
        async def work(db: _Db) -> list[ApiKeyRecord]:
            rows = await (db.fetch(_ALL_KEYS) if user_id is None
                          else db.fetch(_USERS_KEYS, user_id))
            return [api_key_record(row) for row in rows]

        if user_id is None:  # every user's (`cogency keys list`)
            return await self._read("listing API keys", work, scope="api_keys")
        return await self._read("listing API keys", work, user=user_id)

    async def revoke_api_key(self, key_id: str) -> ApiKeyRecord:
        async def work(db: _Db) -> ApiKeyRecord:
            row = await db.fetchrow(_REVOKE_KEY, key_id, _time.now())
            if row is None:
                raise NotFoundError(f"no API key {key_id!r} (`cogency keys list` lists them)")
            return api_key_record(row)

        return await self._use("revoking an API key", work, scope="api_keys",
                               transaction=False)

    # -- idempotency keys of the HTTP service ----------------------------------------------

    async def claim_request(self, record: RequestRecord, *, replace: bool = False
                            ) -> RequestRecord | None:
        async def work(db: _Db) -> RequestRecord | None:
            # Expired rows go (a few at a time, so no claim ever waits on a big sweep).
            await db.fetch(_SWEEP_REQUESTS, record.user_id)
            row = await db.fetchrow(
                _CLAIM_REQUEST, record.user_id, record.key, record.request, record.task_id,
                record.conversation_id,
                None if record.outcome is None else dumps(record.outcome), record.expires_at,
                replace,
            )
            if row is not None:
                return None
            found = await db.fetchrow(_FIND_REQUEST, record.user_id, record.key)
            return None if found is None else _request(found)

        return await self._use("claiming an idempotency key", work, user=record.user_id)

    async def settle_request(self, user_id: str, key: str, *, task_id: str | None = None,
                             conversation_id: str | None = None,
                             outcome: dict[str, Any] | None = None) -> None:
        async def work(db: _Db) -> None:
            await db.fetch(_SETTLE_REQUEST, user_id, key, task_id, conversation_id,
                           None if outcome is None else dumps(outcome))

        await self._use("recording an idempotency key's run", work, user=user_id,
                        transaction=False, idempotent=True)

    async def drop_request(self, user_id: str, key: str) -> None:
        async def work(db: _Db) -> None:
            await db.fetch(_DROP_REQUEST, user_id, key)

        await self._use("dropping an idempotency key", work, user=user_id, transaction=False,
                        idempotent=True)

    # -- tasks ----------------------------------------------------------------------------

    async def begin_task(
        self,
        task: TaskRecord,
        conversation_data: dict[str, Any],
        messages: Sequence[dict[str, Any]] = (),
        history_tokens: int | None = None,
    ) -> ConversationRecord:
        driver = _driver()
        cached = self._windows.get(task.conversation_id, history_tokens)
        known = cached.last_seq if cached else 0
        hold = self._leases.holds.get(task.conversation_id) if task.runner else None

        async def work(db: _Db) -> list[Any]:
            stamp = _time.now()
            for attempt in range(2):
                try:
                    rows = await db.fetch(
                        _BEGIN, task.user_id, dumps(Profile(task.user_id).to_dict()), stamp,
                        task.conversation_id, dumps(conversation_data), task.task_id,
                        _put_text(task.query), dumps(task.workspace), task.version,
                        task.runner, 1 if task.runner else 0,
                        self.lease if task.runner else None,
                        [m["role"] for m in messages],
                        [_put_text(m["content"]) for m in messages],
                        [m.get("task_id") for m in messages],
                        [m.get("tokens", 0) for m in messages],
                        [m.get("created_at") or stamp.isoformat() for m in messages],
                        [m.get("id") for m in messages],
                        known, 0 if history_tokens is None else _MESSAGE_BATCH,
                        dumps(task.settings), None if hold is None else hold[1],
                        _turns(messages),
                    )
                except driver.exceptions.UniqueViolationError as exc:
                    if exc.constraint_name != "conversations_pkey":
                        raise ConflictError(
                            f"task {task.task_id!r} already exists; start tasks with a new id"
                        ) from exc
                    if attempt:  # there, yet not visible to this user: another user's
                        raise NotFoundError(
                            no_conversation(task.conversation_id, task.user_id)) from exc
                    continue  # another process created this new conversation meanwhile
                if any(row["kind"] == 3 for row in rows):
                    raise NotFoundError(no_conversation(task.conversation_id, task.user_id))
                if any(row["kind"] == 4 for row in rows):
                    raise hold_lost(task.conversation_id)
                if any(row["kind"] == 0 for row in rows):
                    return rows
            raise ConflictError(
                f"conversation {task.conversation_id!r} kept changing while starting a task; "
                "nothing was written: retry"
            )

        rows = await self._use("starting a task", work, user=task.user_id, transaction=False)
        head = next(row for row in rows if row["kind"] == 0)
        for offset, message in enumerate(messages, start=1):
            message["seq"] = head["seq"] + offset
        conversation = ConversationRecord(
            task.conversation_id, task.user_id,
            decode(head["data"], "conversations", task.conversation_id, "conversation_data"),
            head["seq"] + len(messages), head["updated"],
        )
        if task.runner is not None:
            self._leases.hold_task(task.task_id, task.runner, 1, task.conversation_id)
        if history_tokens is not None:
            recent, counts = self._windows.update(
                task.conversation_id, history_tokens, cached, rows, messages
            )
            if recent is None:
                recent, counts = self._windows.loaded(
                    task.conversation_id, history_tokens,
                    await self.load_messages(task.conversation_id, task.user_id,
                                             token_budget=history_tokens),
                )
            conversation.recent = recent
            if counts:  # rare: a statement of its own, once per window counted exactly
                seqs, exact, bounds = (list(column) for column in zip(*counts))
                try:
                    await self._use(
                        "storing messages' exact token counts",
                        lambda db: db.fetch(_RECOUNTED, task.conversation_id, seqs, exact,
                                            bounds),
                        user=task.user_id, transaction=False, idempotent=True,
                    )
                except StorageError as exc:
                    # The bounds stay, as true as before; the task goes on, and a later start
                    # counts the window again.
                    log.warning("storing exact token counts failed: %s", exc)
        return conversation

    async def load_task_messages(self, task_id: str, user_id: str) -> list[dict[str, Any]]:
        async def work(db: _Db) -> list[dict[str, Any]]:
            return [_message(row) for row in await db.fetch(_TASK_MESSAGES, task_id, user_id)]

        return await self._read("loading a task's messages", work, user=user_id)

    async def load_task(self, task_id: str, user_id: str) -> TaskRecord:
        async def work(db: _Db) -> TaskRecord:
            row = await db.fetchrow(_LOAD_TASK, task_id, user_id)
            if row is None:
                raise NotFoundError(_no_task(task_id, user_id))
            task = task_record(row, _get_text)
            task.pending_approvals = (await _approvals(db, [task_id], "pending")).get(task_id, [])
            return task

        return await self._use("loading a task", work, user=user_id, write=False)

    async def list_tasks(self, user_id: str | None = None) -> list[TaskRecord]:
        async def work(db: _Db) -> list[TaskRecord]:
            rows = await (db.fetch(_ALL_TASKS) if user_id is None
                          else db.fetch(_USERS_TASKS, user_id))
            tasks = [task_record(row, _get_text) for row in rows]
            waiting = await _approvals(db, [task.task_id for task in tasks], "pending")
            for task in tasks:
                task.pending_approvals = waiting.get(task.task_id, [])
            return tasks

        if user_id is None:  # every user's (the CLI's `cogency tasks`)
            return await self._use("listing tasks", work, scope="all_tasks", write=False)
        return await self._use("listing tasks", work, user=user_id, write=False)

    async def load_approvals(
        self, task_id: str, user_id: str, status: str | None = None
    ) -> list[dict[str, Any]]:
        async def work(db: _Db) -> list[dict[str, Any]]:
            await _owned_task(db, task_id, user_id)
            return (await _approvals(db, [task_id], status)).get(task_id, [])

        return await self._use("loading approvals", work, user=user_id, write=False)

    async def decide_approvals(
        self, task_id: str, user_id: str, decisions: Mapping[str, bool | str]
    ) -> list[dict[str, Any]]:
        async def work(db: _Db) -> list[dict[str, Any]]:
            await _owned_task(db, task_id, user_id)
            # Locks the task's calls: a second decider waits, then sees them decided.
            rows = await db.fetch(_LOCK_APPROVALS, task_id, user_id)
            updates = check_decisions(task_id, {row[0]: (row[1], row[2]) for row in rows},
                                      decisions)
            stamp = _time.stamp()
            await db.executemany(
                _DECIDE,
                [(status, _put_text(output) if output is not None else None, stamp, task_id,
                  call_id) for status, output, call_id in updates],
            )
            decided = (await _approvals(db, [task_id])).get(task_id, [])
            return [call for call in decided if call["id"] in decisions]

        return await self._use("deciding approvals", work, user=user_id)

    async def start_approvals(self, task_id: str, user_id: str, call_ids: Sequence[str]) -> None:
        async def work(db: _Db) -> None:
            started = await db.fetchval(_START_APPROVALS, task_id, user_id, list(call_ids))
            if started != len(set(call_ids)):
                raise ConflictError(
                    f"calls {', '.join(call_ids)} of task {task_id!r} are not all approved and "
                    "waiting to run (another runner may have started them); nothing was started"
                )

        await self._use("starting approved calls", work, user=user_id)

    async def save(self, batch: SaveBatch) -> int:
        fence = self._leases.fence(batch.task_id)
        hold = None if fence is None else fence[1]
        check = batch.workspace is not None or batch.complete or batch.epoch is not None \
            or hold is not None
        messages = batch.messages

        async def work(db: _Db) -> int:
            # One statement, so one round trip and atomic without BEGIN/COMMIT: the fences, the
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
                    learning, hold, _turns(messages),
                )
                if any(row["kind"] == 0 for row in rows):
                    break
                if any(row["kind"] == 3 for row in rows):
                    raise hold_lost(batch.conversation_id)
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
            return int(next(row["seq"] for row in rows if row["kind"] == 0))

        # A completion with memory on queues its task for learning in the same statement.
        learning = None
        if batch.complete and batch.learn:
            learning = dumps(learning_ref(batch, _time.stamp()))
        # A step that pauses for approval, or settles decided calls, also writes
        # task_approvals, and a profile given to save is written through its entries: one
        # transaction then, so all of it lands or none.
        together = bool(batch.approvals or batch.settled) and not batch.complete \
            or batch.profile is not None
        if not batch.complete:
            return await self._use("saving a task", work, user=batch.user_id, idempotent=True,
                                   transaction=together)
        try:
            return await self._use("completing a task", work, user=batch.user_id,
                                   transaction=together, idempotent=True)
        finally:
            # A completed task needs no runner; one whose completion failed is released by
            # its runner.
            self._leases.drop_task(batch.task_id)

    # -- conversations --------------------------------------------------------------------

    async def load_conversation(self, conversation_id: str, user_id: str) -> ConversationRecord:
        async def work(db: _Db) -> ConversationRecord:
            row = await db.fetchrow(_LOAD_CONVERSATION, conversation_id, user_id)
            if row is None:
                raise NotFoundError(no_conversation(conversation_id, user_id))
            return conversation_record(row)

        return await self._read("loading a conversation", work, user=user_id)

    async def list_conversations(
        self, user_id: str, *, limit: int | None = None
    ) -> list[ConversationRecord]:
        async def work(db: _Db) -> list[ConversationRecord]:
            rows = await db.fetch(_LIST_CONVERSATIONS, user_id, limit)
            return [conversation_record(row) for row in rows]

        return await self._read("listing conversations", work, user=user_id)

    async def find_conversation_by_turns(self, user_id: str, digest: str) -> str | None:
        async def work(db: _Db) -> str | None:
            return cast("str | None", await db.fetchval(_BY_TURNS, user_id, digest))

        return await self._read("finding a conversation by its turns", work, user=user_id)

    async def load_messages(
        self,
        conversation_id: str,
        user_id: str,
        *,
        token_budget: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        async def work(db: _Db) -> list[dict[str, Any]]:
            # Newest first, a page at a time: a long history is read only as far as the window
            # reaches, and the usual window takes one round trip. Messages are only appended,
            # so pages by seq need no snapshot.
            fit = Newest(token_budget, limit)
            below = None
            page = _MESSAGE_BATCH if limit is None else max(1, min(limit + 1, _MESSAGE_BATCH))
            while True:
                rows = await db.fetch(_PAGE, conversation_id, user_id, below, page)
                if not rows:
                    raise NotFoundError(no_conversation(conversation_id, user_id))
                for row in rows:
                    if row[0] is None:
                        return fit.picked[::-1]  # the conversation has no more messages
                    if not fit.take(_message(row)):
                        return fit.picked[::-1]
                if len(rows) < page:
                    return fit.picked[::-1]
                below = fit.picked[-1]["seq"]

        return await self._read("loading messages", work, user=user_id)

    # -- profiles -------------------------------------------------------------------------

    async def load_profile(self, user_id: str) -> Profile | None:
        async def work(db: _Db) -> Profile | None:
            text = await db.fetchval(_LOAD_PROFILE, user_id)
            return None if text is None else decode_profile(text, user_id)

        return await self._read("loading a profile", work, user=user_id)

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
        async def work(db: _Db) -> ProfileBook:
            if generation is not None:
                # Locks the user's generation row (made if missing) until commit; forget_user
                # takes the same lock first, so one of the two waits for the other to finish,
                # and the value read here is the latest committed one.
                now = await db.fetchval(_LOCK_GENERATION, generation_key(user_id))
                if now != generation:
                    raise ForgottenError(user_id)
            queued = None
            if claim is not None:
                row = await db.fetchrow(_LOCK_LEARNING, claim.user_id)
                if row is None or row["holder"] != claim.holder:
                    raise claim_lost(claim)
                queued = queued_tasks(row["tasks"], claim.user_id)  # besides the claim's
            stamp = _time.now()
            book = await _change_profile(db, user_id, change, stamp)
            if queued:  # the claim's tasks are learned: off the queue, the rest waits
                await db.fetch(_FINISH_LEARNING, user_id, stamp.isoformat())
            elif queued is not None:
                await db.fetch(_DROP_LEARNING, user_id)
            return book

        return await self._use("updating a profile", work, user=user_id)

    async def load_entries(self, user_id: str, *, history: bool = False) -> list[ProfileEntry]:
        async def work(db: _Db) -> list[ProfileEntry]:
            return await _entries(db, user_id, history=history)

        return await self._read("loading profile entries", work, user=user_id)

    async def forget_user(self, user_id: str) -> ForgetReceipt:
        async def work(db: _Db) -> ForgetReceipt:
            # First: from here on, learning that began before waits for this transaction and
            # then sees the new generation (see change_profile).
            generation = await db.fetchval(_BUMP_GENERATION, generation_key(user_id))
            receipt = ForgetReceipt(user_id, int(generation))
            # In the order completions and learning lock these rows (conversations, then the
            # learning queue, then the profile), so none of them deadlocks with a forget.
            # Messages and workspaces go with their conversations (ON DELETE CASCADE); the
            # explicit deletes also cover rows written before the cascades existed, and count.
            for kind, statement in _FORGET:
                gone = await db.fetchval(statement, user_id)
                if kind:
                    setattr(receipt, kind, int(gone))
            queued = await db.fetchrow(_FORGET_LEARNING, user_id)
            receipt.pending_learning = (0 if queued is None
                                        else pending_count(*queued, user_id=user_id))
            for kind, statement in _FORGET_PROFILE:
                setattr(receipt, kind, int(await db.fetchval(statement, user_id)))
            return receipt

        receipt = await self._use("forgetting a user", work, user=user_id)
        self._windows.clear()
        return receipt

    # -- learning as durable work ---------------------------------------------------------

    async def claim_learning(
        self, holder: str, *, user_id: str | None = None, limit: int = 1,
        batch: int = LEARN_BATCH, lease: float = LEARN_LEASE,
    ) -> list[LearningClaim]:
        async def work(db: _Db) -> list[LearningClaim]:
            now = _time.now()
            stamp = now.isoformat()
            # SKIP LOCKED: a row another transaction writes (a completion queueing a task,
            # another claim) is left for the next sweep instead of waited for.
            if user_id is None:
                rows = await db.fetch(_DUE_LEARNING, stamp, limit + 50)
            else:
                rows = await db.fetch(_USERS_LEARNING, stamp, user_id)
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
                await db.fetch(_TAKE_LEARNING, user, dumps(left), dumps(taken), holder, until)
                claims.append(LearningClaim(user, holder, taken, row["attempts"],
                                            row["dropped"]))
            return claims

        if user_id is None:  # any user's (the sweep): only the learning queue, across users
            return await self._use("claiming learning", work, scope="learning")
        return await self._use("claiming learning", work, user=user_id)

    async def release_learning(
        self, claim: LearningClaim, *, error: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        async def work(db: _Db) -> None:
            row = await db.fetchrow(_HELD_LEARNING, claim.user_id, claim.holder)
            if row is None:
                return  # no longer held: nothing of it is ours
            tasks = [*queued_tasks(row["claimed"], claim.user_id),
                     *queued_tasks(row["tasks"], claim.user_id)]
            await db.fetch(
                _RELEASE_LEARNING, claim.user_id, dumps(tasks), 1 if error is not None else 0,
                None if error is None else _put_text(error),
                (retry_at or _time.now()).isoformat(), _time.stamp(),
            )

        await self._use("releasing learning", work, user=claim.user_id)

    async def learning_status(self, user_id: str) -> LearningStatus | None:
        async def work(db: _Db) -> LearningStatus | None:
            row = await db.fetchrow(_LEARNING_STATUS, user_id)
            if row is None:
                return None
            values = list(row)
            values[4] = None if values[4] is None else _get_text(values[4])
            return learning_status_of(values, user_id, _time.stamp())

        return await self._read("reading a user's learning", work, user=user_id)

    async def prune_history(self, before: datetime, user_id: str | None = None) -> int:
        async def work(db: _Db) -> int:
            return int(await db.fetchval(_PRUNE_HISTORY, before.isoformat(), user_id))

        if user_id is None:  # every user's (the sweep): only profile entries, across users
            return await self._use("pruning profile history", work, scope="history",
                                   transaction=False)
        return await self._use("pruning profile history", work, user=user_id,
                               transaction=False)

    # -- export and import ----------------------------------------------------------------

    async def export_user(self, user_id: str) -> UserData:
        async def work(db: _Db) -> UserData:
            # One snapshot of everything the user has (the transaction's first statement).
            await db.connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return await _export(db, user_id)

        return await self._use("exporting a user", work, user=user_id, write=False)

    async def import_user(self, data: UserData) -> None:
        driver = _driver()

        async def work(db: _Db) -> None:
            writing: list[str | None] = [None]  # the id of the row being written
            try:
                await _import(db, data, _time.now(), writing)
            except driver.exceptions.UniqueViolationError as exc:
                # Ids are unique across users, and this user holds nothing (checked first):
                # the id is another user's, invisible here (row-level security).
                kind = _TAKEN.get(exc.constraint_name or "")
                if kind is None:
                    raise
                raise import_taken(data.user_id, kind, writing[0]) from exc

        await self._use("importing a user", work, user=data.user_id)
        self._windows.clear()

    async def delete_conversation(self, conversation_id: str, user_id: str) -> None:
        async def work(db: _Db) -> None:
            if await db.fetchval(_LOCK_CONVERSATION, conversation_id, user_id) is None:
                return
            for statement in _DELETE_CONVERSATION:
                await db.fetch(statement, conversation_id)

        await self._use("deleting a conversation", work, user=user_id, idempotent=True)
        self._windows.drop(conversation_id)

    async def find_call(self, user_id: str, call_id: str) -> str | None:
        async def work(db: _Db) -> str | None:
            return cast("str | None", await db.fetchval(_FIND_CALL, user_id, call_id))

        return await self._read("finding a waiting call", work, user=user_id)

    async def user_generation(self, user_id: str) -> int:
        async def work(db: _Db) -> int:
            value = await db.fetchval(_GENERATION, generation_key(user_id))
            return 0 if value is None else int(value)

        return await self._read("reading a user's generation", work, user=user_id)


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
    ) -> tuple[History | None, list[tuple[int, int, int]]]:
        """The window after ``begin_task`` stored ``added``, from the cached one and the newer
        ``rows``; ``None`` when it cannot be told from them (read it afresh). With it, the
        exact counts to store in place of bounds (``recounted``)."""
        newer = sorted((_message(tuple(row)[1:8]) for row in rows if row["kind"] == 1),
                       key=lambda message: -message["seq"])  # newest first
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
            return None, []
        last_seq, last_stamp = (
            (fresh[-1]["seq"], fresh[-1].get("created_at") or "") if fresh else (0, ""))
        if cached is not None:
            stored = counts_held(cached, fresh) if fresh else {}
            entry = cached.advanced(fresh, last_seq, last_stamp) if fresh else cached
        else:
            entry = Window.newest(budget, reversed(fresh), last_seq, last_stamp)
            if len(entry.messages) == len(fresh) and len(newer) >= _MESSAGE_BATCH:
                return None, []  # older messages may still fit: the caller reads them
            stored = {message["seq"]: message["tokens"] for message in fresh}
        return self.put(conversation_id, entry), recounted(stored, entry)

    def loaded(self, conversation_id: str, budget: int, messages: list[dict[str, Any]]
               ) -> tuple[History, list[tuple[int, int, int]]]:
        """Keep the window ``load_messages`` read (``messages``, oldest first); with it, the
        exact counts to store in place of bounds (``recounted``)."""
        if not messages:  # not even the newest fits: nothing to validate a cache with
            return History(), []
        newest = messages[-1]
        stored = {message["seq"]: message["tokens"] for message in messages}
        entry = Window.newest(budget, reversed(messages), newest["seq"],
                              newest.get("created_at") or "")
        return self.put(conversation_id, entry), recounted(stored, entry)




# -- statements (each a _Sql: it sets its scope and settings first) ------------------------

_TASK_COLUMNS = (
    "SELECT task_id, user_id, conversation_id, query, workspace_data::text, version, runner, "
    "updated_at, epoch, settings FROM task_workspaces"
)
_CONVERSATION_COLUMNS = (
    "SELECT conversation_id, user_id, conversation_data::text, message_count, updated_at "
    "FROM conversations"
)
_KEY_COLUMNS = "SELECT key_id, user_id, key_hash, name, created_at, revoked_at FROM api_keys"
_LEASE_END = "now() + make_interval(secs => {}::float8)"
"""When a lease taken now lapses, by the server's clock (one clock for every host)."""

_LOAD_TASK = _Sql(_TASK_COLUMNS + " WHERE " + _TASK_KEY)
_USERS_TASKS = _Sql(_TASK_COLUMNS + " WHERE user_id = $1", order="updated_at, task_id")
_ALL_TASKS = _Sql(_TASK_COLUMNS, order="updated_at, task_id")
_OWNED = _Sql("SELECT 1 AS owned FROM task_workspaces WHERE " + _TASK_KEY)
_TASK_MESSAGES = _Sql(
    "SELECT m.seq, m.role, m.content, m.task_id, m.tokens, m.created_at, m.message_id "
    "FROM conversation_messages m JOIN conversations c USING (conversation_id) "
    "WHERE m.task_id = $1 AND c.user_id = $2",
    order="seq",
)
_APPROVALS = _Sql(
    f"SELECT {APPROVAL_COLUMNS.replace('call_data', 'call_data::text')}, position "
    "FROM task_approvals WHERE task_id = ANY($1::text[]) "
    "AND ($2::text IS NULL OR status = $2::text)",
    order="task_id, position",
)
_LOCK_APPROVALS = _Sql(
    "SELECT call_id, status, decider FROM task_approvals WHERE " + _TASK_KEY + " FOR UPDATE")
_DECIDE = _Sql(
    "UPDATE task_approvals SET status = $1, output = $2, decided_at = $3 "
    "WHERE task_id = $4 AND call_id = $5 AND status = 'pending' RETURNING 1 AS decided")
_START_APPROVALS = _Sql(
    "SELECT count(*) FROM started",
    ctes="started AS (UPDATE task_approvals SET status = 'running' WHERE " + _TASK_KEY
    + " AND call_id = ANY($3::text[]) AND status = 'approved' RETURNING 1)",
)
_LAST_POSITION = _Sql(
    "SELECT COALESCE(MAX(position), 0) FROM task_approvals WHERE task_id = $1")
_ADD_APPROVAL = _Sql(
    # ON CONFLICT: a save retried after an unknown outcome stores each call once.
    "INSERT INTO task_approvals (task_id, call_id, user_id, position, call_data, "
    "status, created_at, decider) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7) "
    "ON CONFLICT (task_id, call_id) DO NOTHING RETURNING 1 AS added")
_SETTLE = _Sql(
    "SELECT count(*) FROM settled",
    ctes="settled AS (UPDATE task_approvals SET status = 'done' WHERE task_id = $1 "
    "AND call_id = ANY($2::text[]) RETURNING 1)",
)
_SAVE_STATE = _Sql("SELECT version, epoch, last_save FROM task_workspaces WHERE " + _TASK_KEY)
_STORED = _Sql(
    "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 "
    "AND message_id = ANY($2::text[])")

_CLAIM = _Sql(
    # The task's holder before (row absent: not this user's task) and the epoch taken, when
    # it was free: no runner, a lapsed lease, or $4, a holder the caller found dead.
    "SELECT old.runner, old.epoch, old.lease_until, old.conversation_id, "
    "(SELECT epoch FROM taken) AS taken, now() AS now FROM old",
    ctes="old AS (SELECT task_id, runner, epoch, lease_until, conversation_id "
    "FROM task_workspaces WHERE " + _TASK_KEY + " FOR UPDATE), "
    "taken AS (UPDATE task_workspaces t SET runner = $3, epoch = t.epoch + 1, "
    "lease_until = " + _LEASE_END.format("$5") + " FROM old WHERE t.task_id = old.task_id "
    "AND old.runner IS DISTINCT FROM $3 AND (old.runner IS NULL OR old.runner = $4::text "
    "OR old.lease_until IS NULL OR old.lease_until <= now()) RETURNING t.epoch)",
)
_RELEASE_TASK = _Sql(
    "UPDATE task_workspaces SET runner = NULL, lease_until = NULL "
    "WHERE task_id = (SELECT task_id FROM task_workspaces WHERE task_id = $1 "
    "AND runner = $2 FOR UPDATE SKIP LOCKED) RETURNING 1 AS released")  # never waits to let go
_FORCE_RELEASE = _Sql(
    "SELECT old.runner, old.conversation_id FROM old, moved",
    ctes="old AS (SELECT task_id, runner, conversation_id FROM task_workspaces "
    "WHERE " + _TASK_KEY + " FOR UPDATE), "
    "moved AS (UPDATE task_workspaces t SET runner = NULL, lease_until = NULL, "
    "epoch = t.epoch + 1 FROM old WHERE t.task_id = old.task_id RETURNING 1)",
)
_CLEAR_HOLD = _Sql(
    # The conversation's hold, if a run of process $2 (its runner's prefix) has it.
    "UPDATE conversation_runs SET runner = NULL, lease_until = NULL, epoch = epoch + 1 "
    "WHERE conversation_id = $1 AND left(runner, length($2::text)) = $2::text "
    "RETURNING 1 AS cleared")
_HOLD = _Sql(
    # The conversation's owner, the hold taken (its epoch) when it was free (no runner, a
    # lapsed lease, or $4, a holder the caller found dead) and not another user's (nor, with
    # $6, missing), and the holder before.
    "SELECT (SELECT user_id FROM owner) AS owner, (SELECT epoch FROM taken) AS taken, "
    "old.user_id AS holder_user, old.runner AS holder, old.epoch, old.lease_until, "
    "now() AS now FROM (SELECT 1) one LEFT JOIN old ON true",
    ctes="owner AS (SELECT user_id FROM conversations WHERE conversation_id = $1), "
    "old AS (SELECT user_id, runner, epoch, lease_until FROM conversation_runs "
    "WHERE conversation_id = $1 FOR UPDATE), "
    "taken AS (INSERT INTO conversation_runs AS r (conversation_id, user_id, runner, epoch, "
    "lease_until, started_at) SELECT $1, $2, $3, 1, " + _LEASE_END.format("$5") + ", now() "
    "WHERE NOT EXISTS (SELECT 1 FROM owner WHERE user_id <> $2) "
    "AND (NOT $6::boolean OR EXISTS (SELECT 1 FROM owner)) "  # $6: it must exist already
    "ON CONFLICT (conversation_id) DO UPDATE SET user_id = excluded.user_id, "
    "runner = excluded.runner, epoch = r.epoch + 1, lease_until = excluded.lease_until, "
    "started_at = excluded.started_at WHERE r.runner IS NULL OR r.runner = $4::text "
    "OR r.lease_until IS NULL OR r.lease_until <= now() RETURNING r.epoch)",
)
_RECOUNTED = _Sql(  # messages' exact counts in place of the upper bounds they were stored with
    "UPDATE conversation_messages m SET tokens = c.tokens "
    "FROM unnest($2::int[], $3::int[], $4::int[]) AS c(seq, tokens, bound) "
    "WHERE m.conversation_id = $1 AND m.seq = c.seq AND m.tokens = c.bound RETURNING m.seq")
_RELEASE_HOLD = _Sql(
    "UPDATE conversation_runs SET runner = NULL, lease_until = NULL "
    "WHERE conversation_id = $1 AND runner = $2 RETURNING 1 AS released")
_RENEW = _Sql(
    # Extends the leases still held as given (task ids, runners, epochs; then conversations');
    # returns those extended (kind 0 tasks, kind 1 conversations).
    "SELECT 0 AS kind, task_id AS id FROM t UNION ALL SELECT 1, conversation_id FROM c",
    ctes="t AS (UPDATE task_workspaces w SET lease_until = " + _LEASE_END.format("$7")
    + " FROM unnest($1::text[], $2::text[], $3::int[]) AS h(task_id, runner, epoch) "
    "WHERE w.task_id = h.task_id AND w.runner = h.runner AND w.epoch = h.epoch "
    "RETURNING w.task_id), "
    "c AS (UPDATE conversation_runs r SET lease_until = " + _LEASE_END.format("$7")
    + " FROM unnest($4::text[], $5::text[], $6::int[]) AS h(conversation_id, runner, epoch) "
    "WHERE r.conversation_id = h.conversation_id AND r.runner = h.runner "
    "AND r.epoch = h.epoch RETURNING r.conversation_id)",
)

_LET_GO = _Sql(
    "SELECT (SELECT count(*) FROM t) + (SELECT count(*) FROM c) AS released",
    ctes="t AS (UPDATE task_workspaces w SET runner = NULL, lease_until = NULL "
    "FROM unnest($1::text[], $2::text[]) AS h(task_id, runner) "
    "WHERE w.task_id = h.task_id AND w.runner = h.runner RETURNING 1), "
    "c AS (UPDATE conversation_runs r SET runner = NULL, lease_until = NULL "
    "FROM unnest($3::text[], $4::text[]) AS h(conversation_id, runner) "
    "WHERE r.conversation_id = h.conversation_id AND r.runner = h.runner RETURNING 1)",
)

_CREATE_KEY = _Sql(
    "INSERT INTO api_keys (key_id, user_id, key_hash, name, created_at) "
    "VALUES ($1, $2, $3, $4, $5) RETURNING 1 AS created")
_FIND_KEY = _Sql(_KEY_COLUMNS + " WHERE key_id = $1")
_USERS_KEYS = _Sql(_KEY_COLUMNS + " WHERE user_id = $1", order="created_at, key_id")
_ALL_KEYS = _Sql(_KEY_COLUMNS, order="created_at, key_id")
_REVOKE_KEY = _Sql(
    "SELECT k.key_id, k.user_id, k.key_hash, k.name, k.created_at, "
    "COALESCE(k.revoked_at, r.revoked_at) AS revoked_at FROM api_keys k "
    "LEFT JOIN revoked r USING (key_id) WHERE k.key_id = $1",
    ctes="revoked AS (UPDATE api_keys SET revoked_at = $2 WHERE key_id = $1 "
    "AND revoked_at IS NULL RETURNING key_id, revoked_at)",
)

_LOAD_CONVERSATION = _Sql(
    _CONVERSATION_COLUMNS + " WHERE conversation_id = $1 AND user_id = $2")
_LIST_CONVERSATIONS = _Sql(
    _CONVERSATION_COLUMNS + " WHERE user_id = $1 "
    "ORDER BY updated_at DESC, conversation_id LIMIT $2",
    order="updated_at DESC, conversation_id",
)
_BY_TURNS = _Sql(
    "SELECT conversation_id FROM conversations WHERE user_id = $1 AND turns_digest = $2 "
    "ORDER BY updated_at DESC, conversation_id LIMIT 1")
_PAGE = _Sql(
    # The conversation's row (so a missing or foreign one is told apart from an empty one)
    # and up to $4 of its messages below seq $3, newest first.
    "SELECT m.seq, m.role, m.content, m.task_id, m.tokens, m.created_at, m.message_id "
    "FROM conversations c LEFT JOIN LATERAL (SELECT seq, role, content, task_id, tokens, "
    "created_at, message_id "
    "FROM conversation_messages WHERE conversation_id = c.conversation_id "
    "AND ($3::int IS NULL OR seq < $3::int) ORDER BY seq DESC LIMIT $4) m ON true "
    "WHERE c.conversation_id = $1 AND c.user_id = $2",
    order="seq DESC",
)

_LOAD_PROFILE = _Sql("SELECT profile_data::text FROM user_profiles WHERE user_id = $1")
_LOCK_PROFILE = _Sql(
    "SELECT profile_data::text FROM user_profiles WHERE user_id = $1 FOR UPDATE")
_CREATE_PROFILE = _Sql(
    "SELECT profile_data::text FROM created",
    ctes="created AS (INSERT INTO user_profiles (user_id, profile_data, updated_at) "
    "VALUES ($1, $2, $3) ON CONFLICT (user_id) DO NOTHING RETURNING profile_data)",
)
_PUT_PROFILE = _Sql(
    "INSERT INTO user_profiles (user_id, profile_data, updated_at) VALUES ($1, $2, $3) "
    "ON CONFLICT (user_id) DO UPDATE SET profile_data = excluded.profile_data, "
    "updated_at = excluded.updated_at RETURNING 1 AS put")
_GENERATION = _Sql("SELECT generation FROM user_generations WHERE user_key = $1")
_LOCK_GENERATION = _Sql(
    "INSERT INTO user_generations (user_key, generation) VALUES ($1, 0) "
    "ON CONFLICT (user_key) DO UPDATE SET generation = user_generations.generation "
    "RETURNING generation")
_BUMP_GENERATION = _Sql(
    "INSERT INTO user_generations (user_key, generation) VALUES ($1, 1) "
    "ON CONFLICT (user_key) DO UPDATE SET generation = user_generations.generation + 1 "
    "RETURNING generation")
def _deleting(what: str) -> _Sql:
    """Delete ``FROM what`` ($1 the user), counting the rows (a forget's receipt)."""
    return _Sql("SELECT count(*) FROM gone", ctes=f"gone AS (DELETE FROM {what} RETURNING 1)")


_FORGET = (
    # (receipt kind, statement), in the order completions and learning take these locks.
    ("messages", _deleting("conversation_messages WHERE conversation_id IN "
                           "(SELECT conversation_id FROM conversations WHERE user_id = $1)")),
    ("approvals", _deleting("task_approvals WHERE user_id = $1")),
    ("tasks", _deleting("task_workspaces WHERE user_id = $1")),
    (None, _deleting("conversation_runs WHERE user_id = $1")),
    ("conversations", _deleting("conversations WHERE user_id = $1")),
    (None, _deleting("idempotency_keys WHERE user_id = $1")),
)
_FORGET_LEARNING = _Sql(
    "DELETE FROM learning_queue WHERE user_id = $1 RETURNING tasks, claimed")
_FORGET_PROFILE = (
    ("entries", _deleting("profile_entries WHERE user_id = $1 AND superseded_at IS NULL")),
    ("history", _deleting("profile_entries WHERE user_id = $1")),  # what is left: history
    ("profiles", _deleting("user_profiles WHERE user_id = $1")),
)

# -- profile entries and the learning queue (migrations m014, m015) --------------------------

_INSERT_ENTRY_TEXT = (
    f"INSERT INTO profile_entries ({ENTRY_COLUMNS}) VALUES "
    f"({', '.join(f'${n}' for n in range(1, 16))})"
)
_INSERT_ENTRY = _Sql(_INSERT_ENTRY_TEXT + " RETURNING 1 AS added")
_UPDATE_ENTRY = _Sql(
    "UPDATE profile_entries SET " + ENTRY_UPDATE.format(*(f"${n}" for n in range(1, 8)))
    + " WHERE entry_id = $8 AND user_id = $9 RETURNING 1 AS changed")
_ENTRIES = _Sql(
    f"SELECT {ENTRY_COLUMNS} FROM profile_entries WHERE user_id = $1 "
    "AND superseded_at IS NULL", order="rank")
_ALL_ENTRIES = _Sql(
    f"SELECT {ENTRY_COLUMNS} FROM profile_entries WHERE user_id = $1", order="created_at, rank")
_PRUNE_HISTORY = _deleting(
    "profile_entries WHERE superseded_at IS NOT NULL AND superseded_at < $1 "
    "AND ($2::text IS NULL OR user_id = $2::text)")

_LEARNING_COLUMNS = (
    "SELECT user_id, tasks, claimed, dropped, attempts, holder, lease_until, next_attempt_at "
    "FROM learning_queue WHERE next_attempt_at <= $1")
_DUE_LEARNING = _Sql(
    _LEARNING_COLUMNS + " ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    order="next_attempt_at")
_USERS_LEARNING = _Sql(_LEARNING_COLUMNS + " AND user_id = $2 FOR UPDATE SKIP LOCKED")
_TAKE_LEARNING = _Sql(
    "UPDATE learning_queue SET tasks = $2, claimed = $3, holder = $4, lease_until = $5 "
    "WHERE user_id = $1 RETURNING 1 AS taken")
_LOCK_LEARNING = _Sql("SELECT tasks, holder FROM learning_queue WHERE user_id = $1 FOR UPDATE")
_HELD_LEARNING = _Sql(
    "SELECT tasks, claimed FROM learning_queue WHERE user_id = $1 AND holder = $2 FOR UPDATE")
_FINISH_LEARNING = _Sql(
    # A claim learned while more was queued: the rest waits, due now.
    "UPDATE learning_queue SET claimed = '[]', holder = NULL, lease_until = NULL, "
    "attempts = 0, last_error = NULL, dropped = 0, next_attempt_at = $2, updated_at = $2 "
    "WHERE user_id = $1 RETURNING 1 AS finished")
_DROP_LEARNING = _Sql("DELETE FROM learning_queue WHERE user_id = $1 RETURNING 1 AS dropped")
_RELEASE_LEARNING = _Sql(
    "UPDATE learning_queue SET tasks = $2, claimed = '[]', holder = NULL, lease_until = NULL, "
    "attempts = attempts + $3, last_error = COALESCE($4, last_error), next_attempt_at = $5, "
    "updated_at = $6 WHERE user_id = $1 RETURNING 1 AS released")
_LEARNING_STATUS = _Sql(
    "SELECT tasks, claimed, dropped, attempts, last_error, next_attempt_at, holder, "
    "lease_until, created_at FROM learning_queue WHERE user_id = $1")

_USERS_CONVERSATIONS = _Sql(
    _CONVERSATION_COLUMNS + " WHERE user_id = $1", order="updated_at, conversation_id")
_ALL_MESSAGES = _Sql(
    "SELECT seq, role, content, task_id, tokens, created_at, message_id "
    "FROM conversation_messages WHERE conversation_id = $1", order="seq")
_QUEUED = _Sql("SELECT claimed, tasks FROM learning_queue WHERE user_id = $1")
_HOLDS_ANYTHING = _Sql(
    "SELECT EXISTS (SELECT 1 FROM user_profiles WHERE user_id = $1) OR EXISTS "
    "(SELECT 1 FROM conversations WHERE user_id = $1) AS holds")
_IMPORT_CONVERSATION = _Sql(
    "INSERT INTO conversations (conversation_id, user_id, conversation_data, updated_at, "
    "message_count, turns_digest) VALUES ($1, $2, $3, $4, $5, $6) RETURNING 1 AS added")
_IMPORT_MESSAGE = _Sql(
    "INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, tokens, "
    "created_at, message_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING 1 AS added")
_IMPORT_TASK = _Sql(
    "INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, workspace_data, "
    "version, updated_at, epoch, settings) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8) "
    "RETURNING 1 AS added")
_IMPORT_APPROVAL = _Sql(
    "INSERT INTO task_approvals (task_id, call_id, user_id, position, call_data, status, "
    "created_at, decided_at, decider, output) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
    "RETURNING 1 AS added")
_IMPORT_LEARNING = _Sql(
    "INSERT INTO learning_queue (user_id, tasks, next_attempt_at, created_at, updated_at) "
    "VALUES ($1, $2, $3, $3, $3) RETURNING 1 AS added")
_TAKEN = {"conversations_pkey": "conversation", "task_workspaces_pkey": "task",
          "profile_entries_pkey": "profile entry"}
"""The unique keys an import may find taken (by another user), and what they name."""


_REQUEST_COLUMNS = (
    "SELECT user_id, key_hash, request_hash, expires_at, task_id, conversation_id, outcome "
    "FROM idempotency_keys"
)
_SWEEP_REQUESTS = _Sql(
    # The user's expired keys (under row-level security a statement sees only its user's).
    "SELECT count(*) FROM gone",
    ctes="gone AS (DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(SELECT ctid FROM "
    "idempotency_keys WHERE user_id = $1 AND expires_at < now() LIMIT 100)) RETURNING 1)",
)
_CLAIM_REQUEST = _Sql(
    "INSERT INTO idempotency_keys AS k (user_id, key_hash, request_hash, task_id, "
    "conversation_id, outcome, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7) "
    "ON CONFLICT (user_id, key_hash) DO UPDATE SET request_hash = "
    "excluded.request_hash, task_id = excluded.task_id, conversation_id = "
    "excluded.conversation_id, outcome = excluded.outcome, expires_at = "
    "excluded.expires_at WHERE $8 OR k.expires_at < now() RETURNING 1 AS claimed")
_FIND_REQUEST = _Sql(_REQUEST_COLUMNS + " WHERE user_id = $1 AND key_hash = $2")
_SETTLE_REQUEST = _Sql(
    "UPDATE idempotency_keys SET task_id = COALESCE($3, task_id), conversation_id "
    "= COALESCE($4, conversation_id), outcome = COALESCE($5, outcome) "
    "WHERE user_id = $1 AND key_hash = $2 RETURNING 1 AS settled")
_DROP_REQUEST = _Sql(
    "DELETE FROM idempotency_keys WHERE user_id = $1 AND key_hash = $2 RETURNING 1 AS dropped")


def _request(row: Any) -> RequestRecord:
    user_id, key, request, expires, task_id, conversation_id, outcome = row
    return RequestRecord(
        user_id, key, request, expires, task_id, conversation_id,
        None if outcome is None else decode(outcome, "idempotency_keys", key, "outcome"),
    )


def _turns(messages: Sequence[dict[str, Any]]) -> list[str | None]:
    """Each message's turn hash, for the turns digest of its conversation."""
    return [turn_hash(m["role"], m["content"]) for m in messages]


_LOCK_CONVERSATION = _Sql(
    "SELECT 1 AS found FROM conversations WHERE conversation_id = $1 AND user_id = $2 "
    "FOR UPDATE")
_DELETE_CONVERSATION = tuple(
    # The conversation's rows, each statement scoped to its user (row-level security)
    _Sql("SELECT count(*) FROM gone", ctes=f"gone AS ({delete} RETURNING 1)")
    for delete in (
        "DELETE FROM task_approvals WHERE task_id IN (SELECT task_id FROM task_workspaces "
        "WHERE conversation_id = $1)",
        "DELETE FROM task_workspaces WHERE conversation_id = $1",
        "DELETE FROM conversation_runs WHERE conversation_id = $1",
        "DELETE FROM conversation_messages WHERE conversation_id = $1",
        "DELETE FROM conversations WHERE conversation_id = $1",
    )
)
_FIND_CALL = _Sql(
    "SELECT task_id FROM task_approvals WHERE user_id = $1 AND call_id = $2 LIMIT 1")


def _no_task(task_id: str, user_id: str) -> str:
    return (
        f"no unfinished task {task_id!r} for user {user_id!r} "
        "(it may have completed; `cogency tasks` lists the unfinished ones)"
    )


async def _owned_task(db: _Db, task_id: str, user_id: str) -> None:
    if await db.fetchval(_OWNED, task_id, user_id) is None:
        raise NotFoundError(_no_task(task_id, user_id))


async def _approvals(
    db: _Db, task_ids: Sequence[str], status: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The approval rows of these tasks (in ``status`` when given), by task, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    if not task_ids:
        return found
    for row in await db.fetch(_APPROVALS, list(task_ids), status):
        call = approval_record(tuple(row)[:8])
        if call["output"] is not None:
            call["output"] = _get_text(call["output"])
        found.setdefault(row[1], []).append(call)
    return found


async def _record_approvals(db: _Db, batch: SaveBatch, stamp: datetime) -> None:
    if batch.approvals:
        last = await db.fetchval(_LAST_POSITION, batch.task_id)
        await db.executemany(
            _ADD_APPROVAL,
            [(batch.task_id, call["id"], batch.user_id, last + number, approval_data(call),
              stamp.isoformat(), call.get("decider", "person"))
             for number, call in enumerate(batch.approvals, start=1)],
        )
    if batch.settled:
        await db.fetch(_SETTLE, batch.task_id, list(batch.settled))


async def _keep_session(db: asyncpg.Connection) -> None:
    """Pool reset: nothing to undo (no session state is set on pool connections), so the
    default reset's round trip per release is saved. The pool still rolls back a transaction
    left open."""


async def _put_profile(db: _Db, profile: Profile, stamp: datetime) -> None:
    await db.fetch(_PUT_PROFILE, profile.user_id, dumps(profile.to_dict()), stamp)


def _entry_row(entry: ProfileEntry) -> tuple[Any, ...]:
    row = list(entry_row(entry))
    row[3], row[4] = _put_text(row[3]), _put_text(row[4])  # key, value: text may hold NUL
    return tuple(row)


async def _entries(db: _Db, user_id: str, *, history: bool = False) -> list[ProfileEntry]:
    entries = []
    for row in await db.fetch(_ALL_ENTRIES if history else _ENTRIES, user_id):
        values = list(row)
        values[3], values[4] = _get_text(values[3]), _get_text(values[4])
        entries.append(entry_record(values))
    return entries


async def _change_profile(db: _Db, user_id: str, change: Callable[[ProfileBook], Any],
                          stamp: datetime) -> ProfileBook:
    """Read the profile (locked) and its current entries, apply ``change``, write what it
    changed: the one place that writes ``profile_entries`` and ``profile_data`` together."""
    # Create the row first so that concurrent updaters of a new profile also queue on its
    # lock instead of both starting from an empty profile.
    text = await db.fetchval(_CREATE_PROFILE, user_id, dumps(Profile(user_id).to_dict()), stamp)
    stored = None
    if text is None:
        stored = decode_profile(await db.fetchval(_LOCK_PROFILE, user_id), user_id)
    book = book_of(stored, user_id, await _entries(db, user_id))
    change(book)
    await _put_profile(db, book.finish(), stamp)
    if book.added:
        await db.executemany(_INSERT_ENTRY, [_entry_row(e) for e in book.added])
    if book.changed:
        await db.executemany(_UPDATE_ENTRY, [entry_changes(e) for e in book.changed.values()])
    return book


async def _export(db: _Db, user_id: str) -> UserData:
    text = await db.fetchval(_LOAD_PROFILE, user_id)
    conversations = []
    for row in await db.fetch(_USERS_CONVERSATIONS, user_id):
        record = conversation_record(row)
        messages = [_message(m) for m in await db.fetch(_ALL_MESSAGES, record.conversation_id)]
        conversations.append(ConversationData(record.conversation_id, record.data,
                                              record.updated_at, messages))
    tasks = [task_record(row, _get_text) for row in await db.fetch(_USERS_TASKS, user_id)]
    approvals = await _approvals(db, [task.task_id for task in tasks])
    queued = await db.fetchrow(_QUEUED, user_id)
    return UserData(
        user_id, None if text is None else decode_profile(text, user_id),
        await _entries(db, user_id, history=True), conversations,
        [TaskData(t.task_id, t.conversation_id, t.query, t.workspace, t.settings, t.version,
                  t.updated_at, approvals.get(t.task_id, [])) for t in tasks],
        [] if queued is None else [*queued_tasks(queued["claimed"], user_id),
                                   *queued_tasks(queued["tasks"], user_id)],
    )


async def _import(db: _Db, data: UserData, stamp: datetime, writing: list[str | None]
                  ) -> None:
    """Write ``data``; ``writing[0]`` names the conversation or task being written (a key
    taken by another user is not named by PostgreSQL under row-level security)."""
    user = data.user_id
    if await db.fetchval(_HOLDS_ANYTHING, user):
        raise import_conflict(user, "the store already holds data of this user")
    await _put_profile(db, data.profile or Profile(user), stamp)
    now = stamp.isoformat()
    for conversation in data.conversations:
        writing[0] = conversation.conversation_id
        await db.fetch(
            _IMPORT_CONVERSATION, conversation.conversation_id, user, dumps(conversation.data),
            conversation.updated_at or stamp, len(conversation.messages),
            conversation.turns_digest(),
        )
        await db.executemany(
            _IMPORT_MESSAGE,
            [(conversation.conversation_id, seq, m["role"], _put_text(m["content"]),
              m.get("task_id"), m.get("tokens", 0), m.get("created_at") or now, m.get("id"))
             for seq, m in enumerate(conversation.messages, start=1)],
        )
    for task in data.tasks:
        writing[0] = task.task_id
        await db.fetch(
            _IMPORT_TASK, task.task_id, user, task.conversation_id, _put_text(task.query),
            dumps(task.workspace), task.version, task.updated_at or stamp, dumps(task.settings),
        )
        await db.executemany(
            _IMPORT_APPROVAL,
            [(task.task_id, call["id"], user, position, approval_data(call), call["status"],
              call.get("created_at") or now, call.get("decided_at"),
              call.get("decider", "person"),
              None if call.get("output") is None else _put_text(call["output"]))
             for position, call in enumerate(task.approvals, start=1)],
        )
    writing[0] = None
    await db.executemany(_INSERT_ENTRY, [_entry_row(e) for e in data.entries])
    if data.learning:
        await db.fetch(_IMPORT_LEARNING, user, dumps(data.learning), now)


_CHAIN = (
    # The turns digest {old} with the turns among the messages {new} added (base.chain_turns).
    "CASE WHEN EXISTS (SELECT 1 FROM {new} WHERE turn IS NOT NULL) THEN cogency_chain_turns("
    "{old}, ARRAY(SELECT turn FROM {new} WHERE turn IS NOT NULL ORDER BY ord)) ELSE {old} END"
)
_BEGIN = _Sql(
    # $1 user, $2 a default profile, $3 stamp, $4 conversation, $5 its data if new, $6-$11 the
    # task row, $12 its lease in seconds (held when it has a runner), $13-$18 its first
    # messages, $19 the last seq this store saw of the conversation, $20 how many newer
    # messages to return (newest first), $21 the task's settings, $22 the epoch of this
    # store's hold on the conversation (fence when set), $23 each message's turn hash
    # (base.turn_hash; NULL: no turn). Rows: kind 0 the conversation (data,
    # seq before the first new message, updated_at) when the task was stored; kind 1 the
    # messages after $19 as they were before this statement; kind 2 the created_at of seq $19
    # (to check a cached window); kind 3 when the conversation is another user's (seen when
    # row-level security does not hide it; when it does, creating it fails on its key);
    # kind 4 when the hold was lost (nothing written).
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
    "FROM existing WHERE user_id <> $1 "
    "UNION ALL SELECT 4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL "
    "WHERE NOT EXISTS (SELECT 1 FROM fence)",
    ctes="existing AS (SELECT user_id, conversation_data::text AS data, updated_at "
    "FROM conversations WHERE conversation_id = $4), "
    "mine AS (SELECT 1 FROM existing WHERE user_id = $1), "
    "fence AS (SELECT 1 WHERE $22::int IS NULL OR EXISTS (SELECT 1 FROM conversation_runs "
    "WHERE conversation_id = $4 AND epoch = $22::int)), "
    "profile AS (INSERT INTO user_profiles (user_id, profile_data, updated_at) "
    "SELECT $1, $2::json, $3 WHERE NOT EXISTS (SELECT 1 FROM existing WHERE user_id <> $1) "
    "AND EXISTS (SELECT 1 FROM fence) ON CONFLICT (user_id) DO NOTHING), "
    "m AS (SELECT * FROM unnest($13::text[], $14::text[], $15::text[], $16::int[], "
    "$17::text[], $18::text[], $23::text[]) WITH ORDINALITY "
    "AS m(role, content, task_id, tokens, created_at, message_id, turn, ord)), "
    # No ON CONFLICT: a conversation made meanwhile (or another user's, hidden by row-level
    # security) fails the statement on its key, so nothing of it is written; the store
    # tries again once.
    "created AS (INSERT INTO conversations (conversation_id, user_id, conversation_data, "
    "updated_at, message_count, turns_digest) SELECT $4, $1, $5::json, $3, "
    "(SELECT count(*) FROM m), " + _CHAIN.format(old="NULL", new="m") + " "
    "WHERE NOT EXISTS (SELECT 1 FROM existing) AND EXISTS (SELECT 1 FROM fence) "
    "RETURNING conversation_data::text AS data, 0::bigint AS base, updated_at), "
    "counter AS (UPDATE conversations SET message_count = message_count + "
    "(SELECT count(*) FROM m), updated_at = CASE WHEN EXISTS (SELECT 1 FROM m) THEN $3 "
    "ELSE updated_at END, turns_digest = " + _CHAIN.format(old="turns_digest", new="m") + " "
    "WHERE conversation_id = $4 AND EXISTS (SELECT 1 FROM mine) "
    "AND EXISTS (SELECT 1 FROM fence) "
    "RETURNING message_count - (SELECT count(*) FROM m) AS base, updated_at), "
    "conv AS (SELECT data, base, updated_at FROM created UNION ALL "
    "SELECT e.data, c.base, c.updated_at FROM existing e, counter c), "
    "task AS (INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, "
    "workspace_data, version, runner, updated_at, epoch, lease_until, settings) "
    "SELECT $6, $1, $4, $7, $8::json, $9::int, $10::text, $3, $11::int, "
    + _LEASE_END.format("$12") + ", $21::text FROM conv RETURNING 1), "
    "ins AS (INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, "
    "tokens, created_at, message_id) SELECT $4, conv.base + m.ord, m.role, m.content, "
    "m.task_id, m.tokens, m.created_at, m.message_id FROM conv, m "
    "WHERE EXISTS (SELECT 1 FROM task))",
)


_SAVE = _Sql(
    # $1 conversation, $2 stamp, $3 user, $4 task, $5 epoch (fence when set), $6 workspace
    # (written when set), $7 expected version, $8 version step, $9 save id, $10 complete,
    # $11 check the task row at all, $12-$17 the messages, $18 the task's learning_queue
    # reference (base.learning_ref) when it completes with memory on,
    # $19 the epoch of the conversation hold the task was begun under (fence when set), $20
    # each message's turn hash (base.turn_hash; NULL: no turn).
    # Returns one row of kind 0 (the version) when it wrote, kind 1 per message stored
    # before (a retry), kind 2 the seq before the first new message, kind 3 when the hold
    # was lost (nothing written). The task row is found by its key (the owner as in
    # _TASK_KEY).
    "SELECT 0 AS kind, NULL AS message_id, version AS seq FROM ok "
    "UNION ALL SELECT 1, message_id, seq FROM old "
    "UNION ALL SELECT 2, NULL, base FROM counter "
    "UNION ALL SELECT 3, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM fence)",
    ctes="conv AS (SELECT 1 FROM conversations WHERE conversation_id = $1 AND user_id = $3), "
    "fence AS (SELECT 1 WHERE $19::int IS NULL OR EXISTS (SELECT 1 FROM conversation_runs "
    "WHERE conversation_id = $1 AND epoch = $19::int)), "
    "task AS (UPDATE task_workspaces SET workspace_data = COALESCE($6::json, workspace_data), "
    "version = version + $8::int, updated_at = $2, last_save = COALESCE($9::text, last_save) "
    "WHERE $11::bool AND NOT $10::bool AND task_id = $4 AND user_id IS NOT DISTINCT FROM $3 "
    "AND EXISTS (SELECT 1 FROM conv) AND EXISTS (SELECT 1 FROM fence) "
    "AND ($6::json IS NULL OR version = $7::int) "
    "AND ($5::int IS NULL OR epoch = $5::int) RETURNING version), "
    "gone AS (DELETE FROM task_workspaces WHERE $11::bool AND $10::bool AND task_id = $4 "
    "AND user_id IS NOT DISTINCT FROM $3 AND EXISTS (SELECT 1 FROM conv) "
    "AND EXISTS (SELECT 1 FROM fence) AND version = $7::int "
    "AND ($5::int IS NULL OR epoch = $5::int) RETURNING version), "
    "ok AS (SELECT version FROM task UNION ALL SELECT version FROM gone "
    "UNION ALL SELECT $7::int WHERE NOT $11::bool AND EXISTS (SELECT 1 FROM conv)), "
    "m AS (SELECT * FROM unnest($12::text[], $13::text[], $14::text[], $15::int[], "
    "$16::text[], $17::text[], $20::text[]) WITH ORDINALITY "
    "AS m(role, content, task_id, tokens, created_at, message_id, turn, ord)), "
    # One probe of the (conversation_id, message_id) index per message: a join (or
    # = ANY) was planned, in the generic plan made while the table was small, as a scan of
    # the whole conversation, so a save cost more every turn.
    "old AS (SELECT message_id, seq FROM (SELECT m.message_id, (SELECT x.seq "
    "FROM conversation_messages x WHERE x.conversation_id = $1 "
    "AND x.message_id = m.message_id) AS seq FROM m) probe WHERE seq IS NOT NULL), "
    "fresh AS (SELECT m.*, row_number() OVER (ORDER BY ord) AS n FROM m "
    "WHERE m.message_id IS NULL OR m.message_id NOT IN (SELECT message_id FROM old)), "
    "counter AS (UPDATE conversations SET message_count = message_count + "
    "(SELECT count(*) FROM fresh), updated_at = $2, turns_digest = "
    + _CHAIN.format(old="turns_digest", new="fresh") + " WHERE conversation_id = $1 "
    "AND user_id = $3 AND EXISTS (SELECT 1 FROM ok) AND EXISTS (SELECT 1 FROM fresh) "
    "RETURNING message_count - (SELECT count(*) FROM fresh) AS base), "
    "ins AS (INSERT INTO conversation_messages (conversation_id, seq, role, content, "
    "task_id, tokens, created_at, message_id) SELECT $1, counter.base + fresh.n, "
    "fresh.role, fresh.content, fresh.task_id, fresh.tokens, fresh.created_at, "
    "fresh.message_id FROM counter, fresh), "
    # The completed task queued for learning (memory on: $18 its reference), as
    # base.queue_task says, by cogency_queue_task (migration m015).
    "queued AS (INSERT INTO learning_queue AS q (user_id, tasks, next_attempt_at, "
    "created_at, updated_at) SELECT $3, json_build_array($18::json)::text, $18::json->>'at', "
    "$18::json->>'at', $18::json->>'at' WHERE $18::json IS NOT NULL "
    "AND EXISTS (SELECT 1 FROM gone) ON CONFLICT (user_id) DO UPDATE SET (tasks, dropped) = "
    "(SELECT t.queued, q.dropped + t.over FROM cogency_queue_task(q.tasks, q.claimed, "
    f"$18::json, {MAX_PENDING_TASKS}) t), next_attempt_at = excluded.next_attempt_at, "
    "updated_at = excluded.updated_at)",
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


async def _save_problem(db: _Db, batch: SaveBatch) -> int | None:
    """Why a fenced, versioned write matched no row: raises what went wrong (the run lost its
    lease, the task is gone, someone saved first); or, when an earlier attempt of this same
    save landed unseen, returns the version to write over (``None``: a completion landed)."""
    row = await db.fetchrow(_SAVE_STATE, batch.task_id, batch.user_id)
    if row is None:
        if batch.complete and batch.messages:
            ids = [m.get("id") for m in batch.messages]
            if await db.fetchval(_STORED, batch.conversation_id, ids) == len(batch.messages):
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


def _refused_setting(exc: BaseException) -> bool:
    """Whether connecting failed on a startup parameter the server side refused (PgBouncer
    refuses those it does not track, such as plan_cache_mode)."""
    return "unsupported startup parameter" in str(exc)


def _pooler_problem(exc: BaseException) -> str | None:
    """What to change when ``exc`` is a pooler refusing how the store works, else None."""
    text = str(exc)
    if "pooling mode" in text:  # "transaction blocks not allowed in statement pooling mode"
        return ("statement pooling runs no transaction of more than one statement, and the "
                "store needs them: set pool_mode = transaction (or session) for this database")
    if "unsupported startup parameter" in text:
        return ("it refuses even the parameters the store still sends (application_name, "
                "timezone): add them to ignore_startup_parameters, or upgrade the pooler")
    if "no more connections allowed" in text:
        return ("it takes no more clients (max_client_conn): raise it, or lower max_size in "
                "the processes that share it")
    if "query_wait_timeout" in text:
        return ("no server connection became free in time (query_wait_timeout): raise "
                "default_pool_size or the server's max_connections, or run fewer tasks at once")
    return None
