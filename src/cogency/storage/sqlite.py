"""SQLite storage: the zero set-up default. One connection, used from one worker thread."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import mmap
import os
import queue
import sqlite3
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from pathlib import Path
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, cast

from .. import _time
from .._history import History
from .._json import dumps
from ..errors import (
    ConflictError,
    ConversationBusyError,
    CorruptDataError,
    ForgottenError,
    NotFoundError,
    StorageError,
    StoreLockedError,
    UsageError,
)
from ..memory.entries import ProfileBook, ProfileEntry
from ..memory.profile import Profile
from . import _sqlite_image, _sqlite_schema
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
    abandon_runner,
    APPROVAL_COLUMNS,
    book_of,
    claim_lost,
    claimable,
    entry_changes,
    entry_record,
    entry_row,
    import_conflict,
    import_taken,
    learning_status_of,
    lease_free,
    pending_count,
    queue_task,
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
    schema_problem,
    task_record,
    task_running,
    too_new,
    turn_hash,
)

T = TypeVar("T")
log = logging.getLogger("cogency.storage")

BUSY_TIMEOUT_MS = 10_000
CHECKPOINT_BYTES = 4 * 1024 * 1024
"""Write-ahead log size at which the store checkpoints: SQLite's automatic checkpoint (at
1,000 pages) would run in whatever thread committed, and make that commit wait for it.
The copying is done by a thread and connection of its own while the calls go on
(``_copy_soon``); the worker then copies the little written meanwhile and starts the log
over (``_checkpoint``)."""
COPY_ALONE_BYTES = 256 * 1024
"""Log not yet copied that the copier thread copies, rather than the worker."""
LOG_FILE_LIMIT = 2 * CHECKPOINT_BYTES
"""The size the log file is cut back to when SQLite starts it over (``journal_size_limit``):
a log a reader kept from being checkpointed grows, and would keep that size on the disk."""
LOG_MOST_BYTES = 4 * CHECKPOINT_BYTES
"""A log this big (a reader kept it from being copied) is checkpointed by the worker, in
turn with the calls, whatever the copier is doing."""
_WAL_INDEX = struct.Struct("=IIIBBHI76xI")
"""The start of the ``-shm`` file (in the machine's byte order): the wal-index header's
iVersion, unused, iChange, isInit, bigEndCksum, szPage, mxFrame (the frames the log holds),
then, at offset 96, the checkpoint's nBackfill (the frames copied into the database).
Documented at https://www.sqlite.org/walformat.html (2.2)."""
_WAL_INDEX_VERSION = 3007000
_WAL_FRAME_HEADER = 24
PAGE_BYTES = 1024
"""The page size of a database file this store creates (``PRAGMA page_size``; a file that
exists keeps its own). A commit writes each page it changed to the log whole, and a turn's
commit changes about 11 (a message, the conversation's counter, the task's row, and each one's
indexes): at SQLite's default of 4 KiB that is 44 KiB of log for a message of a few hundred
bytes, at 1 KiB 11 KiB. Less to write and to flush per commit, a checkpoint every ~3.5 times
as many turns, a smaller file; a message longer than a page continues in overflow pages, as at
any size."""
INLINE_CHARACTERS = 65_536
"""Text a call may carry and still run on the event loop (see ``SQLiteStore._run``)."""
FLUSH_ON_LOOP_SECONDS = 0.001
"""A flush longer than this is slow: the event loop makes the flushes itself (at
``synchronous="full"``) only while fewer than ``FLUSH_SLOW_MOST`` of the last ``FLUSH_WINDOW``
were slow (``SQLiteStore._flush_here``)."""
FLUSH_WINDOW = 16
"""The flushes a store remembers the speed of (see ``FLUSH_ON_LOOP_SECONDS``)."""
FLUSH_SLOW_MOST = 4
"""Slow flushes among the last ``FLUSH_WINDOW`` that send the next ones to the worker thread.
So the loop waits for at most this many slow flushes in any ``FLUSH_WINDOW`` in a row: one
slow now and then (a disk's tail) leaves the flushes on the loop; a disk that turns slow holds
it for this many, then the worker makes them until the window holds fewer again. A new store's
first flush is the worker's."""
FLUSH_STALL_SECONDS = 0.1
"""A flush longer than this is a stall: it counts as a whole window of slow ones, so the loop
waits for a stall once, and the worker makes the flushes after it until
``FLUSH_WINDOW - FLUSH_SLOW_MOST + 1`` fast ones in a row have pushed it out."""
_FLUSH_SLOW_MASK = (1 << FLUSH_WINDOW) - 1
LOG_AHEAD_BYTES = 256 * 1024
"""At ``synchronous="full"``, how far past its last frame the log file is kept written
(zeros), at most, so that a commit's frames land in blocks the file already has, flushed. A
flush of a file that grew must also record its new size and blocks (the file system's
journal): on one test machine 1.6 times as long as a flush of the log written ahead at the
median, 1.3 on average, the writing ahead included (``python -m bench.bench_flush``:
*appending*, *written ahead*). A growth's flush carries its zeros too, once per ~10 turns,
and the log file is up to this much larger until the store closes (the close removes it)."""
LOG_AHEAD_FIRST = 64 * 1024
"""How far ahead a log is written while it holds less than this; beyond, as far as it holds,
up to ``LOG_AHEAD_BYTES``: a process that answers once writes 64 KiB of zeros, not 256 (its
first turn at "full": ~3.3 → ~2.7 ms on one test machine, as before the writing ahead)."""
_LOG_HEADER = 32
"""The write-ahead log's header, before its first frame (walformat.html, 1.1)."""
_clock = time.perf_counter  # what a flush is timed with
SYNCHRONOUS = ("normal", "full")
"""The durability settings a store can be opened with (SQLite's ``PRAGMA synchronous``)."""
CHAIN_TURNS = "cogency_chain_turns"
"""The SQL function (of the store's connection) that adds turns to a turns digest, as
PostgreSQL's function of the same name does: ``cogency_chain_turns(digest, turns)``, ``turns``
the turns' hashes (``base.turn_hash``) joined into one text."""


def _m001_initial(db: sqlite3.Connection) -> None:
    # The seeds' schema (v3.0), kept verbatim so their databases open and migrate.
    _script(db, 
        """
        CREATE TABLE IF NOT EXISTS user_profiles (
            user_id TEXT PRIMARY KEY,
            profile_data TEXT NOT NULL,          -- Profile as one flat JSON object
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE TABLE IF NOT EXISTS conversations (
            conversation_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            conversation_data TEXT NOT NULL,     -- the conversation's own fields, no messages
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            FOREIGN KEY (user_id) REFERENCES user_profiles(user_id)
        );
        CREATE TABLE IF NOT EXISTS task_workspaces (
            task_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            workspace_data TEXT NOT NULL,        -- the 4 workspace fields as JSON
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            FOREIGN KEY (user_id) REFERENCES user_profiles(user_id)
        );
        """
    )


def _m002_conversation_messages(db: sqlite3.Connection) -> None:
    # Messages as appended rows: one write per message whatever the history length.
    _script(db, 
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
            created_at TEXT NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        );                                       -- a rowid table: WITHOUT ROWID spills rows over
                                                 -- ~1 KB into half-empty overflow pages (2x size)
        CREATE INDEX conversations_by_user ON conversations(user_id, updated_at);
        """
    )
    # The seeds never turned foreign keys on, so their files may name users with no profile
    # row; give those a default profile so the enforced keys hold from here on.
    stamp = _time.stamp()
    for (user_id,) in db.execute(
        "SELECT user_id FROM conversations UNION SELECT user_id FROM task_workspaces "
        "EXCEPT SELECT user_id FROM user_profiles"
    ).fetchall():
        db.execute(
            "INSERT INTO user_profiles (user_id, profile_data, updated_at) VALUES (?, ?, ?)",
            (user_id, dumps(Profile(user_id).to_dict()), stamp),
        )
    # Databases of the seeds kept messages as a JSON list inside conversation_data.
    rows = db.execute("SELECT conversation_id, conversation_data FROM conversations").fetchall()
    for conversation_id, text in rows:
        data = decode(text, "conversations", conversation_id, "conversation_data")
        messages = legacy_messages(conversation_id, data, stamp)
        if messages is None:
            continue
        db.executemany(
            "INSERT INTO conversation_messages VALUES (?, ?, ?, ?, NULL, ?, ?)",
            [(conversation_id, *message) for message in messages],
        )
        db.execute(
            "UPDATE conversations SET conversation_data = ?, message_count = ? "
            "WHERE conversation_id = ?",
            (dumps(data), len(messages), conversation_id),
        )


def _m003_task_workspace_columns(db: sqlite3.Connection) -> None:
    # A workspace knows its conversation (continue_task restores both), its version
    # (stale saves conflict) and who runs it (a second runner is refused).
    _script(db, 
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
    stamp = _time.stamp()
    orphans = db.execute(
        "SELECT task_id, user_id FROM task_workspaces WHERE conversation_id IS NULL"
    ).fetchall()
    for task_id, user_id in orphans:
        conversation_id = f"migrated-{task_id}"
        db.execute(
            "INSERT OR IGNORE INTO conversations (conversation_id, user_id, conversation_data, "
            "updated_at) VALUES (?, ?, ?, ?)",
            (conversation_id, user_id,
             dumps({"conversation_id": conversation_id, "user_id": user_id, "created_at": stamp}),
             stamp),
        )
        db.execute(
            "UPDATE task_workspaces SET conversation_id = ? WHERE task_id = ?",
            (conversation_id, task_id),
        )


def _m004_run_leases(db: sqlite3.Connection) -> None:
    # Runs hold tasks by expiring, fenced leases; messages carry their writer's id.
    _script(db, 
        """
        ALTER TABLE task_workspaces ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
            -- bumped by each claim and force-release; a run's writes must carry the current one
        ALTER TABLE task_workspaces ADD COLUMN lease_until TEXT;
            -- when the runner's lease lapses unless renewed (ISO 8601 UTC); then others may claim
        ALTER TABLE task_workspaces ADD COLUMN lease_holder INTEGER;
            -- PostgreSQL's lease key; unused here (the columns are the same on both)
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


def _m006_approvals(db: sqlite3.Connection) -> None:
    # Tool calls that wait for a person, one row each, so another process (or the HTTP
    # service) can list and decide them, and an approved call is never started twice.
    _script(db,
        """
        CREATE TABLE task_approvals (
            task_id TEXT NOT NULL REFERENCES task_workspaces(task_id) ON DELETE CASCADE,
            call_id TEXT NOT NULL,
            user_id TEXT NOT NULL,               -- the task's user: every read is scoped by it
            position INTEGER NOT NULL,           -- the order the model asked for the calls
            call_data TEXT NOT NULL,             -- {"name", "args"} as JSON
            status TEXT NOT NULL,                -- pending, approved, denied, running, done
            created_at TEXT NOT NULL,
            decided_at TEXT,
            PRIMARY KEY (task_id, call_id)
        );
        CREATE INDEX task_approvals_by_user ON task_approvals(user_id, status);
        """
    )


def _m008_task_settings(db: sqlite3.Connection) -> None:
    # What the task's starter needs to run it again as it was started (the CLI keeps its
    # tools, root and model here), so a resume does not silently run with other tools.
    db.execute("ALTER TABLE task_workspaces ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'")


def _m009_client_tool_calls(db: sqlite3.Connection) -> None:
    # A call of a tool the client declared (OpenAI function calling) waits in the same table
    # as a call waiting for a person: the client decides it by sending its result, kept
    # here until the resumed task stores it in the conversation.
    db.execute("ALTER TABLE task_approvals ADD COLUMN decider TEXT NOT NULL DEFAULT 'person'")
    db.execute("ALTER TABLE task_approvals ADD COLUMN output TEXT")


def _m014_profile_entries(db: sqlite3.Connection) -> None:
    _script(db, PROFILE_ENTRIES_TABLE)  # (its columns, and why: storage/base.py)
    # Profiles learned before entries existed: their values become entries without sources.
    rows = db.execute("SELECT user_id, profile_data FROM user_profiles").fetchall()
    for user_id, text in rows:
        try:
            book = ProfileBook.adopt(decode_profile(text, user_id))
        except CorruptDataError:
            continue  # reported when it is read; a change then adopts what it holds
        db.executemany(f"INSERT INTO profile_entries ({ENTRY_COLUMNS}) VALUES "
                       f"({', '.join('?' * 15)})", [entry_row(e) for e in book.added])


def _m015_learning_queue(db: sqlite3.Connection) -> None:
    _script(db, LEARNING_QUEUE_TABLE)  # (its columns, and why: storage/base.py)


def _script(db: sqlite3.Connection, sql: str) -> None:
    # executescript() would COMMIT first; a migration must stay inside its transaction.
    statement = ""
    for line in sql.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


def _m005_forget_generation(db: sqlite3.Connection) -> None:
    # Outlives the user's other rows on purpose: learning that began before a forget
    # compares its generation inside its write, so a forgotten user can never be re-learned
    # from erased data, whichever process or Memory learns. Keyed by a hash of the user id:
    # nothing readable of a forgotten user stays behind.
    db.execute(
        "CREATE TABLE user_generations (user_key TEXT PRIMARY KEY, "
        "generation INTEGER NOT NULL)"
    )


def _m007_service(db: sqlite3.Connection) -> None:
    # The HTTP service (`cogency serve`): its API keys, and which conversation has a run.
    _script(db,
        """
        CREATE TABLE api_keys (
            key_id TEXT PRIMARY KEY,             -- the key's public part, shown by `keys list`
            user_id TEXT NOT NULL,               -- every request with the key acts as this user
            key_hash TEXT NOT NULL,              -- SHA-256 of the secret part; never the key
            name TEXT NOT NULL DEFAULT '',
            created_at TEXT NOT NULL,
            revoked_at TEXT                      -- set by `keys revoke`: the key stops working
        );
        CREATE INDEX api_keys_by_user ON api_keys(user_id);
        CREATE TABLE conversation_runs (
            conversation_id TEXT PRIMARY KEY,    -- one run at a time per conversation, across
            user_id TEXT NOT NULL,               -- every process on this file
            runner TEXT NOT NULL,                -- host|pid|start|token: a dead holder's row
            started_at TEXT NOT NULL             -- is stale and taken over
        );
        """
    )


def _m010_idempotency_keys(db: sqlite3.Connection) -> None:
    _script(db, IDEMPOTENCY_KEYS_TABLE.format(timestamp="TEXT"))  # (why: storage/base.py)


def _m012_leases_as_rows(db: sqlite3.Connection) -> None:
    # A conversation's run is held like a task: a row with an epoch (bumped by every take and
    # force release, so a run that lost its hold is fenced out of the conversation) and an
    # expiry its store renews, so a hold of a host that is gone lapses. The rows stay when
    # released (runner NULL), keeping each conversation's epoch rising. Holds in flight at the
    # upgrade are dropped (they were not fenced anyway). lease_holder held PostgreSQL's
    # advisory-lock key, which leases as rows replace on both stores.
    db.execute("DROP TABLE conversation_runs")
    _script(db, CONVERSATION_RUNS_TABLE.format(timestamp="TEXT"))  # (storage/base.py)


def _m011_conversation_turns(db: sqlite3.Connection) -> None:
    # A digest of each conversation's turns (base.turn_hash), kept by every append, so the
    # service finds the conversation of a resent chat history by one indexed lookup.
    _script(db,
        """
        ALTER TABLE conversations ADD COLUMN turns_digest TEXT;
        CREATE INDEX conversations_by_turns ON conversations(user_id, turns_digest);
        """
    )
    digests: dict[str, str | None] = {}
    rows = db.execute("SELECT conversation_id, role, content FROM conversation_messages "
                      "ORDER BY conversation_id, seq")
    for conversation_id, role, content in rows:
        piece = turn_hash(role, content)
        if piece is not None:
            digests[conversation_id] = chain_turns(digests.get(conversation_id), (piece,))
    db.executemany("UPDATE conversations SET turns_digest = ? WHERE conversation_id = ?",
                   [(digest, conversation_id) for conversation_id, digest in digests.items()])


def _m013_row_level_security(db: sqlite3.Connection) -> None:
    # PostgreSQL's row-level security; SQLite has none (one file, one owner): nothing to do.
    pass


MIGRATIONS: tuple[tuple[str, Callable[[sqlite3.Connection], None]], ...] = (
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


def migrate(db: sqlite3.Connection, upto: str | None = None, *, replay: bool = False
            ) -> list[str]:
    """Apply the missing migrations in order (through ``upto``), in one transaction; returns
    the names applied. An empty database gets the final schema in one step (``_create``),
    unless ``replay``: every migration then runs, as for making that schema."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if upto is None and not replay and _squashable(db):
            applied = _create(db)
        else:
            applied = _replay(db, upto)
            # A file made of the image (_make_from_image) was migrated when it was made.
            db.execute("UPDATE schema_migrations SET applied_at = ? WHERE applied_at = ''",
                       (_time.stamp(),))
        db.execute("COMMIT")
        return applied
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _squashable(db: sqlite3.Connection) -> bool:
    """Whether ``db`` holds nothing at all (no ``schema_migrations``, no seed-era tables) and
    the squashed schema is that of these migrations (if not, it was not regenerated: replay)."""
    return (_sqlite_schema.MIGRATION_NAMES == MIGRATION_NAMES
            and db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None)


def _create(db: sqlite3.Connection) -> list[str]:
    """The schema every migration ends with, made in one step (a quarter of the cost of
    replaying them; tests/test_sqlite_schema.py holds the two equal), every migration
    recorded as applied."""
    for statement in _sqlite_schema.STATEMENTS:
        db.execute(statement)
    stamp = _time.stamp()
    db.executemany("INSERT INTO schema_migrations VALUES (?, ?)",
                   [(name, stamp) for name in MIGRATION_NAMES])
    return list(MIGRATION_NAMES)


def _replay(db: sqlite3.Connection, upto: str | None) -> list[str]:
    """Apply, inside the caller's transaction, each migration ``db`` lacks (through ``upto``)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    done = {row[0] for row in db.execute("SELECT name FROM schema_migrations")}
    newer = too_new(done)
    if newer is not None:
        raise newer
    if not done and _has_table(db, "user_profiles"):
        done.add("m001_initial")  # a seed-era database made without migrations
        db.execute(
            "INSERT INTO schema_migrations VALUES ('m001_initial', ?)", (_time.stamp(),)
        )
    applied = []
    for name, step in MIGRATIONS:
        if name not in done:
            step(db)
            db.execute(
                "INSERT INTO schema_migrations VALUES (?, ?)", (name, _time.stamp())
            )
            applied.append(name)
        if name == upto:
            break
    return applied


def _make_from_image(path: Path) -> bool:
    """Make a new database file at ``path`` of the bytes of ``_sqlite_image`` (an empty
    database with the final schema, in write-ahead-log mode, at ``PAGE_BYTES``): making its 25
    tables and indexes, and SQLite's switch to the log with its four flushes, cost twice as
    much (opening a new file: ~3.6 ms, ~1.9 from the image).

    True once the file is there, made so. False (SQLite then makes the file) when anything is
    at ``path`` or beside it (a log left there must never be read as this file's), when the
    image is for other migrations, or when this system cannot make a file atomically
    (``O_TMPFILE``, Linux): the file appears whole, flushed, or not at all, so a process
    opening the same path meanwhile sees no half-written file."""
    if (_sqlite_image.THROUGH != MIGRATION_NAMES[-1] or _sqlite_image.PAGE_BYTES != PAGE_BYTES
            or not hasattr(os, "O_TMPFILE")
            or any(os.path.lexists(f"{path}{end}") for end in ("", "-wal", "-journal", "-shm"))):
        return False
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return False
    try:
        made = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=folder)
    except OSError:  # a file system without unnamed files: SQLite makes it
        os.close(folder)
        return False
    try:
        image = memoryview(zlib.decompress(base64.b64decode(_sqlite_image.IMAGE)))
        while image:
            image = image[os.write(made, image):]
        os.fdatasync(made)
        # (dst_dir_fd: linkat, which follows the link /proc names the file by)
        os.link(f"/proc/self/fd/{made}", path.name, dst_dir_fd=folder, follow_symlinks=True)
        with contextlib.suppress(OSError):  # (as SQLite, where a directory cannot be flushed)
            os.fsync(folder)  # the file's name survives a power loss, as SQLite's own would
    except OSError:  # made by another meanwhile, or no /proc: SQLite opens or makes it
        return False
    finally:
        os.close(made)
        os.close(folder)
    return True


def _applied(db: sqlite3.Connection) -> set[str]:
    """The schema steps applied to ``db`` (a seed-era file counts as having the first)."""
    if _has_table(db, "schema_migrations"):
        return {row[0] for row in db.execute("SELECT name FROM schema_migrations")}
    return {"m001_initial"} if _has_table(db, "user_profiles") else set()


def _copy_log(db: sqlite3.Connection) -> None:
    """Copy the write-ahead log into the database (``PASSIVE``: it waits for no one and
    blocks no one; the store's commits go on meanwhile)."""
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


def _checkpoint(db: sqlite3.Connection) -> None:
    """Copy what is left of the write-ahead log into the database, so that the next commit
    starts the log over from its beginning (``RESTART``), in the file as it is: later
    commits write over blocks the file already has, and the flush of a commit that does not
    grow its file is cheaper (no size or block allocation to record). Called with the busy
    timeout off: with another connection reading an older snapshot it copies what it can
    and leaves the log, to try again at a later commit; it never waits."""
    db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
    return row.fetchone() is not None


class SQLiteStore:
    """A :class:`~cogency.storage.Store` in one SQLite file (WAL, foreign keys, busy timeout).

    The file is created on first use, in a directory that must exist (``create_dirs=True``
    creates missing ones, as the default database does in the user's data directory);
    ``":memory:"`` keeps everything in memory. Calls that may wait run on one worker thread,
    so the event loop never waits on a slow disk or on another process's lock; the short
    calls of a turn that need neither (no lock held elsewhere, little text, and at
    ``synchronous="full"`` a flush only while flushes are fast and nothing else is under way)
    run on the event loop itself when the worker is idle, as moving them to the thread and
    back costs more than they do. Checkpoints (copying the write-ahead log into the
    database, which flushes the file) never run on the event loop: SQLite's automatic ones
    are off; once the log reaches ``CHECKPOINT_BYTES`` a thread with a connection of its own
    copies it while the calls go on, and the worker copies what was written meanwhile and
    starts the log over.

    A running task is held by a lease of ``lease`` seconds that this store renews while the
    run goes on; a runner whose process is gone (on this host) or whose lease lapsed (any host)
    holds nothing, and ``force_release`` takes a task from one known to be dead.

    ``read_only=True`` never creates, migrates or writes anything: a missing file is a
    :class:`~cogency.errors.NotFoundError`, a file with an older schema a
    :class:`~cogency.errors.StorageError` saying to open it once for writing, and writes raise
    :class:`~cogency.errors.UsageError`. It reads files the process may not write.

    ``synchronous`` is what a commit survives (SQLite's ``PRAGMA synchronous``, in WAL mode):
    ``"normal"`` (the default) survives the process crashing or being killed at any moment, but
    a power loss or an operating-system crash may lose the last commits (the file stays
    consistent); ``"full"`` flushes to the disk every commit that records an outcome, so an
    outcome survives a power loss too, at the price of a disk flush for each.

    What ``"full"`` flushes, and why that is every commit's promise: a commit that records
    what a caller is told happened (a step's save, a task's completion or pause, approvals
    decided or started, a served request's outcome, a profile change, an import, a deletion)
    is flushed to the disk before its call returns. A commit that only *prepares* a turn
    (beginning a task, claiming or releasing a task or a conversation, renewing their leases,
    claiming an idempotency key or noting the task it started) is written to the log without
    a flush. The log is one file appended in order, so a flush makes every commit before it
    durable too; a power loss can only take a suffix of the log, so the file comes back as it
    was at some moment after the last flushed commit returned: a turn that had begun and not
    yet answered may be gone, as if it had never started (a crash of the process loses
    nothing either way). A one-step turn is thus one disk flush: its completion.

    How: every commit is written to the log without a flush, wherever it runs (on the loop
    when it may, as at ``"normal"``); the caller of one that records an outcome is told once
    a flush of the log (``fdatasync``) began after it was written. The event loop makes that
    flush itself, waking no thread, only while the store has nothing else under way (one
    task in flight, no flush owed or begun) and its flushes are fast: fewer than
    ``FLUSH_SLOW_MOST`` (4) of its last ``FLUSH_WINDOW`` (16) took over
    ``FLUSH_ON_LOOP_SECONDS`` (1 ms). Else the worker thread makes it and the loop goes on. A
    slow flush now and then (a disk's tail) thus leaves the flushes on the loop, and the loop
    waits for at most 4 slow ones in any 16 flushes in a row: a disk that turns slow holds it
    for 4, then the worker makes the flushes until the disk is fast again. A flush over
    ``FLUSH_STALL_SECONDS`` (0.1 s, a stall) counts as 16 slow ones: the loop waits for a
    stall once, and the worker flushes after it until 13 in a row were fast. Commits that owe a
    flush while one waits to begin share it (completions of concurrent runs: one flush), and
    each caller hears its own outcome. A flush that fails tells its callers so
    (``StorageError``): their commits are stored, and may not survive a power loss. Other
    readers of the file may see such a commit before it is flushed. The log file is kept
    written ahead of its last frame (``_grow_log``, up to ``LOG_AHEAD_BYTES``), so a flush
    seldom has to record a new size of it as well.
    """

    # Slots: past 30 attributes an instance's dict stops sharing its keys with the class's
    # other instances; a store's dict cost ~1.6 KB to build (test_sqlite_specific.py's
    # test_an_agent_and_its_store_are_cheap_to_build).
    __slots__ = (
        "synchronous", "path", "read_only", "create_dirs", "_busy_timeout_ms", "lease",
        "_leases", "_db", "_worker", "_lock", "_handed", "_finished", "_waits", "_on_commit",
        "_commits", "_flushed", "_flushing_upto", "_flush_handed", "_owed", "_flush_lock",
        "_wal", "_flush_fd", "_flush_slow", "_log_zeros", "_log_seen", "_log_ahead", "_wrote",
        "_checkpointing", "_log", "_index", "_copier", "_copier_db", "_copying", "_closed",
        "_windows", "__weakref__",
    )

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = BUSY_TIMEOUT_MS / 1000,
        lease: float = LEASE_SECONDS,
        read_only: bool = False,
        create_dirs: bool = False,
        synchronous: str = "normal",
    ) -> None:
        if lease <= 0:
            raise UsageError("lease must be a positive number of seconds")
        if not isinstance(synchronous, str) or synchronous.lower() not in SYNCHRONOUS:
            raise UsageError(
                f"synchronous must be 'normal' or 'full', not {synchronous!r}: 'full' makes "
                "every commit survive a power loss, 'normal' only a crash of the process"
            )
        self.synchronous = synchronous.lower()
        self.path = str(path)
        self.read_only = read_only
        self.create_dirs = create_dirs
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self.lease = lease
        self._leases = Leases(lease, self._renew)
        self._db: sqlite3.Connection | None = None
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        """Held by whoever uses the connection: the worker thread, or a call on the loop."""
        self._handed = self._finished = 0  # the last job handed to the worker, the last done
        self._waits = True  # whether the connection's busy timeout is on (see _run)
        self._on_commit: list[Callable[[], None]] = []  # run once the transaction commits
        self._commits = 0  # transactions committed on the connection (see _owe_flush)
        self._flushed = 0  # of them, those a flush of the log is known to have made durable
        self._flushing_upto = -1  # what the flush in flight covers (-1: none in flight)
        self._flush_handed = False  # a flush handed to the worker that has not begun
        self._owed: list[tuple[int, asyncio.Future[Any], Any]] = []  # callers told once flushed
        self._flush_lock = threading.Lock()  # the loop and the worker both owe and flush
        self._wal = True  # whether the connection's journal is the write-ahead log
        self._flush_fd: int | None = None  # the file a flush makes durable, open for that
        self._log_zeros: mmap.mmap | None = None  # what _grow_log writes (at "full" only)
        self._log_seen = (0, 0)  # _log_state() after the last commit (_log_is_full)
        self._log_ahead = 0  # where the log file was last seen to end (_grow_log)
        # The last FLUSH_WINDOW flushes, newest in the lowest bit: 1 for a slow one. A new
        # store counts FLUSH_SLOW_MOST slow ones as the window's oldest: its first flush is
        # the worker's, and they leave the window with the next ones.
        self._flush_slow = ((1 << FLUSH_SLOW_MOST) - 1) << (FLUSH_WINDOW - FLUSH_SLOW_MOST)
        self._wrote = False  # a commit since the log's size was last looked at
        self._checkpointing: asyncio.Future[None] | None = None
        self._log = (None if self.path == ":memory:"  # the write-ahead log _connect's file has
                     else str(Path(self.path).expanduser()) + "-wal")
        self._index: int | None = None
        """The log's ``-shm`` file, open for reading while the connection is (``_log_state``)."""
        self._copier: _Worker | None = None
        """The thread that checkpoints (``_copy_soon``), with its own connection:"""
        self._copier_db: sqlite3.Connection | None = None
        self._copying = threading.Lock()  # held from handing the copier a checkpoint to its end
        self._closed = False
        self._windows = _Windows()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise UsageError("this store is closed; open a new one")
        if self._db is not None:
            return self._db
        if self.read_only:
            self._db = self._connect_read_only()
            return self._db
        if self.path != ":memory:":
            folder = Path(self.path).expanduser().parent
            if not folder.is_dir() and not self.create_dirs:
                # A mistyped path must not leave a tree of directories behind.
                raise StorageError(
                    f"cannot create the database {self.path!r}: there is no directory "
                    f"{str(folder)!r}; create it first or pass another path"
                )
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(
                    f"cannot create the directory for the database {self.path!r} ({exc}); "
                    "pass a writable path or set COGENCY_DB"
                ) from exc
            _make_from_image(Path(self.path).expanduser())
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(
                str(Path(self.path).expanduser()) if self.path != ":memory:" else self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout_ms / 1000,
            )
            db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            db.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":  # (no log there) only a file not yet made takes it
                db.execute(f"PRAGMA page_size = {PAGE_BYTES}")
            self._wal = db.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
            if self._wal:  # where SQLite keeps it: beside the file a symbolic link names
                self._log = db.execute("PRAGMA database_list").fetchone()[2] + "-wal"
            db.execute("PRAGMA wal_autocheckpoint = 0")  # the worker checkpoints (see _run)
            db.execute(f"PRAGMA journal_size_limit = {LOG_FILE_LIMIT}")
            # At "full" the store flushes the log itself, after the commit and off the event
            # loop (_owe_flush); SQLite flushes only what it must at any setting: checkpoints,
            # the log's header when it starts over. (Without a log, SQLite flushes its own.)
            db.execute(f"PRAGMA synchronous = {'NORMAL' if self._wal else self.synchronous}")
            if self._wal and self.synchronous == "full" and hasattr(os, "pwrite"):  # (not on
                # Windows) zeros that no page holds until read, then the kernel's zero page
                self._log_zeros = mmap.mmap(-1, LOG_AHEAD_BYTES)
            # What _append's UPDATE chains the turns digest with (only this connection writes
            # through it; nothing in the schema names it, so other connections need not).
            db.create_function(CHAIN_TURNS, 2, _chain_turns, deterministic=True)
            migrate(db)
        except BaseException as exc:
            if db is not None:  # a failed open (locked, too new, corrupt) keeps no connection
                db.close()
            if isinstance(exc, sqlite3.Error):
                raise _storage_error(exc, self.path) from exc
            raise
        self._db = db
        return db

    def _connect_read_only(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            raise UsageError("an in-memory database cannot be opened read-only: it is empty")
        path = Path(self.path).expanduser()
        if not path.is_file():
            raise NotFoundError(
                f"there is no database at {self.path!r} (nothing was ever stored there); "
                "check the path"
            )
        uri = path.resolve().as_uri()
        db: sqlite3.Connection | None = None
        try:
            try:
                db = self._open_uri(f"{uri}?mode=ro")
            except sqlite3.OperationalError:
                # A WAL file in a place this process cannot write (no -shm can be made):
                # read it as immutable, which is what such a file is to this process.
                db = self._open_uri(f"{uri}?mode=ro&immutable=1")
            problem = schema_problem(_applied(db), repr(self.path))
            if problem is not None:
                raise problem
        except BaseException as exc:
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.Error):
                raise _storage_error(exc, self.path) from exc
            raise
        return db

    def _open_uri(self, uri: str) -> sqlite3.Connection:
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                             timeout=self._busy_timeout_ms / 1000)
        try:
            db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            db.execute("PRAGMA query_only = ON")
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # opens the file now
        except BaseException:
            db.close()
            raise
        return db

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, inline: bool = False) -> T:
        """``fn`` on the worker thread; ``inline=True`` (a call that carries little text)
        runs it here on the event loop instead when nothing is queued for the worker, with
        the busy timeout off: a lock held by another connection sends it to the worker, to
        wait there as any call does. The loop never waits on a lock, and on the disk only
        for a flush expected to be fast: a write that must be flushed (``_Flushing``) is told
        its outcome once a flush made it durable, made by the loop itself when the store has
        nothing else under way and its flushes are fast (``_flush_here``), else on the
        worker (``_owe_flush``)."""
        if (inline and self._db is not None and self._finished == self._handed
                and self._lock.acquire(blocking=False)):
            ran = False
            try:
                result = self._call(fn, waits=False)
                ran, commits = True, self._commits
                if self._wrote and self._log_is_full() and self._checkpointing is None:
                    self._checkpointing = self._hand(lambda db: None, checkpoint=True)
                    self._checkpointing.add_done_callback(self._checkpointed)
            except _Busy:
                pass
            finally:
                self._lock.release()
            if ran:
                if not isinstance(fn, _Flushing) or self._flush_here(commits):
                    return result
                told: asyncio.Future[T] = asyncio.get_running_loop().create_future()
                self._owe_flush(commits, told, result)
                return await told
        if isinstance(fn, _Flushing):
            return await self._hand_flushing(fn)
        return await self._hand(fn)

    def _hand(self, fn: Callable[[sqlite3.Connection], T], *, checkpoint: bool = False
              ) -> asyncio.Future[T]:
        """``fn`` queued for the worker thread, after what was handed to it before; after
        it, a checkpoint there if asked or if the log is due one (``_log_is_full``)."""
        return self._started().submit(self._job(fn, checkpoint))

    def _started(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker()
        return self._worker

    def _job(self, fn: Callable[[sqlite3.Connection], T], checkpoint: bool = False
             ) -> Callable[[], T]:
        """``fn`` as the worker runs it (see ``_hand``), counted as handed from now."""
        self._handed += 1
        ticket = self._handed

        def job() -> T:
            with self._lock:
                try:
                    result = self._call(fn)
                    if checkpoint:
                        with contextlib.suppress(_Busy):  # locked elsewhere: a later one
                            self._call(_checkpoint, waits=False)
                    elif self._wrote and self._log_is_full():
                        self._checkpoint_after()
                    return result
                finally:
                    self._finished = ticket  # the worker runs jobs in order: all before too

        return job

    def _hand_flushing(self, write: _Flushing[T]) -> asyncio.Future[T]:
        """``write`` committed on the worker thread, its caller told once a flush made it
        durable (``_owe_flush``): no event loop is woken between the commit and the flush."""
        told: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        job = self._job(write)

        def run() -> None:
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - its caller's
                _settle_soon(told, None, exc)
                return
            self._owe_flush(self._commits, told, result)

        self._started().post(run)
        return told

    def _owe_flush(self, commits: int, told: asyncio.Future[T], result: T) -> None:
        """From the loop or the worker: ``told`` gets ``result`` once a flush of the log
        began after the first ``commits`` commits were written, and so made them durable
        (the log is one file written in order). A flush handed to the worker that has not
        begun covers every commit made before it begins, so commits that owe one while it
        waits share it; one is handed only if none such is waiting and the one in flight
        (if any) began too early."""
        with self._flush_lock:
            if self._flushed >= commits:
                _settle_soon(told, result, None)
                return
            self._owed.append((commits, told, result))
            if self._flush_handed or self._flushing_upto >= commits:
                return
            self._flush_handed = True
        self._started().post(self._flush_log)

    def _flush_here(self, commits: int) -> bool:
        """On the loop, after a commit that owes a flush: flush the log here, and so tell its
        caller without waking a thread, if the loop may wait for the disk: the store has
        nothing else under way (at most the one task in flight, no flush owed or begun) and
        its last flushes were fast (fewer than ``FLUSH_SLOW_MOST`` slow ones in
        ``_flush_slow``). Concurrent runs thus share the worker's flushes, and a disk that
        turns slow holds the loop for ``FLUSH_SLOW_MOST`` flushes, before flushing goes back
        to the worker. False: the flush is the worker's (``_owe_flush``).
        A flush that fails raises ``StorageError``."""
        if (self._flush_slow.bit_count() >= FLUSH_SLOW_MOST
                or len(self._leases.tasks) > 1):
            return False
        with self._flush_lock:
            if self._owed or self._flush_handed or self._flushing_upto >= 0:
                return False
            upto = self._flushing_upto = self._commits
        error = self._flush(upto)
        if error is not None:
            raise error
        return True

    def _flush_log(self) -> None:
        """On the worker: flush the log for the callers owed one (``_owe_flush``)."""
        with self._flush_lock:
            self._flush_handed = False
            if not self._owed:  # (closing flushed them: _close_db)
                return
            upto = self._flushing_upto = self._commits
        self._flush(upto)

    def _flush(self, upto: int) -> BaseException | None:
        """Flush the log (the database file, if the journal is not the log) to the disk, and
        tell the callers whose commits that made durable (the first ``upto``); if the flush
        fails, they hear why (their commits were written, and may not survive a power loss),
        and so does the caller (returned).

        Where the next ones run (``_flush_here``): a slow flush (or a failed one) is noted in
        ``_flush_slow``, which the loop's and the worker's flushes both keep."""
        error: BaseException | None = None
        began = _clock()
        try:
            getattr(os, "fdatasync", os.fsync)(self._flushed_file())
        except OSError as exc:
            error = StorageError(
                f"flushing the database {self.path!r} to the disk failed ({exc}): what was "
                "just written is stored but may not survive a power loss; check the disk"
            )
            error.__cause__ = exc
        took = _clock() - began
        with self._flush_lock:
            if took > FLUSH_STALL_SECONDS:  # a stall holds the loop once, not 4 times
                self._flush_slow = _FLUSH_SLOW_MASK
            else:
                slow = error is not None or took > FLUSH_ON_LOOP_SECONDS
                self._flush_slow = (self._flush_slow << 1 | slow) & _FLUSH_SLOW_MASK
            self._flushing_upto = -1
            if error is None:
                self._flushed = max(self._flushed, upto)
            done = [owed for owed in self._owed if owed[0] <= upto]
            self._owed = [owed for owed in self._owed if owed[0] > upto]
        for _, told, result in done:
            _settle_soon(told, None if error else result, error)
        return error

    def _flushed_file(self) -> int:
        """The file a flush makes durable (the log; the database without one), opened once,
        for writing too (``_grow_log`` writes ahead in the log), as SQLite opens it."""
        if self._flush_fd is None:
            target = self._log if self._wal and self._log is not None else self.path
            self._flush_fd = os.open(str(Path(target).expanduser()), os.O_RDWR)
        return self._flush_fd

    def _grow_log(self, zeros: mmap.mmap) -> None:
        """In a write transaction at ``synchronous="full"``, before its commit: keep the log
        file written with zeros past its last frame, as far as the log holds (from
        ``LOG_AHEAD_FIRST`` to ``LOG_AHEAD_BYTES``), writing again once a quarter of that is
        left, so that the commit's frames (and the next ones') land in blocks the file has,
        and their flush records no new size (the growth's flush does, with its zeros).

        Safe because the transaction holds the log's write lock: no connection of any process
        appends a frame or starts the log over meanwhile, and the zeros go only past the
        file's end, where no frame is. SQLite reads a log's frames up to the first that is not
        one of its current frames (their checksums and salts), as it does after a log starts
        over in a file longer than its frames: zeros end the log there, in a crash too. A log
        whose frames were all copied starts over at its beginning, over blocks the file has:
        it is not grown. Anything failing here (a full disk) leaves the commit to SQLite.

        Whether to grow it is judged by what the store saw after the last commit (its frames,
        ``_log_is_full``) and where it last saw the file end: another process's commits
        since then only make it grow less soon. Where it writes is the file's end, read here.
        """
        held, copied = self._log_seen
        if held and copied == held:
            return
        frames_end = _LOG_HEADER + held if held else 0
        ahead = min(LOG_AHEAD_BYTES, max(LOG_AHEAD_FIRST, frames_end))
        if frames_end + ahead // 4 <= self._log_ahead:
            return
        try:
            fd = self._flushed_file()
            end = self._log_ahead = os.fstat(fd).st_size
            if frames_end <= end < frames_end + ahead // 4:
                with memoryview(zeros) as view, view[: frames_end + ahead - end] as part:
                    os.pwrite(fd, part, end)
                self._log_ahead = frames_end + ahead
        except OSError as exc:
            log.debug("writing the log of %r ahead failed (SQLite writes it): %s", self.path, exc)

    def _checkpoint_after(self) -> None:
        """On the worker, after a call that filled the log: a checkpoint whose failure (a
        disk error, say) is said in the log, not to that call's caller, whose call is
        done; a later commit tries again."""
        try:
            self._call(_checkpoint, waits=False)
        except _Busy:  # locked elsewhere: a later one
            pass
        except StorageError as exc:
            log.warning("checkpointing %r failed (the next one tries again): %s", self.path, exc)

    def _log_is_full(self) -> bool:
        """After a commit, once the log holds ``CHECKPOINT_BYTES``: the copier copies it
        while the calls go on, until little is left to copy; then True, and the worker
        copies that little and starts the log over (``_checkpoint``), a short wait for the
        calls behind it. Called with ``_lock`` held."""
        self._wrote = False
        held, copied = self._log_seen = self._log_state()
        if held < CHECKPOINT_BYTES:
            return False
        if held >= LOG_MOST_BYTES:
            return True
        if held - copied >= COPY_ALONE_BYTES:
            self._copy_soon()
            return False
        return not self._copying.locked()

    def _log_state(self) -> tuple[int, int]:
        """The write-ahead log's frames, in bytes, and those of them copied into the database,
        as SQLite's wal-index counts them (one read of the ``-shm`` file, which SQLite keeps
        while the connection is open); the log file's size and nothing copied if that cannot
        be read or is not a wal-index this knows. (A log all copied keeps its frames until
        the next commit starts it over.) Called with ``_lock`` held."""
        if self._log is None or self._db is None:
            return 0, 0
        try:
            if self._index is None:
                self._index = os.open(self._log[:-4] + "-shm", os.O_RDONLY)
            version, _, _, ready, _, page, frames, copied = _WAL_INDEX.unpack(
                os.pread(self._index, _WAL_INDEX.size, 0))
            if version == _WAL_INDEX_VERSION and ready == 1 and copied <= frames:
                frame = (65536 if page == 1 else page) + _WAL_FRAME_HEADER  # 1: 64 KiB
                return frames * frame, copied * frame
        except (OSError, struct.error):
            pass
        try:
            return os.stat(self._log).st_size, 0
        except OSError:
            return 0, 0

    def _copy_soon(self) -> None:
        """A checkpoint on the copier thread, with a connection of its own (``_copy_log``),
        unless one is in flight: no call of the store waits for it. From the loop or the
        worker, with ``_lock`` held."""
        if self._closed or not self._copying.acquire(blocking=False):
            return
        if self._copier is None:
            self._copier = _Worker("cogency-sqlite-checkpoint")
        self._copier.post(self._copy)

    def _copy(self) -> None:
        """On the copier thread."""
        try:
            if self._copier_db is None:
                self._copier_db = sqlite3.connect(
                    str(Path(self.path).expanduser()), isolation_level=None,
                    check_same_thread=False, timeout=0)
                self._copier_db.execute("PRAGMA busy_timeout = 0")
                self._copier_db.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            _copy_log(self._copier_db)
        except Exception as exc:  # noqa: BLE001 - logged; the next commit hands another
            if not (isinstance(exc, sqlite3.Error) and _locked(exc)):  # (another's checkpoint)
                log.warning("checkpointing %r failed (the next one tries again): %s",
                            self.path, exc)
        finally:
            self._copying.release()

    def _close_copier(self) -> None:
        """On the copier thread, after the checkpoint in flight."""
        if self._copier_db is not None:
            self._copier_db.close()
            self._copier_db = None

    def _close_db(self) -> None:
        """Close the connection (and the ``-shm`` file ``_log_state`` reads, and the file
        ``_flush_log`` flushes, once it flushed what is owed); ``_lock`` held or nothing else
        running."""
        if self._owed:  # a flush handed after this is over: closing must not outrun it
            self._flush_log()
        if self._index is not None:
            os.close(self._index)
            self._index = None
        if self._flush_fd is not None:
            os.close(self._flush_fd)
            self._flush_fd = None
        self._log_zeros = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def _checkpointed(self, done: asyncio.Future[None]) -> None:
        self._checkpointing = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("checkpointing %r failed (the next one tries again): %s",
                        self.path, done.exception())

    def _call(self, fn: Callable[[sqlite3.Connection], T], *, waits: bool = True) -> T:
        db = self._connect()
        try:
            if waits != self._waits:
                db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms if waits else 0}")
                self._waits = waits
            return fn(db)
        except sqlite3.Error as exc:
            if not waits and _locked(exc):
                if db.in_transaction:  # (a write's own rollback did this already)
                    db.execute("ROLLBACK")
                raise _Busy() from exc
            raise self._told(exc) from exc
        except (UnicodeEncodeError, OverflowError) as exc:
            raise self._told(exc) from exc

    def _told(self, exc: BaseException) -> BaseException:
        """What a caller is told of ``exc``, raised by SQLite or by binding a value."""
        told: BaseException
        if isinstance(exc, sqlite3.Error):
            told = _storage_error(exc, self.path)
        elif isinstance(exc, (UnicodeEncodeError, OverflowError)):  # values SQLite cannot bind
            told = UsageError(
                f"a value cannot be stored ({exc}): text must not hold lone surrogates (decode "
                "bytes with errors='replace') and integers must fit in 64 bits"
            )
        else:
            return exc
        told.__cause__ = exc
        return told

    def _write(
        self, fn: Callable[[sqlite3.Connection], T], *, wait: bool = True, flush: bool = True
    ) -> Callable[[sqlite3.Connection], T]:
        """``fn`` in one write transaction; ``wait=False`` fails at once on a held lock
        instead of waiting up to the busy timeout (for what can be skipped or done later).

        ``flush=False`` marks a transaction that only prepares a turn: with
        ``synchronous="full"`` its caller is told once it is committed, and the next flush
        makes it durable with what follows it; any other is told once a flush made it
        durable (``_owe_flush``; the rule: the class docstring)."""
        if self.read_only:
            raise UsageError(f"the database {self.path!r} was opened read-only; nothing was written")

        def transaction(db: sqlite3.Connection) -> T:
            if not wait and self._waits:
                db.execute("PRAGMA busy_timeout = 0")
                try:
                    db.execute("BEGIN IMMEDIATE")
                finally:
                    db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            else:
                db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
            except BaseException:
                self._on_commit.clear()
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            if self._log_zeros is not None:
                self._grow_log(self._log_zeros)
            try:
                db.execute("COMMIT")
                self._wrote = True
                self._commits += 1
            finally:
                done, self._on_commit = self._on_commit, []
            for hook in done:
                hook()
            return result

        # (":memory:" has no disk to flush.)
        flushing = flush and self.synchronous == "full" and self._log is not None
        return _Flushing(transaction) if flushing else transaction

    async def close(self) -> None:
        """Give up every task and conversation this store holds, and close the connection;
        the file stays. Safe to call twice."""
        tasks, holds = dict(self._leases.tasks), dict(self._leases.holds)
        self._leases.clear()
        for runner, _ in (*tasks.values(), *holds.values()):
            abandon_runner(runner)  # over, whatever the database says
        if (tasks or holds) and not self._closed and not self.read_only:

            def let_go(db: sqlite3.Connection) -> None:
                db.executemany(
                    "UPDATE task_workspaces SET runner = NULL, lease_until = NULL "
                    "WHERE task_id = ? AND runner = ?",
                    [(task, runner) for task, (runner, _) in tasks.items()])
                db.executemany(
                    "UPDATE conversation_runs SET runner = NULL, lease_until = NULL "
                    "WHERE conversation_id = ? AND runner = ?",
                    [(conversation, runner) for conversation, (runner, _) in holds.items()])

            try:
                await self._run(self._write(let_go, wait=False, flush=False), inline=True)
            except StorageError:
                pass  # they lapse by themselves
        if self._checkpointing is not None:  # handed to the worker before: it runs, not fails
            await asyncio.wait([self._checkpointing])
        self._closed = True
        if self._worker is not None:
            await self._run_close()
        elif self._db is not None:  # every call ran on the loop: nothing runs on the worker
            with self._lock:
                self._close_db()
        # Last: no job left on the worker can hand it a checkpoint now. (Whichever connection
        # closes last copies what is left of the log and removes its file.)
        if self._copier is not None:
            await self._copier.submit(self._close_copier)
            self._copier.stop()
            self._copier = None

    async def _run_close(self) -> None:
        assert self._worker is not None

        await self._worker.submit(self._close_db)
        self._worker.stop()
        self._worker = None

    # -- tasks ----------------------------------------------------------------------------

    async def begin_task(
        self,
        task: TaskRecord,
        conversation_data: dict[str, Any],
        messages: Sequence[dict[str, Any]] = (),
        history_tokens: int | None = None,
    ) -> ConversationRecord:
        hold = self._leases.holds.get(task.conversation_id) if task.runner else None

        def work(db: sqlite3.Connection) -> ConversationRecord:
            stamp = _time.stamp()
            if hold is not None:
                _check_hold(db, task.conversation_id, hold[1])
            fresh = list(messages)
            seen: Seen | None = None
            window = (None if history_tokens is None
                      else self._windows.get(task.conversation_id, history_tokens))
            bumped = None
            conversation: ConversationRecord | None
            if fresh and window is not None:
                # A conversation this store has a window of is still there (nearly always):
                # its row is read as its counter is bumped for the messages, with what checks
                # the window, in one statement (when it is gone, it is found as below).
                bumped = db.execute(*_bump(
                    task.conversation_id, task.user_id, fresh, stamp,
                    _RECORD_AND_STAMP, (task.conversation_id, window.last_seq))).fetchone()
            if bumped is not None:
                conversation = conversation_record(bumped[:5])  # its count with the messages
                seen = (window.last_seq, bumped[5]) if window is not None else None
            elif history_tokens is None:
                conversation = _find_conversation(db, task.conversation_id, task.user_id,
                                                  missing=None)
            else:  # also what checks the window cached of it, in the same statement
                conversation, seen = _find_windowed(db, self._windows, task.conversation_id,
                                                    task.user_id, history_tokens, missing=None)
            if conversation is None:
                if _conversation_owner(db, task.conversation_id) is not None:
                    raise NotFoundError(no_conversation(task.conversation_id, task.user_id))
                # The user's row, which conversations and tasks name (a conversation of the
                # user's shows it exists: no statement for it on a conversation's later turns).
                _ensure_profile(db, task.user_id, stamp)
                db.execute(
                    "INSERT INTO conversations (conversation_id, user_id, conversation_data, "
                    "updated_at, message_count) VALUES (?, ?, ?, ?, 0)",
                    (task.conversation_id, task.user_id, dumps(conversation_data), stamp),
                )
                conversation = ConversationRecord(
                    task.conversation_id, task.user_id, conversation_data, 0, _time.parse(stamp)
                )
            try:
                db.execute(
                    "INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, "
                    "workspace_data, version, runner, updated_at, epoch, lease_until, settings) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (task.task_id, task.user_id, task.conversation_id, task.query,
                     dumps(task.workspace), task.version, task.runner, stamp,
                     1 if task.runner else 0, self._lease_end() if task.runner else None,
                     dumps(task.settings)),
                )
            except sqlite3.IntegrityError as exc:
                raise ConflictError(
                    f"task {task.task_id!r} already exists; start tasks with a new id"
                ) from exc
            appended: list[dict[str, Any]] = []
            if bumped is not None:
                appended = _insert(db, task.conversation_id, fresh, bumped[3], stamp)
            elif fresh:
                batch = SaveBatch(task.user_id, task.task_id, task.conversation_id,
                                  task.version, fresh)
                appended = _append(db, batch, stamp, new=True)
                conversation.message_count += len(fresh)
            if history_tokens is not None:
                conversation.recent = self._windows.load(db, conversation, history_tokens,
                                                         appended, seen)
            return conversation

        conversation = await self._run(self._write(work, flush=False),  # the completion flushes
                                       inline=_little(task.query, messages))
        if task.runner:
            self._leases.hold_task(task.task_id, task.runner, 1, task.conversation_id)
        return conversation

    async def load_task(self, task_id: str, user_id: str) -> TaskRecord:
        def work(db: sqlite3.Connection) -> TaskRecord:
            row = db.execute(
                _TASK_COLUMNS + " WHERE task_id = ? AND user_id = ?",
                (task_id, user_id),
            ).fetchone()
            if row is None:
                raise NotFoundError(_no_task(task_id, user_id))
            task = task_record(row)
            task.pending_approvals = _approvals(db, [task_id], "pending").get(task_id, [])
            return task

        return await self._run(work)

    async def list_tasks(self, user_id: str | None = None) -> list[TaskRecord]:
        def work(db: sqlite3.Connection) -> list[TaskRecord]:
            sql = _TASK_COLUMNS
            rows = (
                db.execute(sql + " WHERE user_id = ? ORDER BY updated_at", (user_id,))
                if user_id is not None
                else db.execute(sql + " ORDER BY updated_at")
            )
            tasks = [task_record(row) for row in rows]
            waiting = _approvals(db, [task.task_id for task in tasks], "pending")
            for task in tasks:
                task.pending_approvals = waiting.get(task.task_id, [])
            return tasks

        return await self._run(work)

    async def load_approvals(
        self, task_id: str, user_id: str, status: str | None = None
    ) -> list[dict[str, Any]]:
        def work(db: sqlite3.Connection) -> list[dict[str, Any]]:
            _owned_task(db, task_id, user_id)
            return _approvals(db, [task_id], status).get(task_id, [])

        return await self._run(work)

    async def decide_approvals(
        self, task_id: str, user_id: str, decisions: Mapping[str, bool | str]
    ) -> list[dict[str, Any]]:
        def work(db: sqlite3.Connection) -> list[dict[str, Any]]:
            _owned_task(db, task_id, user_id)
            statuses = {call: (status, decider) for call, status, decider in db.execute(
                "SELECT call_id, status, decider FROM task_approvals WHERE task_id = ?",
                (task_id,),
            )}
            updates = check_decisions(task_id, statuses, decisions)
            stamp = _time.stamp()
            db.executemany(
                "UPDATE task_approvals SET status = ?, output = ?, decided_at = ? "
                "WHERE task_id = ? AND call_id = ? AND status = 'pending'",
                [(status, output, stamp, task_id, call_id) for status, output, call_id in updates],
            )
            decided = _approvals(db, [task_id]).get(task_id, [])
            return [call for call in decided if call["id"] in decisions]

        return await self._run(self._write(work))

    async def start_approvals(self, task_id: str, user_id: str, call_ids: Sequence[str]) -> None:
        def work(db: sqlite3.Connection) -> None:
            for call_id in call_ids:
                changed = db.execute(
                    "UPDATE task_approvals SET status = 'running' WHERE task_id = ? "
                    "AND user_id = ? AND call_id = ? AND status = 'approved'",
                    (task_id, user_id, call_id),
                ).rowcount
                if changed != 1:
                    raise ConflictError(
                        f"call {call_id!r} of task {task_id!r} is not approved and waiting to "
                        "run (another runner may have started it)"
                    )

        await self._run(self._write(work))

    async def load_task_messages(self, task_id: str, user_id: str) -> list[dict[str, Any]]:
        def work(db: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = db.execute(
                "SELECT m.seq, m.role, m.content, m.task_id, m.tokens, m.created_at, m.message_id "
                "FROM conversation_messages m JOIN conversations c USING (conversation_id) "
                "WHERE m.task_id = ? AND c.user_id = ? ORDER BY m.seq",
                (task_id, user_id),
            )
            return [_message(row) for row in rows]

        return await self._run(work)

    async def claim_task(self, task_id: str, user_id: str, runner: str) -> int:
        def work(db: sqlite3.Connection) -> tuple[int, str]:
            row = db.execute(
                "SELECT runner, epoch, lease_until, conversation_id FROM task_workspaces "
                "WHERE task_id = ? AND user_id = ?",
                (task_id, user_id),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
            holder, epoch, until, conversation_id = row
            if holder == runner:
                return int(epoch), conversation_id
            expires = _time.parse(until) if until else None
            if not lease_free(holder, expires, _time.now()):
                raise task_running(task_id, expires)
            db.execute(
                "UPDATE task_workspaces SET runner = ?, epoch = ?, lease_until = ? "
                "WHERE task_id = ?",
                (runner, epoch + 1, self._lease_end(), task_id),
            )
            return int(epoch) + 1, conversation_id

        epoch, conversation_id = await self._run(self._write(work, flush=False), inline=True)
        self._leases.hold_task(task_id, runner, epoch, conversation_id)
        return epoch

    async def release_task(self, task_id: str, runner: str) -> None:
        if self._leases.tasks.get(task_id, (None,))[0] == runner:
            self._leases.drop_task(task_id)
        try:
            await self._run(
                self._write(
                    lambda db: db.execute(
                        "UPDATE task_workspaces SET runner = NULL, lease_until = NULL "
                        "WHERE task_id = ? AND runner = ?",
                        (task_id, runner),
                    ),
                    wait=False,  # a run never waits to let go: its claim is void here anyway
                    flush=False,  # a lost release names a dead runner: free to take
                ),
                inline=True,
            )
        except BaseException:
            abandon_runner(runner)  # the run is over even if its row still names it
            raise

    async def force_release(self, task_id: str, user_id: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT runner, conversation_id FROM task_workspaces "
                "WHERE task_id = ? AND user_id = ?",
                (task_id, user_id),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no unfinished task {task_id!r} for user {user_id!r}")
            runner, conversation_id = row
            db.execute(
                "UPDATE task_workspaces SET runner = NULL, lease_until = NULL, epoch = epoch + 1 "
                "WHERE task_id = ?",
                (task_id,),
            )
            if runner:  # the hold its process took on the conversation dies with it
                process = process_of(runner) + "|"
                db.execute(
                    "UPDATE conversation_runs SET runner = NULL, lease_until = NULL, "
                    "epoch = epoch + 1 WHERE conversation_id = ? "
                    "AND substr(runner, 1, length(?)) = ?",
                    (conversation_id, process, process),
                )
            return cast("str | None", runner)

        self._leases.drop_task(task_id)
        return await self._run(self._write(work))

    def _lease_end(self) -> str:
        return _time.stamp(self.lease)

    async def _renew(self, tasks: Held, holds: Held) -> tuple[set[str], set[str]]:
        def lost(db: sqlite3.Connection, table: str, key: str, held: Held, until: str
                 ) -> set[str]:
            return {
                name for name, (runner, epoch) in held.items()
                if db.execute(
                    f"UPDATE {table} SET lease_until = ? WHERE {key} = ? AND runner = ? "
                    "AND epoch = ?",
                    (until, name, runner, epoch),
                ).rowcount == 0
            }

        def work(db: sqlite3.Connection) -> tuple[set[str], set[str]]:
            until = self._lease_end()
            return (lost(db, "task_workspaces", "task_id", tasks, until),
                    lost(db, "conversation_runs", "conversation_id", holds, until))

        return await self._run(self._write(work, wait=False, flush=False), inline=True)

    async def save(self, batch: SaveBatch) -> int:
        fence = self._leases.fence(batch.task_id)

        def work(db: sqlite3.Connection, look: bool) -> int:
            stamp = _time.stamp()
            version = batch.expected_version
            if fence is not None:
                _check_hold(db, *fence)
            if batch.workspace is not None or batch.complete or batch.epoch is not None:
                checked = _check_task(db, batch)  # a completion's deletes the row
                if checked is None:
                    return version  # an earlier attempt of this completion landed
                version = checked
            if batch.messages:
                appended = _append(db, batch, stamp, look=look)
                self._on_commit.append(lambda: self._windows.note(batch.conversation_id,
                                                                  appended))
            if batch.profile is not None:
                given = batch.profile
                _change_profile(db, batch.user_id, lambda book: book.take(given), stamp)
            if (batch.approvals or batch.settled) and not batch.complete:
                _record_approvals(db, batch, stamp)  # (a completion's go with its task)
            if batch.complete and batch.learn:
                _queue_learning(db, batch, stamp)
            if batch.workspace is not None and not batch.complete:
                version += 1
                db.execute(
                    "UPDATE task_workspaces SET workspace_data = ?, version = ?, updated_at = ?, "
                    "last_save = ? WHERE task_id = ?",
                    (dumps(batch.workspace), version, stamp, batch.save_id, batch.task_id),
                )
            return version

        inline = _little("", batch.messages, batch.workspace)
        try:
            # Most saves are first attempts, whose messages nothing stored yet: they are
            # written without looking for them first; the rare retry whose earlier attempt
            # landed unseen meets them in the unique index and is saved again, looking.
            version = await self._run(self._write(lambda db: work(db, False)), inline=inline)
        except _Stored:
            version = await self._run(self._write(lambda db: work(db, True)), inline=inline)
        if batch.complete:
            self._leases.drop_task(batch.task_id)
        return version

    # -- conversations --------------------------------------------------------------------

    async def load_conversation(self, conversation_id: str, user_id: str) -> ConversationRecord:
        return await self._run(
            lambda db: _find_conversation(db, conversation_id, user_id, missing=NotFoundError),
            inline=True,
        )

    async def list_conversations(
        self, user_id: str, *, limit: int | None = None
    ) -> list[ConversationRecord]:
        def work(db: sqlite3.Connection) -> list[ConversationRecord]:
            rows = db.execute(
                "SELECT conversation_id, user_id, conversation_data, message_count, updated_at "
                "FROM conversations WHERE user_id = ? ORDER BY updated_at DESC LIMIT ?",
                (user_id, -1 if limit is None else limit),
            )
            return [conversation_record(row) for row in rows]

        return await self._run(work)

    async def load_messages(
        self,
        conversation_id: str,
        user_id: str,
        *,
        token_budget: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        def work(db: sqlite3.Connection) -> list[dict[str, Any]]:
            if limit is not None or token_budget is None:
                _find_conversation(db, conversation_id, user_id, missing=NotFoundError)
                rows = db.execute(_SELECT_MESSAGES + " ORDER BY seq DESC", (conversation_id,))
                return _window(rows, token_budget, limit)
            record, seen = _find_windowed(db, self._windows, conversation_id, user_id,
                                          token_budget, missing=NotFoundError)
            assert record is not None
            return self._windows.load(db, record, token_budget, seen=seen)

        return await self._run(work)

    # -- profiles -------------------------------------------------------------------------

    async def load_profile(self, user_id: str) -> Profile | None:
        def work(db: sqlite3.Connection) -> Profile | None:
            row = db.execute(
                "SELECT profile_data FROM user_profiles WHERE user_id = ?", (user_id,)
            ).fetchone()
            return None if row is None else decode_profile(row[0], user_id)

        return await self._run(work)

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
        def work(db: sqlite3.Connection) -> ProfileBook:
            # BEGIN IMMEDIATE orders this write against forget_user's: read inside it.
            if generation is not None and _generation(db, user_id) != generation:
                raise ForgottenError(user_id)
            queued = _claimed(db, claim) if claim is not None else None
            book = _change_profile(db, user_id, change, _time.stamp())
            if claim is not None and queued is not None:
                _finish_claim(db, claim, queued, _time.stamp())
            return book

        return await self._run(self._write(work))

    async def load_entries(self, user_id: str, *, history: bool = False) -> list[ProfileEntry]:
        return await self._run(lambda db: _entries(db, user_id, history=history))

    async def forget_user(self, user_id: str) -> ForgetReceipt:
        def work(db: sqlite3.Connection) -> ForgetReceipt:
            receipt = ForgetReceipt(user_id, 0)
            queued = db.execute("SELECT tasks, claimed FROM learning_queue WHERE user_id = ?",
                                (user_id,)).fetchone()
            receipt.pending_learning = pending_count(*queued, user_id=user_id) if queued else 0
            db.execute("DELETE FROM learning_queue WHERE user_id = ?", (user_id,))
            receipt.entries = db.execute(
                "DELETE FROM profile_entries WHERE user_id = ? AND superseded_at IS NULL",
                (user_id,)).rowcount
            receipt.history = db.execute(
                "DELETE FROM profile_entries WHERE user_id = ?", (user_id,)).rowcount
            receipt.approvals = db.execute(
                "DELETE FROM task_approvals WHERE user_id = ?", (user_id,)).rowcount
            # Messages and workspaces go with their conversations (ON DELETE CASCADE); the
            # explicit deletes also cover rows written before the cascades existed, and count.
            receipt.messages = db.execute(
                "DELETE FROM conversation_messages WHERE conversation_id IN "
                "(SELECT conversation_id FROM conversations WHERE user_id = ?)",
                (user_id,),
            ).rowcount
            receipt.tasks = db.execute(
                "DELETE FROM task_workspaces WHERE user_id = ?", (user_id,)).rowcount
            db.execute("DELETE FROM conversation_runs WHERE user_id = ?", (user_id,))
            receipt.conversations = db.execute(
                "DELETE FROM conversations WHERE user_id = ?", (user_id,)).rowcount
            receipt.profiles = db.execute(
                "DELETE FROM user_profiles WHERE user_id = ?", (user_id,)).rowcount
            db.execute("DELETE FROM idempotency_keys WHERE user_id = ?", (user_id,))
            db.execute(
                "INSERT INTO user_generations (user_key, generation) VALUES (?, 1) "
                "ON CONFLICT(user_key) DO UPDATE SET generation = generation + 1",
                (generation_key(user_id),),
            )
            receipt.generation = _generation(db, user_id)
            self._windows.clear()
            return receipt

        return await self._run(self._write(work))

    # -- learning as durable work ---------------------------------------------------------

    async def claim_learning(
        self, holder: str, *, user_id: str | None = None, limit: int = 1,
        batch: int = LEARN_BATCH, lease: float = LEARN_LEASE,
    ) -> list[LearningClaim]:
        def work(db: sqlite3.Connection) -> list[LearningClaim]:
            now = _time.now()
            stamp = now.isoformat()
            until = (now + timedelta(seconds=lease)).isoformat()
            sql = ("SELECT user_id, tasks, claimed, dropped, attempts, holder, lease_until "
                   "FROM learning_queue WHERE next_attempt_at <= ?")
            params: list[Any] = [stamp]
            if user_id is not None:
                sql += " AND user_id = ?"
                params.append(user_id)
            claims: list[LearningClaim] = []
            for user, tasks, claimed, dropped, attempts, held_by, lease_until in db.execute(
                    sql + " ORDER BY next_attempt_at LIMIT ?", (*params, limit + 50)
            ).fetchall():
                if not claimable(held_by, lease_until, holder, stamp):
                    continue
                taken, left = take_claim(queued_tasks(tasks, user), queued_tasks(claimed, user),
                                         batch)
                db.execute("UPDATE learning_queue SET tasks = ?, claimed = ?, holder = ?, "
                           "lease_until = ? WHERE user_id = ?",
                           (dumps(left), dumps(taken), holder, until, user))
                claims.append(LearningClaim(user, holder, taken, attempts, dropped))
                if len(claims) >= limit:
                    break
            return claims

        return await self._run(self._write(work))

    async def release_learning(
        self, claim: LearningClaim, *, error: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT tasks, claimed FROM learning_queue WHERE user_id = ? "
                             "AND holder = ?", (claim.user_id, claim.holder)).fetchone()
            if row is None:
                return  # no longer held: nothing of it is ours
            tasks = [*queued_tasks(row[1], claim.user_id), *queued_tasks(row[0], claim.user_id)]
            db.execute(
                "UPDATE learning_queue SET tasks = ?, claimed = '[]', holder = NULL, "
                "lease_until = NULL, attempts = attempts + ?, last_error = COALESCE(?, "
                "last_error), next_attempt_at = ?, updated_at = ? WHERE user_id = ?",
                (dumps(tasks), 1 if error is not None else 0, error,
                 (retry_at or _time.now()).isoformat(), _time.stamp(),
                 claim.user_id),
            )

        await self._run(self._write(work))

    async def learning_status(self, user_id: str) -> LearningStatus | None:
        def work(db: sqlite3.Connection) -> LearningStatus | None:
            row = db.execute(
                "SELECT tasks, claimed, dropped, attempts, last_error, next_attempt_at, holder, "
                "lease_until, created_at FROM learning_queue WHERE user_id = ?", (user_id,)
            ).fetchone()
            return None if row is None else learning_status_of(row, user_id,
                                                                 _time.stamp())

        return await self._run(work)

    async def prune_history(self, before: datetime, user_id: str | None = None) -> int:
        sql = ("DELETE FROM profile_entries WHERE superseded_at IS NOT NULL "
               "AND superseded_at < ?")
        params: tuple[Any, ...] = (before.isoformat(),)
        if user_id is not None:
            sql, params = sql + " AND user_id = ?", (*params, user_id)
        return await self._run(self._write(lambda db: db.execute(sql, params).rowcount))

    # -- export and import ----------------------------------------------------------------

    async def export_user(self, user_id: str) -> UserData:
        def work(db: sqlite3.Connection) -> UserData:
            db.execute("BEGIN")  # one snapshot of everything
            try:
                return _export(db, user_id)
            finally:
                db.execute("COMMIT")

        return await self._run(work)

    async def import_user(self, data: UserData) -> None:
        def work(db: sqlite3.Connection) -> None:
            _import(db, data, _time.stamp())
            self._windows.clear()

        await self._run(self._write(work))

    async def delete_conversation(self, conversation_id: str, user_id: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            if _find_conversation(db, conversation_id, user_id, missing=None) is None:
                return
            tasks = "SELECT task_id FROM task_workspaces WHERE conversation_id = ?"
            db.execute(f"DELETE FROM task_approvals WHERE task_id IN ({tasks})",
                       (conversation_id,))
            db.execute("DELETE FROM task_workspaces WHERE conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversation_runs WHERE conversation_id = ?",
                       (conversation_id,))
            db.execute("DELETE FROM conversation_messages WHERE conversation_id = ?",
                       (conversation_id,))
            db.execute("DELETE FROM conversations WHERE conversation_id = ? AND user_id = ?",
                       (conversation_id, user_id))
            self._windows.drop(conversation_id)

        await self._run(self._write(work))

    async def find_call(self, user_id: str, call_id: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT task_id FROM task_approvals WHERE user_id = ? AND call_id = ?",
                (user_id, call_id),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._run(work)

    async def user_generation(self, user_id: str) -> int:
        return await self._run(lambda db: _generation(db, user_id))
    # -- the HTTP service -----------------------------------------------------------------

    async def create_api_key(self, key: ApiKeyRecord) -> None:
        def work(db: sqlite3.Connection) -> None:
            try:
                db.execute(
                    "INSERT INTO api_keys (key_id, user_id, key_hash, name, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (key.key_id, key.user_id, key.key_hash, key.name,
                     (key.created_at or _time.now()).isoformat()),
                )
            except sqlite3.IntegrityError as exc:
                raise ConflictError(f"an API key {key.key_id!r} exists already") from exc

        await self._run(self._write(work))

    async def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        def work(db: sqlite3.Connection) -> ApiKeyRecord | None:
            row = db.execute(_SELECT_KEYS + " WHERE key_id = ?", (key_id,)).fetchone()
            return None if row is None else api_key_record(row)

        return await self._run(work, inline=True)  # every request of the service: one row

    async def list_api_keys(self, user_id: str | None = None) -> list[ApiKeyRecord]:
        def work(db: sqlite3.Connection) -> list[ApiKeyRecord]:
            if user_id is None:
                rows = db.execute(_SELECT_KEYS + " ORDER BY created_at, key_id")
            else:
                rows = db.execute(
                    _SELECT_KEYS + " WHERE user_id = ? ORDER BY created_at, key_id", (user_id,)
                )
            return [api_key_record(row) for row in rows]

        return await self._run(work)

    async def revoke_api_key(self, key_id: str) -> ApiKeyRecord:
        def work(db: sqlite3.Connection) -> ApiKeyRecord:
            db.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                (_time.stamp(), key_id),
            )
            row = db.execute(_SELECT_KEYS + " WHERE key_id = ?", (key_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no API key {key_id!r} (`cogency keys list` lists them)")
            return api_key_record(row)

        return await self._run(self._write(work))

    async def hold_conversation(self, conversation_id: str, user_id: str, runner: str, *,
                                existing: bool = False) -> None:
        def work(db: sqlite3.Connection) -> int:
            owner = _conversation_owner(db, conversation_id)
            if owner != user_id and (owner is not None or existing):
                raise NotFoundError(no_conversation(conversation_id, user_id))
            row = db.execute(
                "SELECT user_id, runner, epoch, lease_until FROM conversation_runs "
                "WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            if row is not None:
                holder_user, holder, epoch, until = row
                if holder == runner:
                    return int(epoch)
                if not lease_free(holder, _time.parse(until) if until else None, _time.now()):
                    if holder_user != user_id:  # another user's conversation in the making
                        raise NotFoundError(no_conversation(conversation_id, user_id))
                    raise ConversationBusyError(busy_conversation(conversation_id))
            epoch = (row[2] if row is not None else 0) + 1
            db.execute(
                "INSERT INTO conversation_runs (conversation_id, user_id, runner, epoch, "
                "lease_until, started_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(conversation_id) DO UPDATE SET user_id = excluded.user_id, "
                "runner = excluded.runner, epoch = excluded.epoch, "
                "lease_until = excluded.lease_until, started_at = excluded.started_at",
                (conversation_id, user_id, runner, epoch, self._lease_end(),
                 _time.stamp()),
            )
            return epoch

        epoch = await self._run(self._write(work, flush=False), inline=True)
        self._leases.hold_conversation(conversation_id, runner, epoch)

    async def release_conversation(self, conversation_id: str, runner: str) -> None:
        self._leases.drop_conversation(conversation_id, runner)
        try:
            await self._run(
                self._write(
                    lambda db: db.execute(
                        "UPDATE conversation_runs SET runner = NULL, lease_until = NULL "
                        "WHERE conversation_id = ? AND runner = ?",
                        (conversation_id, runner),
                    ),
                    flush=False,
                ),
                inline=True,
            )
        except BaseException:
            abandon_runner(runner)  # its row is stale from now on, whatever the database says
            raise

    async def find_conversation_by_turns(self, user_id: str, digest: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT conversation_id FROM conversations WHERE user_id = ? AND "
                "turns_digest = ? ORDER BY updated_at DESC LIMIT 1", (user_id, digest),
            ).fetchone()
            return None if row is None else row[0]

        return await self._run(work)

    # -- idempotency keys of the HTTP service ----------------------------------------------

    async def claim_request(self, record: RequestRecord, *, replace: bool = False
                            ) -> RequestRecord | None:
        def work(db: sqlite3.Connection) -> RequestRecord | None:
            stamp = _time.stamp()
            # Expired rows go (a few at a time, so no claim ever waits on a big sweep).
            db.execute("DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM "
                       "idempotency_keys WHERE expires_at < ? LIMIT 100)", (stamp,))
            row = db.execute(
                _SELECT_REQUEST + " WHERE user_id = ? AND key_hash = ?",
                (record.user_id, record.key),
            ).fetchone()
            if row is not None and row[3] >= stamp and not replace:
                return _request(row)
            db.execute(
                "INSERT OR REPLACE INTO idempotency_keys (user_id, key_hash, request_hash, "
                "task_id, conversation_id, outcome, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.user_id, record.key, record.request, record.task_id,
                 record.conversation_id,
                 None if record.outcome is None else dumps(record.outcome),
                 record.expires_at.isoformat()),
            )
            return None

        # Lost to a power loss with the run it was to start (the run's first flush keeps it).
        return await self._run(self._write(work, flush=False), inline=True)

    async def settle_request(self, user_id: str, key: str, *, task_id: str | None = None,
                             conversation_id: str | None = None,
                             outcome: dict[str, Any] | None = None) -> None:
        text = None if outcome is None else dumps(outcome)
        await self._run(self._write(lambda db: db.execute(
            "UPDATE idempotency_keys SET task_id = COALESCE(?, task_id), conversation_id = "
            "COALESCE(?, conversation_id), outcome = COALESCE(?, outcome) "
            "WHERE user_id = ? AND key_hash = ?",
            (task_id, conversation_id, text, user_id, key),
        ), flush=text is not None),  # the outcome is what a retry is answered with
            inline=text is None or _little(text, ()))

    async def drop_request(self, user_id: str, key: str) -> None:
        await self._run(self._write(lambda db: db.execute(
            "DELETE FROM idempotency_keys WHERE user_id = ? AND key_hash = ?", (user_id, key))))


_SELECT_KEYS = "SELECT key_id, user_id, key_hash, name, created_at, revoked_at FROM api_keys"
_SELECT_REQUEST = (
    "SELECT user_id, key_hash, request_hash, expires_at, task_id, conversation_id, outcome "
    "FROM idempotency_keys"
)


def _request(row: tuple[Any, ...]) -> RequestRecord:
    user_id, key, request, expires, task_id, conversation_id, outcome = row
    return RequestRecord(
        user_id, key, request, _time.parse(expires), task_id, conversation_id,
        None if outcome is None else decode(outcome, "idempotency_keys", key, "outcome"),
    )


# -- row helpers (run on the worker thread) -------------------------------------------------


def _no_task(task_id: str, user_id: str) -> str:
    return (
        f"no unfinished task {task_id!r} for user {user_id!r} "
        "(it may have completed; `cogency tasks` lists the unfinished ones)"
    )


def _owned_task(db: sqlite3.Connection, task_id: str, user_id: str) -> None:
    if db.execute(
        "SELECT 1 FROM task_workspaces WHERE task_id = ? AND user_id = ?", (task_id, user_id)
    ).fetchone() is None:
        raise NotFoundError(_no_task(task_id, user_id))


def _approvals(
    db: sqlite3.Connection, task_ids: Sequence[str], status: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The approval rows of these tasks (in ``status`` when given), by task, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for start in range(0, len(task_ids), 500):  # within SQLite's bound-parameter limit
        chunk = list(task_ids[start : start + 500])
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT {APPROVAL_COLUMNS} FROM task_approvals WHERE task_id IN ({marks})"
        if status is not None:
            sql += " AND status = ?"
            chunk.append(status)
        for row in db.execute(sql + " ORDER BY task_id, position", chunk):
            found.setdefault(row[1], []).append(approval_record(row))
    return found


def _record_approvals(db: sqlite3.Connection, batch: SaveBatch, stamp: str) -> None:
    (last,) = db.execute(
        "SELECT COALESCE(MAX(position), 0) FROM task_approvals WHERE task_id = ?",
        (batch.task_id,),
    ).fetchone()
    db.executemany(
        # OR IGNORE: a save retried after an unknown outcome stores each call once.
        "INSERT OR IGNORE INTO task_approvals (task_id, call_id, user_id, position, call_data, "
        "status, created_at, decider) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
        [(batch.task_id, call["id"], batch.user_id, last + number, approval_data(call), stamp,
          call.get("decider", "person"))
         for number, call in enumerate(batch.approvals, start=1)],
    )
    db.executemany(
        "UPDATE task_approvals SET status = 'done' WHERE task_id = ? AND call_id = ?",
        [(batch.task_id, call_id) for call_id in batch.settled],
    )


def _ensure_profile(db: sqlite3.Connection, user_id: str, stamp: str) -> None:
    db.execute(
        "INSERT OR IGNORE INTO user_profiles (user_id, profile_data, updated_at) VALUES (?, ?, ?)",
        (user_id, dumps(Profile(user_id).to_dict()), stamp),
    )


def _generation(db: sqlite3.Connection, user_id: str) -> int:
    row = db.execute(
        "SELECT generation FROM user_generations WHERE user_key = ?", (generation_key(user_id),)
    ).fetchone()
    return 0 if row is None else int(row[0])


def _put_profile(db: sqlite3.Connection, profile: Profile, stamp: str) -> None:
    db.execute(
        "INSERT INTO user_profiles (user_id, profile_data, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT(user_id) DO UPDATE SET profile_data = excluded.profile_data, "
        "updated_at = excluded.updated_at",
        (profile.user_id, dumps(profile.to_dict()), stamp),
    )


def _change_profile(db: sqlite3.Connection, user_id: str,
                    change: Callable[[ProfileBook], Any], stamp: str) -> ProfileBook:
    """Read the profile and its current entries, apply ``change``, write what it changed:
    the one place that writes ``profile_entries`` and ``profile_data`` together."""
    row = db.execute(
        "SELECT profile_data FROM user_profiles WHERE user_id = ?", (user_id,)
    ).fetchone()
    book = book_of(None if row is None else decode_profile(row[0], user_id), user_id,
                   _entries(db, user_id))
    change(book)
    _put_profile(db, book.finish(), stamp)
    db.executemany(f"INSERT INTO profile_entries ({ENTRY_COLUMNS}) VALUES "
                   f"({', '.join('?' * 15)})", [entry_row(e) for e in book.added])
    db.executemany(
        "UPDATE profile_entries SET " + ENTRY_UPDATE.format(*"???????")
        + " WHERE entry_id = ? AND user_id = ?",
        [entry_changes(e) for e in book.changed.values()],
    )
    return book


def _entries(db: sqlite3.Connection, user_id: str, *, history: bool = False
             ) -> list[ProfileEntry]:
    if history:
        sql = " WHERE user_id = ? ORDER BY created_at, rank"
    else:
        sql = " WHERE user_id = ? AND superseded_at IS NULL ORDER BY rank"
    return [entry_record(row) for row in
            db.execute(f"SELECT {ENTRY_COLUMNS} FROM profile_entries" + sql, (user_id,))]


def _queue_learning(db: sqlite3.Connection, batch: SaveBatch, stamp: str) -> None:
    """Queue the completed task for learning: one row per user, its tasks bounded."""
    row = db.execute("SELECT tasks, claimed FROM learning_queue WHERE user_id = ?",
                     (batch.user_id,)).fetchone()
    tasks, over = queue_task(
        [] if row is None else queued_tasks(row[0], batch.user_id),
        [] if row is None else queued_tasks(row[1], batch.user_id), batch, stamp)
    # A new task makes the user's learning due now, also after failures (as each new
    # interaction did before learning was durable): at most one attempt per interaction.
    db.execute(
        "INSERT INTO learning_queue (user_id, tasks, dropped, next_attempt_at, created_at, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(user_id) DO UPDATE SET "
        "tasks = excluded.tasks, dropped = dropped + excluded.dropped, "
        "next_attempt_at = excluded.next_attempt_at, updated_at = excluded.updated_at",
        (batch.user_id, dumps(tasks), over, stamp, stamp, stamp),
    )


def _claimed(db: sqlite3.Connection, claim: LearningClaim) -> list[dict[str, Any]]:
    """What stays queued besides a claim this holder still holds; else ``ClaimLostError``."""
    row = db.execute("SELECT tasks, holder FROM learning_queue WHERE user_id = ?",
                     (claim.user_id,)).fetchone()
    if row is None or row[1] != claim.holder:
        raise claim_lost(claim)
    return queued_tasks(row[0], claim.user_id)


def _finish_claim(db: sqlite3.Connection, claim: LearningClaim,
                  queued: list[dict[str, Any]], stamp: str) -> None:
    if not queued:
        db.execute("DELETE FROM learning_queue WHERE user_id = ?", (claim.user_id,))
        return
    db.execute(
        "UPDATE learning_queue SET claimed = '[]', holder = NULL, lease_until = NULL, "
        "attempts = 0, last_error = NULL, dropped = 0, next_attempt_at = ?, updated_at = ? "
        "WHERE user_id = ?",
        (stamp, stamp, claim.user_id),
    )


def _export(db: sqlite3.Connection, user_id: str) -> UserData:
    row = db.execute("SELECT profile_data FROM user_profiles WHERE user_id = ?",
                     (user_id,)).fetchone()
    conversations = []
    for record in map(conversation_record, db.execute(
            "SELECT conversation_id, user_id, conversation_data, message_count, updated_at "
            "FROM conversations WHERE user_id = ? ORDER BY updated_at, conversation_id",
            (user_id,)).fetchall()):
        messages = [_message(m) for m in db.execute(
            _SELECT_MESSAGES + " ORDER BY seq", (record.conversation_id,))]
        conversations.append(ConversationData(record.conversation_id, record.data,
                                              record.updated_at, messages))
    tasks = [task_record(r) for r in db.execute(
        _TASK_COLUMNS + " WHERE user_id = ? ORDER BY updated_at, task_id", (user_id,))]
    approvals = _approvals(db, [task.task_id for task in tasks])
    queued = db.execute("SELECT claimed, tasks FROM learning_queue WHERE user_id = ?",
                        (user_id,)).fetchone()
    return UserData(
        user_id, None if row is None else decode_profile(row[0], user_id),
        _entries(db, user_id, history=True), conversations,
        [TaskData(t.task_id, t.conversation_id, t.query, t.workspace, t.settings, t.version,
                  t.updated_at, approvals.get(t.task_id, [])) for t in tasks],
        [] if queued is None else [*queued_tasks(queued[0], user_id),
                                   *queued_tasks(queued[1], user_id)],
    )


def _import(db: sqlite3.Connection, data: UserData, stamp: str) -> None:
    user = data.user_id
    if db.execute("SELECT 1 FROM user_profiles WHERE user_id = ? UNION ALL "
                  "SELECT 1 FROM conversations WHERE user_id = ?", (user, user)).fetchone():
        raise import_conflict(user, "the store already holds data of this user")
    # Ids are unique across the store's users, and this user holds nothing: an id found is
    # another user's.
    for conversation in data.conversations:
        if _conversation_owner(db, conversation.conversation_id) is not None:
            raise import_taken(user, "conversation", conversation.conversation_id)
    for task in data.tasks:
        if db.execute("SELECT 1 FROM task_workspaces WHERE task_id = ?",
                      (task.task_id,)).fetchone():
            raise import_taken(user, "task", task.task_id)
    profile = data.profile or Profile(user)
    _put_profile(db, profile, stamp)
    try:
        db.executemany(f"INSERT INTO profile_entries ({ENTRY_COLUMNS}) VALUES "
                       f"({', '.join('?' * 15)})", [entry_row(e) for e in data.entries])
    except sqlite3.IntegrityError as exc:
        raise import_taken(user, "profile entry", None) from exc
    for conversation in data.conversations:
        db.execute(
            "INSERT INTO conversations (conversation_id, user_id, conversation_data, updated_at, "
            "message_count, turns_digest) VALUES (?, ?, ?, ?, ?, ?)",
            (conversation.conversation_id, user, dumps(conversation.data),
             (conversation.updated_at.isoformat() if conversation.updated_at else stamp),
             len(conversation.messages), conversation.turns_digest()),
        )
        db.executemany(
            "INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, "
            "tokens, created_at, message_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(conversation.conversation_id, seq, m["role"], m["content"], m.get("task_id"),
              m.get("tokens", 0), m.get("created_at") or stamp, m.get("id"))
             for seq, m in enumerate(conversation.messages, start=1)],
        )
    for task in data.tasks:
        db.execute(
            "INSERT INTO task_workspaces (task_id, user_id, conversation_id, query, "
            "workspace_data, version, updated_at, epoch, settings) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
            (task.task_id, user, task.conversation_id, task.query, dumps(task.workspace),
             task.version, task.updated_at.isoformat() if task.updated_at else stamp,
             dumps(task.settings)),
        )
        db.executemany(
            "INSERT INTO task_approvals (task_id, call_id, user_id, position, call_data, "
            "status, created_at, decided_at, decider, output) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(task.task_id, call["id"], user, position, approval_data(call), call["status"],
              call.get("created_at") or stamp, call.get("decided_at"),
              call.get("decider", "person"), call.get("output"))
             for position, call in enumerate(task.approvals, start=1)],
        )
    if data.learning:
        db.execute(
            "INSERT INTO learning_queue (user_id, tasks, next_attempt_at, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?)",
            (user, dumps(data.learning), stamp, stamp, stamp),
        )


def _conversation_owner(db: sqlite3.Connection, conversation_id: str) -> str | None:
    row = db.execute(
        "SELECT user_id FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return None if row is None else row[0]


def _find_conversation(
    db: sqlite3.Connection, conversation_id: str, user_id: str, missing: type[Exception] | None
) -> Any:
    row = db.execute(
        "SELECT conversation_id, user_id, conversation_data, message_count, updated_at "
        "FROM conversations WHERE conversation_id = ? AND user_id = ?",
        (conversation_id, user_id),
    ).fetchone()
    if row is None:
        if missing is None:
            return None
        raise missing(no_conversation(conversation_id, user_id))
    return conversation_record(row)


Seen = tuple[int, "str | None"]
"""A message's seq and its ``created_at`` (``None``: there is no such message)."""


def _find_windowed(
    db: sqlite3.Connection, windows: _Windows, conversation_id: str, user_id: str,
    budget: int, missing: type[Exception] | None,
) -> tuple[ConversationRecord | None, Seen | None]:
    """:func:`_find_conversation`, reading in the same statement what checks the window
    ``windows`` has cached of it for ``budget`` (if any): the ``created_at`` of the last
    message that window saw (see :meth:`_Windows.load`)."""
    entry = windows.get(conversation_id, budget)
    if entry is None or entry.last_seq == 0:
        return _find_conversation(db, conversation_id, user_id, missing), None
    row = db.execute(
        f"SELECT {_RECORD_AND_STAMP} FROM conversations WHERE conversation_id = ? AND user_id = ?",
        (conversation_id, entry.last_seq, conversation_id, user_id),
    ).fetchone()
    if row is None:
        if missing is None:
            return None, None
        raise missing(no_conversation(conversation_id, user_id))
    return conversation_record(row[:5]), (entry.last_seq, row[5])


def _check_hold(db: sqlite3.Connection, conversation_id: str, epoch: int) -> None:
    """Raise unless the conversation's hold still has ``epoch`` (nobody took it meanwhile)."""
    row = db.execute(
        "SELECT epoch FROM conversation_runs WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    if row is None or row[0] != epoch:
        raise hold_lost(conversation_id)


def _check_task(db: sqlite3.Connection, batch: SaveBatch) -> int | None:
    """The version to write over, after the fence and version checks; ``None`` when the row is
    gone because an earlier attempt of this completing save landed.

    A completing save deletes the row here, reading what it checks as it goes: a check that
    fails raises, and the transaction's rollback keeps the row (nothing else of the batch may
    need it: its approvals would go with it, by the cascade, so a completion stores none)."""
    row = db.execute(
        "DELETE FROM task_workspaces WHERE task_id = ? AND user_id = ? "
        "RETURNING version, epoch, last_save" if batch.complete else
        "SELECT version, epoch, last_save FROM task_workspaces WHERE task_id = ? AND user_id = ?",
        (batch.task_id, batch.user_id),
    ).fetchone()
    if row is None:
        if batch.complete and batch.messages and len(_stored(db, batch)) == len(batch.messages):
            return None
        if batch.epoch is not None:
            raise lease_lost(batch.task_id)
        raise NotFoundError(no_workspace(batch))
    version, epoch, last_save = row
    if batch.epoch is not None and epoch != batch.epoch:
        raise lease_lost(batch.task_id)
    if batch.workspace is None and not batch.complete or version == batch.expected_version:
        return int(version)
    if batch.save_id and last_save == batch.save_id and version == batch.expected_version + 1:
        return batch.expected_version  # this save's earlier attempt landed: write it again
    raise ConflictError(conflict(batch, version))


def _stored(db: sqlite3.Connection, batch: SaveBatch) -> dict[str, int]:
    """message id -> seq of the batch's messages already stored (by an earlier attempt)."""
    ids = [m["id"] for m in batch.messages if m.get("id")]
    if not ids:
        return {}
    rows = db.execute(
        "SELECT message_id, seq FROM conversation_messages WHERE conversation_id = ? "
        f"AND message_id IN ({', '.join('?' * len(ids))})",
        (batch.conversation_id, *ids),
    )
    return dict(rows.fetchall())


class _Stored(Exception):
    """A save that did not look for its messages met one stored already (an earlier attempt
    of it landed unseen): its transaction is rolled back, and it runs again looking."""


def _append(db: sqlite3.Connection, batch: SaveBatch, stamp: str, *, new: bool = False,
            look: bool = True) -> list[dict[str, Any]]:
    """Store the batch's messages not stored yet; returns the rows written, as read back.
    ``new``: the messages of a task this transaction creates, so none can be stored yet.
    ``look=False`` stores every message without looking for those stored by an earlier
    attempt: the unique index on message ids finds any, and :class:`_Stored` is raised (the
    caller rolls back and saves again, looking), so nothing is ever stored twice."""
    stored = {} if new or not look else _stored(db, batch)
    fresh = [m for m in batch.messages if m.get("id") not in stored] if stored else batch.messages
    for message in batch.messages:
        if message.get("id") in stored:
            message["seq"] = stored[message["id"]]
    if not fresh:
        return []
    row = db.execute(*_bump(batch.conversation_id, batch.user_id, fresh, stamp)).fetchone()
    if row is None:
        raise NotFoundError(no_conversation(batch.conversation_id, batch.user_id))
    return _insert(db, batch.conversation_id, fresh, row[0], stamp,
                   guard=not new and not look)


def _bump(conversation_id: str, user_id: str, fresh: Sequence[dict[str, Any]], stamp: str,
          returning: str = "message_count", extra: tuple[Any, ...] = ()
          ) -> tuple[str, tuple[Any, ...]]:
    """The statement (and its parameters) that bumps the conversation's counter for
    ``fresh``, taking their seq range (BEGIN IMMEDIATE serializes writers), and chains its
    turns digest with theirs (messages that are no turns leave it as it is); it returns
    ``returning`` of the row (``extra``: that clause's parameters)."""
    turns = "".join(piece for m in fresh if (piece := turn_hash(m["role"], m["content"])))
    chain = f", turns_digest = {CHAIN_TURNS}(turns_digest, ?)" if turns else ""
    return (
        f"UPDATE conversations SET message_count = message_count + ?, updated_at = ?{chain} "
        f"WHERE conversation_id = ? AND user_id = ? RETURNING {returning}",
        (len(fresh), stamp, *((turns,) if turns else ()), conversation_id, user_id, *extra),
    )


_RECORD_AND_STAMP = (
    "conversation_id, user_id, conversation_data, message_count, updated_at, "
    "(SELECT created_at FROM conversation_messages WHERE conversation_id = ? AND seq = ?)"
)
"""The conversation's record, and the ``created_at`` of a message (the last one its cached
window saw): what :func:`_bump` returns for ``begin_task``, and what :func:`_find_windowed`
reads."""


def _insert(db: sqlite3.Connection, conversation_id: str, fresh: Sequence[dict[str, Any]],
            count: int, stamp: str, *, guard: bool = False) -> list[dict[str, Any]]:
    """Store ``fresh`` as the conversation's newest messages, ``count`` its messages with
    them; returns the rows written. ``guard``: one of them stored already raises
    :class:`_Stored` (see :func:`_append`)."""
    first = count - len(fresh) + 1
    for offset, message in enumerate(fresh):
        message["seq"] = first + offset
    rows = [(m["seq"], m["role"], m["content"], m.get("task_id"), m.get("tokens", 0),
             m.get("created_at") or stamp, m.get("id")) for m in fresh]
    try:
        db.executemany(
            "INSERT INTO conversation_messages (conversation_id, seq, role, content, task_id, "
            "tokens, created_at, message_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(conversation_id, *row) for row in rows],
        )
    except sqlite3.IntegrityError as exc:
        if guard and "message_id" in str(exc):
            raise _Stored() from exc
        raise
    return [_message(row) for row in rows]


def _chain_turns(digest: str | None, turns: str) -> str | None:
    """:data:`CHAIN_TURNS`: ``digest`` with the turns of ``turns`` (their hashes, 64 hex
    digits each, joined) added in order, as ``base.chain_turns``."""
    return chain_turns(digest, (turns[at : at + 64] for at in range(0, len(turns), 64)))


_TASK_COLUMNS = (
    "SELECT task_id, user_id, conversation_id, query, workspace_data, version, runner, "
    "updated_at, epoch, settings FROM task_workspaces"
)
_SELECT_MESSAGES = (
    "SELECT seq, role, content, task_id, tokens, created_at, message_id "
    "FROM conversation_messages WHERE conversation_id = ?"
)
_RECOUNTED = (  # a message's exact count in place of the upper bound it was stored with
    "UPDATE conversation_messages SET tokens = ? WHERE conversation_id = ? AND seq = ? "
    "AND tokens = ?"
)


def _message(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, role, content, task_id, tokens, created, message_id = row
    return {"role": role, "content": content, "seq": seq, "task_id": task_id, "tokens": tokens,
            "created_at": created, "id": message_id}


def _window(
    rows: Iterable[tuple[Any, ...]], token_budget: int | None, limit: int | None
) -> list[dict[str, Any]]:
    fit = Newest(token_budget, limit)
    for row in rows:
        if not fit.take(_message(row)):
            break
    return fit.picked[::-1]


class _Windows(Windows):
    """The windows of recently used conversations, brought up to date by reading only the
    rows after the last ``seq`` each saw: loading history costs the same at turn 10 and turn
    100,000 however many messages fit the budget."""

    def __init__(self) -> None:
        super().__init__()
        self._tails: dict[str, list[dict[str, Any]]] = {}
        """Rows this store committed after a cached window's last, in order: the next load
        takes them as written instead of reading them back (and counts nothing before)."""

    def note(self, conversation_id: str, appended: Sequence[dict[str, Any]]) -> None:
        """Keep ``appended``, rows a commit just wrote, for the conversation's cached window
        (if any) when they follow what it has seen or kept (called after the commit)."""
        entry = self._entries.get(conversation_id)
        if entry is None or not appended:
            return
        tail = self._tails.get(conversation_id, [])
        if appended[0]["seq"] == (tail[-1]["seq"] if tail else entry.last_seq) + 1:
            self._tails[conversation_id] = [*tail, *appended]
        elif appended[0]["seq"] == entry.last_seq + 1:
            self._tails[conversation_id] = list(appended)
        else:
            self._tails.pop(conversation_id, None)

    def drop(self, conversation_id: str) -> None:
        super().drop(conversation_id)
        self._tails.pop(conversation_id, None)

    def clear(self) -> None:
        super().clear()
        self._tails.clear()

    def load(self, db: sqlite3.Connection, record: ConversationRecord, budget: int,
             appended: Sequence[dict[str, Any]] = (), seen: Seen | None = None) -> History:
        """The window of ``record``'s conversation; ``appended``: the rows this transaction
        just wrote (as :func:`_append` returns them), the newest of the conversation, used
        as they are when they are all the window has not seen. ``seen``: the seq and
        ``created_at`` of a message as this transaction read them (``_find_windowed``)."""
        key = record.conversation_id
        entry = self.get(key, budget)
        known = [*self._tails.pop(key, ()), *appended]
        stored: dict[int, int] = {}  # seq -> tokens as stored, of the messages read here
        if entry is None or not _still_valid(db, record, entry, seen):
            rows = db.execute(_SELECT_MESSAGES + " ORDER BY seq DESC", (key,))
            messages = [_message(row) for row in rows.fetchmany(1)]
            last_seq, last_stamp = (
                (messages[0]["seq"], messages[0]["created_at"]) if messages else (0, ""))

            def read() -> Iterator[dict[str, Any]]:
                for message in chain(messages, map(_message, rows)):
                    stored[message["seq"]] = message["tokens"]
                    yield message

            entry = Window.newest(budget, read(), last_seq, last_stamp)
        elif record.message_count > entry.last_seq:
            if (known and known[0]["seq"] == entry.last_seq + 1
                    and known[-1]["seq"] == record.message_count
                    and all(b["seq"] == a["seq"] + 1 for a, b in zip(known, known[1:]))):
                fresh = known  # no need to read back what was just written
            else:
                fresh = [
                    _message(row)
                    for row in db.execute(
                        _SELECT_MESSAGES + " AND seq > ? ORDER BY seq", (key, entry.last_seq)
                    )
                ]
            if fresh:
                stored = counts_held(entry, fresh)
                entry = entry.advanced(fresh, fresh[-1]["seq"], fresh[-1]["created_at"])
        counts = recounted(stored, entry)
        if counts and db.in_transaction:  # (begin_task's write: a read stores nothing)
            db.executemany(_RECOUNTED, [(exact, key, seq, bound) for seq, exact, bound in counts])
        return self.put(key, entry)


def _still_valid(db: sqlite3.Connection, record: ConversationRecord, entry: Window,
                 seen: Seen | None = None) -> bool:
    # The last message seen is still there unchanged (a conversation erased and re-created
    # under the same id is read afresh).
    if record.message_count < entry.last_seq:
        return False
    if entry.last_seq == 0:
        return True
    if seen is not None and seen[0] == entry.last_seq:
        return seen[1] == entry.last_stamp  # read with the conversation's row
    row = db.execute(
        "SELECT created_at FROM conversation_messages WHERE conversation_id = ? AND seq = ?",
        (record.conversation_id, entry.last_seq),
    ).fetchone()
    return row is not None and row[0] == entry.last_stamp


class _Worker:
    """The store's one worker thread: runs the jobs handed to it in order, each caller told
    on its own event loop. (``ThreadPoolExecutor`` does the same with two more thread
    switches per job: its caller is woken while the worker still holds the GIL.)"""

    def __init__(self, name: str = "cogency-sqlite") -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.Future[Any] | None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], T]) -> asyncio.Future[T]:
        told: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((job, told))
        return told

    def post(self, job: Callable[[], None]) -> None:
        """``job``, which tells its callers itself and raises nothing: no event loop is
        woken when it ends."""
        self._jobs.put((job, None))

    def stop(self) -> None:
        """No more jobs: the thread ends once those handed before have run."""
        self._jobs.put(None)

    def _work(self) -> None:
        take = self._jobs.get
        while (handed := take()) is not None:
            job, told = handed
            if told is None:  # posted: it tells its callers itself
                job()
                del handed, job
                continue
            try:
                outcome: tuple[Any, BaseException | None] = (job(), None)
            except BaseException as exc:  # noqa: BLE001 - its caller's
                outcome = (None, exc)
            _settle_soon(told, *outcome)  # (its loop closed: no one to tell)
            del handed, job, told, outcome  # nothing kept alive while waiting for the next


def _settle(told: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """On the loop: a caller told its outcome (unless it stopped waiting)."""
    if told.done():
        return
    if exc is None:
        told.set_result(result)
    else:
        told.set_exception(exc)


class _Flushing(Generic[T]):
    """A write transaction whose caller is told once a flush made it durable
    (``synchronous="full"``; ``SQLiteStore._owe_flush``)."""

    __slots__ = ("transaction",)

    def __init__(self, transaction: Callable[[sqlite3.Connection], T]) -> None:
        self.transaction = transaction

    def __call__(self, db: sqlite3.Connection) -> T:
        return self.transaction(db)


def _settle_soon(told: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """From any thread: a caller told its outcome on its own event loop (none if closed)."""
    with contextlib.suppress(RuntimeError):
        told.get_loop().call_soon_threadsafe(_settle, told, result, exc)


class _Busy(Exception):
    """A call on the event loop met a lock held by another connection: it goes to the worker
    thread to wait for it there (``SQLiteStore._run``)."""


def _locked(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _little(text: str, messages: Sequence[Mapping[str, Any]],
            workspace: Mapping[str, Any] | None = None) -> bool:
    """Whether a call's text is short enough to be written on the event loop."""
    size = len(text) + sum(len(m.get("content") or "") for m in messages)
    if workspace:
        size += sum(len(str(value)) for value in workspace.values())
    return size < INLINE_CHARACTERS


def _storage_error(exc: sqlite3.Error, path: str) -> StorageError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreLockedError(
            f"the database {path!r} stayed locked ({text}); another process holds a write lock "
            "too long: retry, or raise busy_timeout"
        )
    if "full" in text:
        return StorageError(f"the disk holding {path!r} is full ({text}); free space and retry")
    if "not a database" in text or "malformed" in text:
        return StorageError(f"{path!r} is not a usable SQLite database ({text})")
    if "unable to open" in text or "readonly" in text:
        return StorageError(
            f"cannot open the database {path!r} for writing ({text}); check the path and "
            "its permissions"
        )
    return StorageError(f"database error on {path!r}: {text}")
