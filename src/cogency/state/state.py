"""The state of one task and its lifecycle: start, continue, save, complete."""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import _telemetry, _time
from .._history import History
from .._ids import new_hex, new_uuid
from .._redact import scrub_surrogates
from ..errors import CorruptDataError, UsageError
from ..storage.base import ConversationRecord, SaveBatch, TaskRecord
from ..tokens import message_tokens
from .conversation import Conversation
from .execution import Execution
from .workspace import Workspace

if TYPE_CHECKING:
    from ..memory.profile import Profile
    from ..storage.base import Store

DEFAULT_HISTORY_TOKENS = 8_000
"""How much earlier conversation a task loads into ``execution.messages``."""

ROLES = ("user", "assistant", "tool", "system")
_COUNT_IN_A_THREAD = 50_000
"""Characters of new messages whose tokens are counted off the event loop (other runs go on)."""
MAX_ID_LENGTH = 256


@dataclass
class State:
    """One task: its conversation, workspace and execution. The profile lives in memory."""

    query: str
    user_id: str = "default"
    task_id: str = field(default_factory=new_uuid)
    conversation: Conversation = field(default_factory=Conversation)
    workspace: Workspace = field(default_factory=Workspace)
    execution: Execution = field(default_factory=Execution)
    security_assessment: str | None = None
    created_at: datetime = field(default_factory=_time.now)
    last_updated: datetime = field(default_factory=_time.now)
    store: Store | None = field(default=None, repr=False, compare=False)
    version: int = 1
    """The workspace row version this state last saw; a stale one makes saves conflict."""
    completed: bool = False
    settings: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What the task's starter stored with it (``TaskRecord.settings``)."""
    epoch: int | None = None
    """The lease epoch of the runner this state writes for: its saves are refused
    (:class:`~cogency.errors.LeaseLostError`) once another runner holds the task."""
    _save_id: str = field(default_factory=new_hex, repr=False, compare=False)
    """Kept until a save succeeds, so a retry after an unknown outcome is known as one."""
    _saved_workspace: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    _owns_store: bool = field(default=False, repr=False, compare=False)
    _approvals: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)
    """Calls now waiting for a person, stored by the next save (with the step's messages)."""
    _settled: list[str] = field(default_factory=list, repr=False, compare=False)
    """Ids of waiting calls whose result is among the unsaved messages."""

    @classmethod
    async def start_task(
        cls,
        query: str,
        user_id: str,
        conversation_id: str | None = None,
        store: Store | None = None,
        *,
        max_iterations: int = 10,
        history_tokens: int = DEFAULT_HISTORY_TOKENS,
        task_id: str | None = None,
        record_query: bool = False,
        runner: str | None = None,
        settings: dict[str, Any] | None = None,
        history: Sequence[tuple[str, str]] = (),
    ) -> State:
        """Create a task and save its workspace; continue ``conversation_id`` when given.

        The profile row is created if missing. ``execution.messages`` holds the newest
        conversation history that fits ``history_tokens`` (all of it stays in the database).
        ``record_query`` also stores the query as the conversation's next user message, and
        ``runner`` holds the task for that runner (as ``Store.claim_task``), both in the same
        transaction. ``settings`` (a JSON object) is stored with the task as
        ``TaskRecord.settings``, for whoever resumes it. ``history`` (``(role, text)`` pairs,
        role ``"user"`` or ``"assistant"``) is stored before the query (which it needs) as
        messages of no task.
        """
        check_id(user_id, "user_id")
        if settings is not None and not isinstance(settings, dict):
            raise UsageError("settings must be a dict of JSON values")
        if not isinstance(query, str):
            raise UsageError("query must be a string")
        query = scrub_surrogates(query)  # no database can store a lone surrogate
        if conversation_id is not None:
            check_id(conversation_id, "conversation_id")
        store, owned = _resolve_store(store)
        conversation = Conversation(
            conversation_id=conversation_id or new_uuid(), user_id=user_id
        )
        state = cls(query=query, user_id=user_id, store=store, _owns_store=owned,
                    task_id=new_uuid() if task_id is None else check_id(task_id, "task_id"),
                    conversation=conversation, workspace=Workspace(objective=query),
                    execution=Execution(max_iterations=max_iterations))
        if history and not record_query:
            raise UsageError("history is stored before the query: pass record_query=True")
        for role, text in history:
            if role not in ("user", "assistant") or not isinstance(text, str):
                raise UsageError("history holds (role, text) pairs, role 'user' or 'assistant'")
        # No task wrote the history: without a task id it is older context, never this
        # task's own messages (which come whole) nor mistaken for its query.
        def messages() -> list[dict[str, Any]]:
            return [*(_message(state, role, text, task_id=None) for role, text in history),
                    _message(state, "user", query)] if record_query else []

        if sum(len(text) for _, text in history) + len(query) > _COUNT_IN_A_THREAD:
            first = await asyncio.to_thread(messages)  # counting 1 MB of text takes ~0.25 s
        else:
            first = messages()
        record = await _telemetry.store("begin_task", store, store.begin_task(
            TaskRecord(
                task_id=state.task_id,
                user_id=user_id,
                conversation_id=conversation.conversation_id,
                query=query,
                workspace=state.workspace.to_dict(),
                runner=runner,
                settings=dict(settings or {}),
            ),
            conversation.to_dict(),
            first,
            history_tokens,
        ))
        state._saved_workspace = state.workspace.to_dict()
        state.settings = dict(settings or {})
        state.epoch = 1 if runner else None
        recent = History(record.recent if record.recent is not None else first)
        # The query is the newest message, so the window holds it iff it ends with it (one
        # check, not a pass over a window that grows with the conversation).
        if first and (not recent or recent[-1].get("task_id") != state.task_id):
            recent.append(first[-1])  # a query longer than history_tokens: it still counts
        state.conversation = _conversation_from(record, recent)
        state.execution.messages = recent
        return state

    @classmethod
    async def continue_task(
        cls,
        task_id: str,
        user_id: str,
        store: Store | None = None,
        *,
        max_iterations: int = 10,
        history_tokens: int = DEFAULT_HISTORY_TOKENS,
    ) -> State:
        """Load an unfinished task: its workspace and its conversation history.

        Another user's task is reported as not found.
        """
        check_id(task_id, "task_id")
        check_id(user_id, "user_id")
        store, owned = _resolve_store(store)
        task = await store.load_task(task_id, user_id)
        record = await store.load_conversation(task.conversation_id, user_id)
        history = await store.load_messages(
            task.conversation_id, user_id, token_budget=history_tokens
        )
        if not any(m.get("task_id") == task_id and m.get("role") == "user"
                   and m.get("content") == task.query for m in history):
            history = await _with_own_messages(store, user_id, task_id, history)
        state = cls(
            query=task.query,
            user_id=user_id,
            task_id=task_id,
            conversation=_conversation_from(record, history),
            workspace=Workspace.from_dict(task.workspace),
            execution=Execution(max_iterations=max_iterations, messages=History(history)),
            store=store,
            version=task.version,
            settings=task.settings,
            _owns_store=owned,
        )
        state._saved_workspace = state.workspace.to_dict()
        return state

    async def complete_task(self, profile: Profile | None = None, *, learn: bool = False
                            ) -> None:
        """Save what is unsaved (and ``profile`` if given) and delete the workspace row, atomically.

        The conversation and its messages stay; the execution is discarded. ``learn`` queues
        the task for learning in the same transaction (the agent does when memory is on), so
        no crash can separate the answer from its learning.
        """
        await _save(self, profile, complete=True, learn=learn)
        self.completed = True
        if self._owns_store and self.store is not None:
            await self.store.close()


async def _with_own_messages(
    store: Store, user_id: str, task_id: str, window: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The task's own messages, whole, after what of the loaded ``window`` came before them:
    a task whose messages outgrew the history window still comes back entire."""
    own = await store.load_task_messages(task_id, user_id)
    if not own:
        return window  # the task has no message yet (the agent adds its query)
    first = own[0].get("seq")
    older = [m for m in window if m.get("task_id") != task_id
             and (first is None or (m.get("seq") or 0) < first)]
    return [*older, *own]


def add_message(state: State, role: str, content: str, **extra: Any) -> dict[str, Any]:
    """Add a message to the conversation and the execution (a plain function).

    The message is held in memory until the next :func:`autosave` (or ``complete_task``),
    which appends it as a row of ``conversation_messages``.
    """
    if role not in ROLES:
        raise UsageError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not isinstance(content, str):
        raise UsageError("message content must be a string")
    if state.completed:
        raise UsageError(f"task {state.task_id!r} is complete; start a new task to add messages")
    message = _message(state, role, content, **extra)
    state.conversation.messages.append(message)
    state.conversation.unsaved.append(message)
    state.execution.messages.append(message)
    state.last_updated = _time.now()
    return message


def await_approval(state: State, call: dict[str, Any], decider: str = "person") -> dict[str, Any]:
    """Record that ``call`` waits for its ``decider`` (a person, or the client whose tool it
    is); the next save stores it. Returns it with its new ``id`` (what is decided on)."""
    waiting = {"id": f"call_{new_hex()[:16]}", "name": call["name"],
               "args": call.get("args") or {}, "decider": decider}
    state._approvals.append(waiting)
    return waiting


def settle_approval(state: State, call_id: str) -> None:
    """Record that a decided call's result was added; the next save marks the call done."""
    state._settled.append(call_id)


async def autosave(state: State, profile: Profile | None = None) -> None:
    """Persist what changed (new messages, the workspace, ``profile`` if given) in one transaction.

    The execution is never stored. A workspace saved meanwhile by another ``State`` makes this
    raise :class:`~cogency.errors.ConflictError` and nothing is written.
    """
    if state.completed:
        raise UsageError(f"task {state.task_id!r} is complete; there is nothing left to save")
    await _save(state, profile, complete=False)


async def _save(state: State, profile: Profile | None, *, complete: bool,
                learn: bool = False) -> None:
    if state.store is None:
        raise UsageError("this state has no store; create it with State.start_task")
    workspace = state.workspace.to_dict()
    changed = workspace != state._saved_workspace
    pending = list(state.conversation.unsaved)
    approvals, settled = list(state._approvals), list(state._settled)
    if not (pending or changed or profile or complete or approvals or settled):
        return
    batch = SaveBatch(
        user_id=state.user_id,
        task_id=state.task_id,
        conversation_id=state.conversation.conversation_id,
        expected_version=state.version,
        messages=pending,
        workspace=workspace if changed else None,
        profile=profile,
        complete=complete,
        epoch=state.epoch,
        save_id=state._save_id,
        approvals=approvals,
        settled=settled,
        learn=learn,
        trace=_telemetry.trace_link() if learn else None,  # learning's spans link to the run
    )
    state.version = await _telemetry.store("complete_task" if complete else "save", state.store,
                                           state.store.save(batch))
    state._save_id = new_hex()
    del state.conversation.unsaved[: len(pending)]
    del state._approvals[: len(approvals)]
    del state._settled[: len(settled)]
    state._saved_workspace = workspace
    state.conversation.last_updated = _time.now()


def _message(state: State, role: str, content: str, **extra: Any) -> dict[str, Any]:
    content = scrub_surrogates(content)  # a model's "\ud800" must not fail the save
    return {
        "id": new_hex(),  # the database stores each id once: retried saves never double
        "role": role,
        "content": content,
        "task_id": state.task_id,
        # Exact once the encoding is loaded, else an upper bound made exact where it matters.
        "tokens": message_tokens(content),
        "created_at": _time.stamp(),
        **extra,
    }


def check_id(value: Any, name: str) -> str:
    """Reject ids that cannot be right: empty, not text, huge, control characters, or able to
    pass for another id.

    Ids are compared exactly, so two ids that print alike would be two users (or tasks) shown
    identically. An id must therefore be in Unicode normal form NFKC (``"ａlice"`` with a
    fullwidth letter is refused and ``"alice"`` suggested) and hold no invisible format
    characters (zero-width spaces and joiners, bidi overrides). Such ids are refused, never
    rewritten: rewriting would silently merge two stored ids into one.
    """
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{name} must be a non-empty string, not {value!r}")
    if len(value) <= MAX_ID_LENGTH and value.isascii() and value.isprintable():
        return value  # printable ASCII: no control or invisible character, and NFKC already
    categories = {unicodedata.category(ch) for ch in value}
    if len(value) > MAX_ID_LENGTH or categories & {"Cc", "Cs", "Zl", "Zp"}:
        raise UsageError(
            f"{name} {value[:40]!r} is not a valid id: use at most {MAX_ID_LENGTH} printable "
            "characters"
        )
    if "Cf" in categories:
        raise UsageError(
            f"{name} {value[:40]!r} holds invisible characters (zero-width or bidi controls) "
            f"that would make it look like another id; use {_plain(value)[:40]!r}"
        )
    if not unicodedata.is_normalized("NFKC", value):
        raise UsageError(
            f"{name} {value[:40]!r} has characters that look like others (e.g. fullwidth "
            f"letters); ids must be in Unicode NFKC form: use {_plain(value)[:40]!r}"
        )
    return value


def _plain(value: str) -> str:
    """``value`` in NFKC without format characters: the id it passes for."""
    return "".join(
        ch for ch in unicodedata.normalize("NFKC", value) if unicodedata.category(ch) != "Cf"
    )


def _conversation_from(
    record: ConversationRecord, history: list[dict[str, Any]]
) -> Conversation:
    # The row's key and owner win over whatever its JSON says (seed-era rows may lack them).
    data = {**record.data, "conversation_id": record.conversation_id, "user_id": record.user_id,
            "last_updated": record.updated_at}  # the row's updated_at: its last message
    try:
        return Conversation.from_dict(data, history)
    except (TypeError, ValueError) as exc:
        raise CorruptDataError(
            f"conversations row {record.conversation_id!r} holds conversation_data that cannot "
            f"be read ({exc}); repair or delete the row"
        ) from exc


def _resolve_store(store: Store | None) -> tuple[Store, bool]:
    if store is not None:
        return store, False
    from ..storage import open_store

    return open_store(), True
