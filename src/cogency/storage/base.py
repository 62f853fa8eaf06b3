"""The storage contract every backend implements, and the records it passes."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from .. import _time
from .._ids import new_hex
from .._json import dumps, loads
from ..errors import (
    ClaimLostError,
    ConflictError,
    CorruptDataError,
    LeaseLostError,
    SchemaTooNewError,
    StorageError,
    TaskRunningError,
)
from ..memory.entries import ProfileBook, ProfileEntry
from ..memory.profile import Profile

MIGRATION_NAMES = (
    "m001_initial",
    "m002_conversation_messages",
    "m003_task_workspace_columns",
    "m004_run_leases",
    "m005_forget_generation",
    "m006_approvals",
    "m007_service",
    "m008_task_settings",
    "m009_client_tool_calls",
    "m010_idempotency_keys",
    "m011_conversation_turns",
    "m012_leases_as_rows",
    "m013_row_level_security",
    "m014_profile_entries",
    "m015_learning_queue",
)
"""Ordered schema steps; every backend applies the same names in this order."""

PROFILE_ENTRIES_TABLE = """
CREATE TABLE profile_entries (
    entry_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES user_profiles(user_id) ON DELETE CASCADE,
    field TEXT NOT NULL,                 -- the Profile field: goals, preferences, ...
    entry_key TEXT NOT NULL DEFAULT '',  -- a preference's or project's name; '' elsewhere
    value TEXT NOT NULL,
    origin TEXT NOT NULL,                -- learned, consolidated, or user (set by the
                                         -- user: learning never replaces or drops it)
    model TEXT,                          -- the model that wrote the value (NULL: a person)
    sources TEXT NOT NULL,               -- JSON list: {task_id, conversation_id,
                                         -- message_ids, at, model} it was learned from
    sources_omitted INTEGER NOT NULL DEFAULT 0,  -- sources past the kept ones
    rank INTEGER NOT NULL,               -- order within its field: newest highest
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    superseded_at TEXT,                  -- NULL while current; then history, out of the
                                         -- prompt, pruned after the retention time
    superseded_by TEXT,                  -- the entry that replaced it (NULL: dropped)
    reason TEXT                          -- why it is history (memory.entries.REASONS)
);
CREATE INDEX profile_entries_by_user ON profile_entries(user_id, superseded_at);
CREATE INDEX profile_entries_history ON profile_entries(superseded_at)
    WHERE superseded_at IS NOT NULL;     -- pruning finds old history without a scan
"""
"""Migration ``m014_profile_entries`` on every backend: each fact of a profile as a row, where
it was learned (the tasks and messages it came from, when, with which model), who set it, and
once superseded, when, why and by what. ``profile_data`` stays the projection of the current
entries (what the prompt quotes)."""

LEARNING_QUEUE_TABLE = """
CREATE TABLE learning_queue (
    user_id TEXT PRIMARY KEY REFERENCES user_profiles(user_id) ON DELETE CASCADE,
    tasks TEXT NOT NULL,                 -- JSON list of finished tasks to learn from,
                                         -- oldest first: {task_id, conversation_id, at}
    claimed TEXT NOT NULL DEFAULT '[]',  -- the tasks the holder is learning (same shape):
                                         -- back to the queue if it gives up or dies
    dropped INTEGER NOT NULL DEFAULT 0,  -- tasks left out: more were queued than kept
    attempts INTEGER NOT NULL DEFAULT 0, -- failed attempts since learning last succeeded
    last_error TEXT,                     -- what the last failed attempt said
    next_attempt_at TEXT NOT NULL,       -- not claimed before (back-off after failures)
    holder TEXT,                         -- the process learning it (host|pid|start|token)
    lease_until TEXT,                    -- its claim lapses then (or when it dies)
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX learning_queue_due ON learning_queue(next_attempt_at);
"""
"""Migration ``m015_learning_queue`` on every backend: learning as durable work. A task that
completes with memory on is queued here in the transaction that completes it, and any process
with memory on claims the row (a lease) and learns it, so a crash between an answer and its
learning loses nothing. One row per user: a user's queued tasks are learned together, and
their number is bounded."""


IDEMPOTENCY_KEYS_TABLE = """
CREATE TABLE idempotency_keys (
    user_id TEXT NOT NULL,               -- a key is its user's: scoped by it
    key_hash TEXT NOT NULL,              -- SHA-256 of the key (never the key itself)
    request_hash TEXT NOT NULL,          -- SHA-256 of the request: another is refused
    task_id TEXT,                        -- the run it started, once begun
    conversation_id TEXT,
    outcome TEXT,                        -- JSON: what it was answered, once over
    expires_at {timestamp} NOT NULL,     -- then the key may start a run again
    PRIMARY KEY (user_id, key_hash)
);
CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys(expires_at);
"""
"""Migration ``m010_idempotency_keys`` on every backend, ``{timestamp}`` its time type (TEXT
in ISO 8601 on SQLite): the HTTP service's idempotency keys, so a retried request (same key)
gets the answer of the run the first one started, on any replica and after a restart, never a
second run."""


CONVERSATION_RUNS_TABLE = """
CREATE TABLE conversation_runs (
    conversation_id TEXT PRIMARY KEY,    -- one run at a time per conversation, across
    user_id TEXT NOT NULL,               -- every process on this database
    runner TEXT,                         -- host|pid|start|token; NULL: not held
    epoch INTEGER NOT NULL DEFAULT 0,    -- bumped by each take and force release
    lease_until {timestamp},             -- the hold lapses then unless renewed
    started_at {timestamp} NOT NULL
);
CREATE INDEX conversation_runs_by_user ON conversation_runs(user_id);
ALTER TABLE task_workspaces DROP COLUMN lease_holder;
"""
"""Migration ``m012_leases_as_rows`` on every backend, ``{timestamp}`` its time type: a
conversation is held by a row with an epoch and an expiry its store renews (a task by
columns of its ``task_workspaces`` row), instead of PostgreSQL's session advisory locks,
whose key ``lease_holder`` kept."""


@dataclass
class TaskRecord:
    """One row of ``task_workspaces``: an unfinished task and its working memory."""

    task_id: str
    user_id: str
    conversation_id: str
    query: str
    workspace: dict[str, Any]
    version: int = 1
    runner: str | None = None
    updated_at: datetime | None = None
    epoch: int = 0
    """Bumped by every claim and force-release: the writes of a run carry the epoch its claim
    returned, and are refused once the row has another (the run lost its hold)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What the task's starter stored to run it again (the CLI: its tools, root and model)."""
    pending_approvals: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls this task waits on a person to allow (see :data:`APPROVAL_STATUSES`);
    filled by ``load_task`` and ``list_tasks``."""


APPROVAL_STATUSES = ("pending", "approved", "denied", "running", "answered", "done")
"""The life of a tool call that waits (see :data:`DECIDERS`): ``pending`` until decided. A
person's call is then ``approved`` or ``denied``, and an approved call is marked ``running``
before it starts, so it never starts twice; a client's call is ``answered`` when its result
(``output``) arrives. ``done`` once its result (or the denial) is stored in the
conversation."""
DECIDERS = ("person", "client")
"""Who decides a waiting call: a ``person`` approves or denies it (a tool that needs
approval); the ``client`` runs it and sends its result (a tool the client declared)."""


@dataclass
class ConversationRecord:
    """One row of ``conversations``; messages are read separately, windowed.

    ``recent`` holds the newest messages when :meth:`Store.begin_task` was asked for them.
    """

    conversation_id: str
    user_id: str
    data: dict[str, Any]
    message_count: int = 0
    updated_at: datetime | None = None
    recent: list[dict[str, Any]] | None = None


@dataclass
class SaveBatch:
    """Everything one autosave writes, in one transaction.

    ``messages`` are appended (each dict gets its ``seq``) unless a message with the same
    ``id`` is already stored: a retry after an unknown outcome stores nothing twice.
    ``workspace`` is written only when given, and only if the row still has
    ``expected_version`` (or holds the version this same ``save_id`` wrote, when an earlier
    attempt landed unseen); ``complete`` deletes the workspace. With ``epoch`` set, the whole
    batch is refused (:class:`~cogency.errors.LeaseLostError`) unless the task row still has
    that lease epoch. ``approvals`` (``{"id", "name", "args", "decider"}`` each, the decider
    ``"person"`` when not given) are stored as waiting calls (once, on a retry too); ``settled`` names calls whose result is among
    ``messages`` (their status becomes ``done``).
    """

    user_id: str
    task_id: str
    conversation_id: str
    expected_version: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    workspace: dict[str, Any] | None = None
    profile: Profile | None = None
    complete: bool = False
    epoch: int | None = None
    save_id: str | None = None
    approvals: list[dict[str, Any]] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    learn: bool = False
    """With ``complete``: queue the task for learning in the same transaction (the user's
    ``learning_queue`` row; see :data:`MAX_PENDING_TASKS`). Only when memory is on."""
    trace: dict[str, str] | None = None
    """With ``learn``: the run's trace link (``_telemetry.trace_link()``), queued with the
    task so that its learning, in whatever process, links to the run."""


MAX_PENDING_TASKS = 20
"""Finished tasks one user's ``learning_queue`` row holds; when more wait, the oldest are
left out (and counted: ``LearningStatus.dropped``)."""
LEARN_BATCH = MAX_PENDING_TASKS
"""Tasks one claim takes, learned together in one model call: all of a user's queued tasks."""
LEARN_LEASE = 600.0
"""Seconds a claim on a user's learning lasts (longer than a model call may take); a claim
whose process is gone (on this host) lapses at once."""


@dataclass
class LearningClaim:
    """A user's queued learning, held by ``holder`` until released or finished.

    ``tasks`` are the finished tasks to learn from (``{"task_id", "conversation_id", "at"}``,
    oldest first). Finishing it (``Store.change_profile(..., claim=)``) takes exactly these
    off the queue in the transaction that stores what was learned, so each task is learned
    once; a claim taken over meanwhile (it lapsed, the user was forgotten) writes nothing.
    """

    user_id: str
    holder: str
    tasks: list[dict[str, Any]]
    attempts: int = 0
    dropped: int = 0


@dataclass
class LearningStatus:
    """What waits to be learned about a user (``Store.learning_status``)."""

    user_id: str
    pending: int
    """Finished tasks queued, not learned yet."""
    dropped: int = 0
    """Tasks left out because more than :data:`MAX_PENDING_TASKS` waited."""
    attempts: int = 0
    """Attempts that failed since learning last succeeded."""
    last_error: str | None = None
    next_attempt_at: datetime | None = None
    claimed: bool = False
    """A process is learning it now."""
    since: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "dropped": self.dropped, "attempts": self.attempts,
                "last_error": self.last_error, "claimed": self.claimed,
                "next_attempt_at": _iso(self.next_attempt_at), "since": _iso(self.since)}


@dataclass
class ForgetReceipt:
    """What ``forget`` erased, per kind: counts of the rows that were there.

    ``generation`` is the user's generation now: learning that began under an older one
    (in flight in any process) never writes. ``tool_directory`` is the directory of the
    user's tools that was removed, for an agent that keeps one per user
    (``cogency.agent.forget_user`` sets it; ``None``: there was none; with tools under
    several roots, each directory removed, joined by ``os.pathsep``), and ``tool_files``
    how many files and directories it held.
    """

    user_id: str
    generation: int
    profiles: int = 0
    entries: int = 0
    history: int = 0
    conversations: int = 0
    messages: int = 0
    tasks: int = 0
    approvals: int = 0
    pending_learning: int = 0
    tool_directory: str | None = None
    tool_files: int = 0
    """Files and directories the removed ``tool_directory`` held."""

    KINDS = ("profiles", "entries", "history", "conversations", "messages", "tasks",
             "approvals", "pending_learning")

    def erased(self) -> dict[str, int]:
        return {kind: getattr(self, kind) for kind in self.KINDS}

    def to_dict(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "generation": self.generation,
                "erased": self.erased(), "tool_directory": self.tool_directory,
                "tool_files": self.tool_files}


@dataclass
class ConversationData:
    """One conversation of a :class:`UserData`, with every message (oldest first; each a
    dict with ``seq``, ``id``, ``role``, ``content``, ``task_id``, ``tokens``, ``created_at``)."""

    conversation_id: str
    data: dict[str, Any]
    updated_at: datetime | None
    messages: list[dict[str, Any]]

    def turns_digest(self) -> str | None:
        """The digest of its turns (``conversations.turns_digest``; see :func:`turns_digest`)."""
        return turns_digest((m["role"], m["content"]) for m in self.messages)


@dataclass
class TaskData:
    """One unfinished task of a :class:`UserData`, with every approval row it has (in order;
    dicts as ``Store.load_approvals`` returns them)."""

    task_id: str
    conversation_id: str
    query: str
    workspace: dict[str, Any]
    settings: dict[str, Any]
    version: int
    updated_at: datetime | None
    approvals: list[dict[str, Any]]


@dataclass
class UserData:
    """Everything stored about one user: ``Store.export_user`` reads it in one transaction,
    ``Store.import_user`` writes it into a store that holds nothing of theirs.
    ``cogency.storage.export`` turns it into one JSON document and back."""

    user_id: str
    profile: Profile | None
    entries: list[ProfileEntry]
    conversations: list[ConversationData]
    tasks: list[TaskData]
    learning: list[dict[str, Any]]
    """The finished tasks queued for learning (``LearningClaim.tasks``' shape)."""


@dataclass
class ApiKeyRecord:
    """One row of ``api_keys``: a key of the HTTP service, which acts as ``user_id``.

    Only a hash of the key's secret is stored; ``key_id`` is its public part.
    """

    key_id: str
    user_id: str
    key_hash: str
    name: str = ""
    created_at: datetime | None = None
    revoked_at: datetime | None = None


@dataclass
class RequestRecord:
    """One row of ``idempotency_keys``: a request of the HTTP service made with a key, the run
    it started and (once over) what it was answered, so a retry gets that answer instead of
    a second run. Scoped by ``user_id``; forgotten at ``expires_at``."""

    user_id: str
    key: str
    """SHA-256 of the client's ``Idempotency-Key`` (or of the request, for an SDK's retries)."""
    request: str
    """SHA-256 of the request (method, path, body): a key reused for another one is refused."""
    expires_at: datetime
    task_id: str | None = None
    conversation_id: str | None = None
    outcome: dict[str, Any] | None = None


@runtime_checkable
class Store(Protocol):
    """Persistence for profiles, conversations and task workspaces.

    Every read is scoped by ``user_id``: another user's row is reported as not found.
    Each method is one transaction.
    """

    async def begin_task(
        self,
        task: TaskRecord,
        conversation_data: dict[str, Any],
        messages: Sequence[dict[str, Any]] = (),
        history_tokens: int | None = None,
    ) -> ConversationRecord:
        """Ensure the profile row, open or create the conversation, insert the workspace
        (held by ``task.runner`` when set, as :meth:`claim_task` would) and append
        ``messages``, all in one transaction. With ``history_tokens``, the record's ``recent``
        holds the newest messages within that budget (``messages`` included)."""
        ...

    async def load_task(self, task_id: str, user_id: str) -> TaskRecord: ...

    async def load_conversation(self, conversation_id: str, user_id: str) -> ConversationRecord: ...

    async def load_messages(
        self, conversation_id: str, user_id: str, *, token_budget: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The newest messages that fit ``token_budget``/``limit``, oldest first."""
        ...

    async def save(self, batch: SaveBatch) -> int:
        """Apply ``batch`` atomically; returns the workspace version now stored."""
        ...

    async def load_task_messages(self, task_id: str, user_id: str) -> list[dict[str, Any]]:
        """Every message ``task_id`` stored, oldest first, whatever history window a run loads
        (resume finds the task's recorded tool results here)."""
        ...

    async def claim_task(self, task_id: str, user_id: str, runner: str) -> int:
        """Hold the task for ``runner`` and return its new lease epoch (fence writes with it);
        ``TaskRunningError`` if a live runner holds it."""
        ...

    async def release_task(self, task_id: str, runner: str) -> None: ...

    async def force_release(self, task_id: str, user_id: str) -> str | None:
        """Take the task away from whichever runner holds it (one known to be dead): its
        later writes are refused. The hold its process has on the task's conversation (see
        :meth:`hold_conversation`) goes too. Returns that runner, or ``None`` if none held it."""
        ...

    async def load_profile(self, user_id: str) -> Profile | None: ...

    async def update_profile(
        self, user_id: str, apply: Callable[[Profile], None], *, generation: int | None = None
    ) -> Profile:
        """Read-modify-write the profile under a lock (created when missing).

        With ``generation``, the write happens only if the user's :meth:`user_generation` is
        still that number, checked inside the transaction (so a ``forget`` that returned before
        it always wins); otherwise :class:`~cogency.errors.ForgottenError` and nothing written.
        """
        ...

    async def user_generation(self, user_id: str) -> int:
        """How many times the user was forgotten (0 for one never forgotten)."""
        ...

    async def load_entries(self, user_id: str, *, history: bool = False) -> list[ProfileEntry]:
        """The user's current profile entries in rank order; with ``history``, every entry
        (current and superseded), oldest first."""
        ...

    async def change_profile(
        self, user_id: str, change: Callable[[ProfileBook], Any], *,
        generation: int | None = None, claim: LearningClaim | None = None,
    ) -> ProfileBook:
        """Change the profile's entries in one transaction, under the profile's lock.

        ``change`` gets a :class:`~cogency.memory.entries.ProfileBook` of the stored profile
        (created when missing) and its current entries; the store then writes the entries it
        added and changed and the projection (``profile_data``), and returns the finished book.
        ``generation`` is as in :meth:`update_profile`. With ``claim``, the claimed tasks
        leave the learning queue in the same transaction; a claim no longer held (it lapsed
        and was taken over, or the user was forgotten) raises
        :class:`~cogency.errors.ConflictError` and nothing is written.
        """
        ...

    async def claim_learning(
        self, holder: str, *, user_id: str | None = None, limit: int = 1,
        batch: int = LEARN_BATCH, lease: float = LEARN_LEASE,
    ) -> list[LearningClaim]:
        """Claim up to ``limit`` users' queued learning that is due (of ``user_id`` only, when
        given) for ``holder``, each for ``lease`` seconds and with at most ``batch`` tasks.
        A claim held by a live holder is skipped; one whose holder died or lapsed is taken."""
        ...

    async def release_learning(
        self, claim: LearningClaim, *, error: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        """Give a claim up without learning: with ``error``, count a failed attempt and keep
        the tasks until ``retry_at``. Nothing happens if the claim is no longer held."""
        ...

    async def learning_status(self, user_id: str) -> LearningStatus | None:
        """What waits to be learned about the user; ``None`` when nothing does."""
        ...

    async def prune_history(self, before: datetime, user_id: str | None = None) -> int:
        """Delete profile entries superseded before ``before`` (of one user, when given);
        returns how many."""
        ...

    async def export_user(self, user_id: str) -> UserData:
        """Everything stored about the user, read in one transaction."""
        ...

    async def import_user(self, data: UserData) -> None:
        """Store ``data`` in one transaction: its profile, entries, conversations (messages
        with their ids, order and times), unfinished tasks (held by nobody) with their
        approvals, and queued learning. ``ConflictError`` (and nothing written) when the
        store holds anything of the user, or one of its conversation or task ids."""
        ...

    async def list_tasks(self, user_id: str | None = None) -> list[TaskRecord]:
        """Unfinished tasks, oldest first, each with its ``pending_approvals``."""
        ...

    async def load_approvals(
        self, task_id: str, user_id: str, status: str | None = None
    ) -> list[dict[str, Any]]:
        """The task's calls that waited (only those in ``status`` when given), in the order
        the model asked for them: dicts with ``id``, ``task_id``, ``name``, ``args``,
        ``status``, ``decider``, ``output`` (a client's result, once answered),
        ``created_at`` and ``decided_at`` (ISO strings or None)."""
        ...

    async def decide_approvals(
        self, task_id: str, user_id: str, decisions: Mapping[str, bool | str]
    ) -> list[dict[str, Any]]:
        """Decide pending calls by id, all or none: a person's call is approved (``True``) or
        denied (``False``), a client's call is answered with its result (a ``str``, stored as
        its ``output``). An unknown id raises ``NotFoundError``, a call decided before
        ``ConflictError``, a decision of the wrong kind ``UsageError``. Returns the decided
        calls. Nothing runs here: ``Agent.resume`` runs what was approved."""
        ...

    async def start_approvals(self, task_id: str, user_id: str, call_ids: Sequence[str]) -> None:
        """Mark approved calls as running, just before they run (``ConflictError`` if one is
        not ``approved``): a call marked running is never started again."""
        ...

    async def list_conversations(
        self, user_id: str, *, limit: int | None = None
    ) -> list[ConversationRecord]:
        """The user's conversations, most recently updated first (the ``limit`` newest)."""
        ...

    async def forget_user(self, user_id: str) -> ForgetReceipt:
        """Delete the user's profile and its entries (history too), conversations, messages,
        workspaces, approvals and queued learning together, and advance their generation:
        learning that began before can then never write. Returns what was deleted."""
        ...

    async def delete_conversation(self, conversation_id: str, user_id: str) -> None:
        """Delete one of the user's conversations with its messages and its tasks (their
        workspaces and waiting calls), in one transaction; nothing happens if the user has
        no such conversation. For a run that keeps nothing (``Agent.run(keep=False)``)."""
        ...

    async def find_call(self, user_id: str, call_id: str) -> str | None:
        """The id of the user's unfinished task that has the waiting call ``call_id`` (see
        :data:`APPROVAL_STATUSES`), or ``None``: how a client that sends a tool's result by
        its call id alone (OpenAI's chat completions) continues the task that waits for it."""
        ...

    # -- the HTTP service (``cogency serve``) ---------------------------------------------

    async def create_api_key(self, key: ApiKeyRecord) -> None:
        """Store a new key (its hash, never the key); ``ConflictError`` if the id exists."""
        ...

    async def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """The key with this public id, revoked or not; ``None`` when there is none."""
        ...

    async def list_api_keys(self, user_id: str | None = None) -> list[ApiKeyRecord]: ...

    async def revoke_api_key(self, key_id: str) -> ApiKeyRecord:
        """Mark the key revoked (``NotFoundError`` if there is none); revoking twice is fine."""
        ...

    async def hold_conversation(self, conversation_id: str, user_id: str, runner: str, *,
                                existing: bool = False) -> None:
        """Reserve the conversation for one run across every process on this database.

        ``ConversationBusyError`` while another live runner holds it; ``NotFoundError`` if it
        is another user's, or, with ``existing=True``, if it does not exist (yet): then no
        hold is taken (a conversation a client names must be one the user has). The hold is a lease this store renews while it lasts: a runner
        whose process died on this host holds nothing, one on another host holds it until
        its lease lapses. While held, the tasks this store begins or claims in the
        conversation are fenced by the hold too: once another runner has taken it (or a force
        release cleared it), their next write raises ``LeaseLostError`` and stores nothing.
        """
        ...

    async def release_conversation(self, conversation_id: str, runner: str) -> None:
        """Give up a hold taken by ``runner`` (nothing happens if it holds none)."""
        ...

    async def find_conversation_by_turns(self, user_id: str, digest: str) -> str | None:
        """The user's most recently updated conversation whose turns (see :func:`turns_digest`)
        have ``digest``, or ``None``: one indexed lookup, however long the conversations."""
        ...

    async def claim_request(self, record: RequestRecord, *, replace: bool = False
                            ) -> RequestRecord | None:
        """Store ``record`` unless its user has a live (unexpired) row with its key: then that
        row is returned, and nothing is stored. ``replace`` stores it over a live row."""
        ...

    async def settle_request(self, user_id: str, key: str, *, task_id: str | None = None,
                             conversation_id: str | None = None,
                             outcome: dict[str, Any] | None = None) -> None:
        """Record on the key's row the run it started, or (``outcome``) how it ended."""
        ...

    async def drop_request(self, user_id: str, key: str) -> None:
        """Delete the key's row (its request started no run, so it may be sent again)."""
        ...

    async def close(self) -> None: ...


# -- the turns of a conversation, as a chat client shows them -----------------------------------
#
# A conversation's row keeps a digest of its turns (migration m011_conversation_turns): the
# user's queries and the agent's final answers, in order, each without surrounding whitespace;
# tool results and the steps that call tools are not turns (a chat client never sees them). It
# is chained turn by turn, so each append adds to it in the same transaction (on PostgreSQL in
# the same statement, by the function cogency_chain_turns), and a history a client resends
# finds its conversation by one indexed lookup (Store.find_conversation_by_turns).


def turn_hash(role: str, content: str) -> str | None:
    """What a message adds to its conversation's turns digest (``None``: it is no turn)."""
    if role == "user" or (role == "assistant" and not content.startswith('{"actions"')):
        text = f"{role}\n{content.strip()}"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return None


def chain_turns(digest: str | None, hashes: Iterable[str]) -> str | None:
    """``digest`` with the turns of ``hashes`` added in order (``None``: no turn yet)."""
    for piece in hashes:
        digest = hashlib.sha256(((digest or "") + piece).encode()).hexdigest()
    return digest


def turns_digest(turns: Iterable[tuple[str, str]]) -> str | None:
    """The digest of a conversation whose messages are ``turns`` (role, text), in order."""
    return chain_turns(None, (h for role, text in turns if (h := turn_hash(role, text))))


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def busy_conversation(conversation_id: str) -> str:
    """The message of :class:`~cogency.errors.ConversationBusyError`."""
    return (
        f"conversation {conversation_id!r} has a run in flight; wait for it to end "
        "(follow it, or list unfinished tasks), then send the next message"
    )


def api_key_record(row: Any) -> ApiKeyRecord:
    """An ``api_keys`` row (id, user, hash, name, created_at, revoked_at) as a record."""
    key_id, user_id, key_hash, name, created, revoked = row
    return ApiKeyRecord(
        key_id, user_id, key_hash, name,
        _time.parse(created) if created else None,
        _time.parse(revoked) if revoked else None,
    )


def decode(text: str, table: str, key: str, column: str) -> dict[str, Any]:
    """Parse a stored JSON object, naming the row when it is corrupt (every column holds one)."""
    try:
        data = loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise CorruptDataError(
            f"{table} row {key!r} holds invalid JSON in {column} ({exc}); "
            "restore it from a backup or delete the row"
        ) from exc
    if not isinstance(data, dict):
        raise CorruptDataError(
            f"{table} row {key!r} holds a JSON {type(data).__name__} in {column} where an object "
            "belongs; restore it from a backup or delete the row"
        )
    return data


def decode_profile(text: str, user_id: str) -> Profile:
    data = decode(text, "user_profiles", user_id, "profile_data")
    try:
        return Profile.from_dict({**data, "user_id": user_id})
    except (TypeError, ValueError) as exc:
        raise CorruptDataError(
            f"user_profiles row {user_id!r} holds a profile that cannot be read ({exc}); "
            "repair or delete the row"
        ) from exc


def generation_key(user_id: str) -> str:
    """The key of a user's row in ``user_generations``: a hash, so that a forgotten user's
    id is not kept in readable form."""
    return hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()


def no_conversation(conversation_id: str, user_id: str) -> str:
    """The not-found message for a conversation (the same whether missing or another user's)."""
    return (
        f"no conversation {conversation_id!r} for user {user_id!r} "
        "(`cogency conversations --user USER` lists them)"
    )


def no_workspace(batch: SaveBatch) -> str:
    return (
        f"task {batch.task_id!r} of user {batch.user_id!r} has no workspace "
        "(it completed or was deleted); start a new task"
    )


def conflict(batch: SaveBatch, version: int) -> str:
    return (
        f"task {batch.task_id!r} was saved by someone else (version {version}, this copy has "
        f"{batch.expected_version}); continue_task again to get the current workspace"
    )


def conversation_record(row: Any) -> ConversationRecord:
    """A ``conversations`` row (id, user, data, message_count, updated_at) as a record."""
    conversation_id, user_id, data, count, updated = row
    return ConversationRecord(
        conversation_id,
        user_id,
        decode(data, "conversations", conversation_id, "conversation_data"),
        count,
        _time.parse(updated) if updated else None,
    )


def task_record(row: Any, text: Callable[[str], str] = str) -> TaskRecord:
    """A ``task_workspaces`` row as a record; ``text`` reads the stored query."""
    task_id, user_id, conversation_id, query, data, version, runner, updated, epoch, settings = row
    return TaskRecord(
        task_id,
        user_id,
        conversation_id,
        text(query),
        decode(data, "task_workspaces", task_id, "workspace_data"),
        version,
        runner,
        _time.parse(updated) if updated else None,
        epoch,
        decode(settings or "{}", "task_workspaces", task_id, "settings"),
    )


def lease_lost(task_id: str) -> LeaseLostError:
    return LeaseLostError(
        f"this run no longer holds task {task_id!r}: another runner took it over (or it was "
        "released by force), so it stopped and wrote nothing more; see `cogency tasks`"
    )


def task_running(task_id: str, until: datetime | None = None) -> TaskRunningError:
    expiry = f" (its lease expires at {until.isoformat(timespec='seconds')} unless renewed)" \
        if until else ""
    return TaskRunningError(
        f"task {task_id!r} is running in another process or agent{expiry}; wait for it to "
        "stop, then resume it. If its runner is known to be dead: "
        "`cogency tasks release TASK_ID --user USER`"
    )


def too_new(done: set[str]) -> SchemaTooNewError | None:
    """The error for a database with schema steps (``done``) this Cogency does not know."""
    unknown = done - set(MIGRATION_NAMES)
    if not unknown:
        return None
    return SchemaTooNewError(
        f"the database has schema steps this Cogency does not know ({', '.join(sorted(unknown))}): "
        "it was written by a newer Cogency; upgrade cogency to open it"
    )


def schema_problem(done: set[str], where: str) -> StorageError | None:
    """Why a database whose applied steps are ``done`` cannot be read without migrating it."""
    newer = too_new(done)
    if newer is not None:
        return newer
    if not done:
        return StorageError(
            f"the database {where} holds no Cogency tables: nothing was ever stored in it, or it "
            "belongs to another program; check the path"
        )
    missing = [name for name in MIGRATION_NAMES if name not in done]
    if missing:
        return StorageError(
            f"the database {where} has an older schema (missing {', '.join(missing)}) and was "
            "opened read-only, so it cannot be upgraded here: open it once for writing (run a "
            "task on it, or open a store on it without read_only), then read it again"
        )
    return None


APPROVAL_COLUMNS = "call_id, task_id, call_data, status, created_at, decided_at, decider, output"
"""What :func:`approval_record` reads of a ``task_approvals`` row, in its order."""


def approval_record(row: Any) -> dict[str, Any]:
    """A ``task_approvals`` row (:data:`APPROVAL_COLUMNS`) as the dict the store API returns."""
    call_id, task_id, data, status, created, decided, decider, output = row
    call = decode(data, "task_approvals", call_id, "call_data")
    return {"id": call_id, "task_id": task_id, "name": call.get("name"),
            "args": call.get("args") or {}, "status": status, "decider": decider,
            "output": output, "created_at": created, "decided_at": decided}


def approval_data(call: dict[str, Any]) -> str:
    """What ``task_approvals.call_data`` holds for a call."""
    return dumps({"name": call["name"], "args": call.get("args") or {}})


def check_decisions(
    task_id: str, statuses: Mapping[str, tuple[str, str]], decisions: Mapping[str, bool | str]
) -> list[tuple[str, str | None, str]]:
    """Refuse a set of decisions unless each is one its pending call of the task takes (a
    bool for a person's, a str for a client's: ``statuses`` maps call ids to (status,
    decider)); otherwise the updates to make: (new status, output, call id) each."""
    from ..errors import ConflictError, NotFoundError, UsageError

    if not isinstance(decisions, Mapping) or not decisions:
        raise UsageError("decisions must be a non-empty mapping of call id to True or False "
                         "(a person's call) or its result (a client's call)")
    waiting = sorted(call for call, (status, _) in statuses.items() if status == "pending")
    updates: list[tuple[str, str | None, str]] = []
    for call_id, verdict in decisions.items():
        status, decider = statuses.get(call_id, (None, None))
        if status is None:
            raise NotFoundError(
                f"task {task_id!r} has no call {str(call_id)[:80]!r} waiting for a decision "
                f"(waiting: {', '.join(waiting) or 'none'})"
            )
        if decider == "client" and not isinstance(verdict, str):
            raise UsageError(
                f"call {call_id!r} is a call of a tool the client declared: its decision is "
                f"the result the client sends (a string), not {str(verdict)[:40]!r}"
            )
        if decider != "client" and not isinstance(verdict, bool):
            raise UsageError(
                f"the decision for call {call_id!r} must be True (approve) or False (deny), "
                f"not {str(verdict)[:40]!r}"
            )
        if status != "pending":
            raise ConflictError(
                f"call {call_id!r} of task {task_id!r} was already decided ({status}); "
                "a decision cannot be changed"
            )
        if isinstance(verdict, str):
            updates.append(("answered", verdict, call_id))
        else:
            updates.append(("approved" if verdict else "denied", None, call_id))
    return updates


def legacy_messages(
    conversation_id: str, data: dict[str, Any], stamp: str
) -> list[tuple[int, str, str, int, str]] | None:
    """Rows (seq, role, content, tokens, created_at) for the messages a seed-era conversation
    kept inside ``conversation_data``, which loses its ``messages`` key; ``None`` if it has
    none. Used by migration m002 of every backend."""
    if "messages" not in data:
        return None
    messages = data.pop("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise CorruptDataError(
            f"conversations row {conversation_id!r} holds a 'messages' value that is not a "
            "list of objects; repair or delete the row, then open the database again"
        )
    from ..tokens import message_tokens

    rows = []
    for seq, message in enumerate(messages, start=1):
        content = message.get("content", "")
        content = content if isinstance(content, str) else dumps(content)
        rows.append((seq, str(message.get("role", "user")), content, message_tokens(content),
                     str(message.get("timestamp") or stamp)))
    return rows


def new_runner() -> str:
    """An identity for one run of a task: host, process, process start time, and a token."""
    return f"{_own_process()}|{new_hex()}"


_OWN: tuple[int, str] = (0, "")


def _own_process() -> str:
    # Host, pid and start time of this process, read once per pid (a fork reads its own):
    # reading /proc on every run cost ~50 µs of each turn.
    global _OWN
    pid = os.getpid()
    if _OWN[0] != pid:
        _OWN = (pid, f"{socket.gethostname()}|{pid}|{_process_start(pid)}")
    return _OWN[1]


_ABANDONED: set[str] = set()
"""Runs of this process that ended but could not clear their claim (the database failed)."""


def abandon_runner(runner: str) -> None:
    """Record that ``runner`` (of this process) has ended though its row may still name it,
    so the task can be resumed without waiting for the process to exit."""
    _ABANDONED.add(runner)


def runner_alive(runner: str) -> bool:
    """Whether the process that wrote ``runner`` may still run it: false once it ended here or
    its process on this host is gone; a runner of another host is judged by its lease."""
    if runner in _ABANDONED:
        return False
    try:
        host, pid_text, start, _ = runner.split("|")
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _process_start(pid) == start  # a reused pid is another process


def lease_free(holder: str | None, until: datetime | None, now: datetime) -> bool:
    """Whether a row held by ``holder`` until ``until`` may be taken at ``now`` (a task's or a
    conversation's lease, a claim on a user's learning): nobody holds it, its time is up, or
    its holder is a process of this host that is gone."""
    return not holder or until is None or until <= now or not runner_alive(holder)


def _process_start(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


# -- profile entries and the learning queue: rows the same on every backend --------------------

ENTRY_COLUMNS = (
    "entry_id, user_id, field, entry_key, value, origin, model, sources, sources_omitted, "
    "rank, created_at, updated_at, superseded_at, superseded_by, reason"
)
"""The columns of ``profile_entries``, in the order of :func:`entry_row`."""
ENTRY_UPDATE = (
    "sources = {0}, sources_omitted = {1}, rank = {2}, updated_at = {3}, superseded_at = {4}, "
    "superseded_by = {5}, reason = {6}"
)
"""What a :class:`ProfileBook` may change of an entry (its value never changes)."""


def entry_row(entry: ProfileEntry) -> tuple[Any, ...]:
    """A ``profile_entries`` row (:data:`ENTRY_COLUMNS`) for ``entry``."""
    return (entry.entry_id, entry.user_id, entry.field, entry.key, entry.value, entry.origin,
            entry.model, dumps(entry.sources), entry.sources_omitted, entry.rank,
            entry.created_at.isoformat(), entry.updated_at.isoformat(),
            _iso(entry.superseded_at), entry.superseded_by, entry.reason)


def entry_changes(entry: ProfileEntry) -> tuple[Any, ...]:
    """The values of :data:`ENTRY_UPDATE`, then the entry's id and user."""
    return (dumps(entry.sources), entry.sources_omitted, entry.rank,
            entry.updated_at.isoformat(), _iso(entry.superseded_at), entry.superseded_by,
            entry.reason, entry.entry_id, entry.user_id)


def entry_record(row: Any) -> ProfileEntry:
    """A ``profile_entries`` row (:data:`ENTRY_COLUMNS`) as an entry."""
    (entry_id, user_id, name, key, value, origin, model, sources, omitted, rank, created,
     updated, superseded, superseded_by, reason) = row
    try:
        listed = loads(sources)
        if not isinstance(listed, list):
            raise ValueError("not a list")
        return ProfileEntry(
            entry_id, user_id, name, key, value, origin, listed, rank, _time.parse(created),
            _time.parse(updated), model, omitted,
            _time.parse(superseded) if superseded else None, superseded_by, reason,
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptDataError(
            f"profile_entries row {entry_id!r} cannot be read ({exc}); repair or delete the row"
        ) from exc


def book_of(profile: Profile | None, user_id: str, entries: Sequence[ProfileEntry]) -> ProfileBook:
    """The book a ``change_profile`` transaction changes: the stored profile (a new one when
    there is none) and its current entries, made to agree with ``profile_data`` first (a row
    written by something other than a book, e.g. a seed-era database)."""
    book = ProfileBook(profile or Profile(user_id), entries)
    if profile is not None:
        book.sync(profile)
    return book


def queued_tasks(text: str, user_id: str) -> list[dict[str, Any]]:
    """A ``learning_queue.tasks`` value: the queued task references."""
    try:
        tasks = loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptDataError(
            f"learning_queue row of user {user_id!r} holds invalid JSON ({exc}); delete the row "
            "(what it queued is not learned)"
        ) from exc
    if not isinstance(tasks, list) or not all(
            isinstance(t, dict) and isinstance(t.get("task_id"), str) for t in tasks):
        raise CorruptDataError(
            f"learning_queue row of user {user_id!r} holds something other than a list of "
            "tasks; delete the row (what it queued is not learned)"
        )
    return tasks


def learning_ref(batch: SaveBatch, stamp: str) -> dict[str, Any]:
    """How a completed task is queued for learning: ``{"task_id", "conversation_id", "at"}``,
    and ``"trace"`` (the run's trace link) when the run was traced."""
    ref: dict[str, Any] = {"task_id": batch.task_id, "conversation_id": batch.conversation_id,
                           "at": stamp}
    if batch.trace:
        ref["trace"] = batch.trace
    return ref


def queue_task(tasks: list[dict[str, Any]], claimed: list[dict[str, Any]], batch: SaveBatch,
               stamp: str) -> tuple[list[dict[str, Any]], int]:
    """``tasks`` with the batch's task queued last (once, and not if a claim holds it), and
    how many of the oldest had to leave to keep :data:`MAX_PENDING_TASKS` (claimed tasks are
    never left out: they are being learned). PostgreSQL's ``cogency_queue_task`` (migration
    m015) does the same inside the completing statement."""
    held = {task.get("task_id") for task in claimed}
    queued = [t for t in tasks if t.get("task_id") != batch.task_id]
    if batch.task_id not in held:
        queued.append(learning_ref(batch, stamp))
    over = max(0, len(queued) - MAX_PENDING_TASKS)
    return queued[over:], over


def take_claim(tasks: list[dict[str, Any]], claimed: list[dict[str, Any]], batch: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What a new claim holds (what a lapsed claim held, then the oldest queued, ``batch`` in
    all) and what stays queued."""
    room = max(0, batch - len(claimed))
    return [*claimed, *tasks[:room]], tasks[room:]


def pending_count(*texts: str | None, user_id: str) -> int:
    """How many tasks ``learning_queue`` values (``tasks``, ``claimed``) hold (0 for one that
    cannot be read: a forget still deletes the row)."""
    total = 0
    for text in texts:
        try:
            total += len(queued_tasks(text or "[]", user_id))
        except CorruptDataError:
            pass
    return total


def claimable(holder: str | None, lease_until: str | None, me: str, now: str) -> bool:
    """Whether a queue row held by ``holder`` until ``lease_until`` may be claimed by ``me``
    (times as the row keeps them: ISO text)."""
    return holder == me or lease_free(holder, _moment(lease_until), _time.parse(now))


def _moment(text: str | None) -> datetime | None:
    return None if text is None else _time.parse(text)


def claim_lost(claim: LearningClaim) -> ClaimLostError:
    return ClaimLostError(
        f"the learning claim on user {claim.user_id!r} is no longer held (it lapsed and another "
        "process took it, or the user was forgotten): nothing of it was stored"
    )


def import_conflict(user_id: str, what: str) -> ConflictError:
    return ConflictError(
        f"cannot import user {user_id!r}: {what}. Import only into a store that holds nothing "
        "of theirs (forget them first, or use an empty database)"
    )


def import_taken(user_id: str, kind: str, ident: str | None) -> ConflictError:
    """An import whose ``kind`` id (conversation, task, profile entry) another user of the
    store has: ids are unique across users, so nothing was imported."""
    named = f"{kind} {ident!r}" if ident is not None else f"a {kind} id"
    return ConflictError(
        f"cannot import user {user_id!r}: {named} of the export belongs to another user of "
        "this store (ids are unique across its users); nothing was imported. Import into a "
        "database that does not hold it"
    )


def learning_status_of(row: Any, user_id: str, now: str) -> LearningStatus:
    """A ``learning_queue`` row (tasks, claimed, dropped, attempts, last_error,
    next_attempt_at, holder, lease_until, created_at) as a status."""
    tasks, claimed, dropped, attempts, error, due, holder, until, since = row
    return LearningStatus(
        user_id, pending_count(tasks, claimed, user_id=user_id), dropped, attempts, error,
        _time.parse(due) if due else None,
        not lease_free(holder, _moment(until), _time.parse(now)),
        _time.parse(since) if since else None,
    )
