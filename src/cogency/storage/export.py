"""Everything stored about one user as one JSON document, and back.

``Memory.export_user`` writes it (``cogency profile export``, ``GET /api/profile/export``);
``Memory.import_user`` reads it back into a store that holds nothing of that user. A document
may come from anyone (an HTTP client, a file), so :func:`from_document` checks every value's
type and size and refuses anything else with a :class:`~cogency.errors.UsageError` naming it;
nothing in it is ever evaluated.

The document::

    {"format": "cogency.user/1", "exported_at": ISO, "user_id": ...,
     "profile": {profile_data} | null,
     "entries": [profile entries, current and history, with their sources],
     "conversations": [{"conversation_id", "data", "updated_at",
                        "messages": [{"seq", "id", "role", "content", "task_id", "tokens",
                                      "created_at"}]}],
     "tasks": [{"task_id", "conversation_id", "query", "workspace", "settings", "version",
                "updated_at", "approvals": [{"id", "name", "args", "status", "decider",
                                             "output", "created_at", "decided_at"}]}],
     "learning": [{"task_id", "conversation_id", "at"}]}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import _time
from ..errors import CogencyError, UsageError
from ..memory.entries import ProfileEntry, storable_int
from ..memory.profile import Profile
from ..tokens import count_tokens, most_tokens
from .base import (
    APPROVAL_STATUSES,
    DECIDERS,
    MAX_PENDING_TASKS,
    ConversationData,
    TaskData,
    UserData,
)

FORMAT = "cogency.user/1"
MAX_ID = 256


def to_document(data: UserData) -> dict[str, Any]:
    """``data`` as the export document (plain JSON values)."""
    return {
        "format": FORMAT,
        "exported_at": _time.stamp(),
        "user_id": data.user_id,
        "profile": None if data.profile is None else data.profile.to_dict(),
        "entries": [entry.to_dict() for entry in data.entries],
        "conversations": [
            {"conversation_id": c.conversation_id, "data": c.data,
             "updated_at": _iso(c.updated_at),
             "messages": [{key: m.get(key) for key in
                           ("seq", "id", "role", "content", "task_id", "tokens", "created_at")}
                          for m in c.messages]}
            for c in data.conversations
        ],
        "tasks": [
            {"task_id": t.task_id, "conversation_id": t.conversation_id, "query": t.query,
             "workspace": t.workspace, "settings": t.settings, "version": t.version,
             "updated_at": _iso(t.updated_at),
             "approvals": [{key: call.get(key) for key in
                            ("id", "name", "args", "status", "decider", "output",
                             "created_at", "decided_at")}
                           for call in t.approvals]}
            for t in data.tasks
        ],
        "learning": [{key: task.get(key) for key in ("task_id", "conversation_id", "at")}
                     for task in data.learning],  # (a run's trace link is not the user's)
    }


def from_document(document: Any, *, user_id: str | None = None) -> UserData:
    """The :class:`UserData` a document holds (as ``user_id`` when given: every row is then
    that user's, whatever the document says); ``UsageError`` naming what is wrong."""
    from ..state.state import ROLES, check_id  # state imports storage: imported when used

    doc = _object(document, "the document")
    if doc.get("format") != FORMAT:
        raise UsageError(f"not a Cogency user export: its \"format\" must be {FORMAT!r} "
                         "(`cogency profile export` writes one)")
    user = check_id(user_id if user_id is not None else doc.get("user_id"), "user_id")
    try:
        profile = None
        if doc.get("profile") is not None:
            profile = Profile.from_dict({**_object(doc["profile"], "profile"), "user_id": user})
        entries = []
        for number, item in enumerate(_list(doc.get("entries"), "entries")):
            entry = ProfileEntry.from_dict({**_object(item, f"entries[{number}]"),
                                            "user_id": user})
            entries.append(entry)
        _unique([e.entry_id for e in entries], "entry_id")
        conversations = [_conversation(item, number, user, check_id, ROLES)
                         for number, item in enumerate(_list(doc.get("conversations"),
                                                             "conversations"))]
        _unique([c.conversation_id for c in conversations], "conversation_id")
        known = {c.conversation_id for c in conversations}
        tasks = [_task(item, number, known, check_id)
                 for number, item in enumerate(_list(doc.get("tasks"), "tasks"))]
        _unique([t.task_id for t in tasks], "task_id")
        learning = [_queued(item, number, check_id)
                    for number, item in enumerate(_list(doc.get("learning"), "learning"))]
        if len(learning) > MAX_PENDING_TASKS:
            raise UsageError(f"learning queues at most {MAX_PENDING_TASKS} tasks")
    except UsageError as exc:
        raise UsageError(f"the export cannot be imported: {exc}") from None
    except (CogencyError, TypeError, ValueError, KeyError, RecursionError) as exc:
        raise UsageError(f"the export cannot be imported: {type(exc).__name__}: {exc}") from None
    return UserData(user, profile, entries, conversations, tasks, learning)


def counts(data: UserData) -> dict[str, int]:
    """How many rows of each kind ``data`` holds (what an import stored)."""
    return {
        "profiles": 1,
        "entries": sum(1 for e in data.entries if e.current),
        "history": sum(1 for e in data.entries if not e.current),
        "conversations": len(data.conversations),
        "messages": sum(len(c.messages) for c in data.conversations),
        "tasks": len(data.tasks),
        "approvals": sum(len(t.approvals) for t in data.tasks),
        "pending_learning": len(data.learning),
    }


def _conversation(item: Any, number: int, user: str, check_id: Any,
                  roles: tuple[str, ...]) -> ConversationData:
    where = f"conversations[{number}]"
    value = _object(item, where)
    conversation_id = check_id(value.get("conversation_id"), f"{where}.conversation_id")
    data = {**_object(value.get("data") or {}, f"{where}.data"),
            "conversation_id": conversation_id, "user_id": user}
    messages = []
    ids: list[str] = []
    for index, raw in enumerate(_list(value.get("messages"), f"{where}.messages")):
        message = _object(raw, f"{where}.messages[{index}]")
        role, content = message.get("role"), message.get("content")
        if role not in roles or not isinstance(content, str):
            raise UsageError(f"{where}.messages[{index}] needs a role ({', '.join(roles)}) "
                             "and a text content")
        task_id = message.get("task_id")
        if task_id is not None:
            check_id(task_id, f"{where}.messages[{index}].task_id")
        ident = message.get("id")
        if ident is not None:
            ident = _text(ident, f"{where}.messages[{index}].id", MAX_ID)
            ids.append(ident)
        messages.append({"id": ident, "role": role, "content": content, "task_id": task_id,
                         "tokens": _tokens(content, message.get("tokens")),
                         "created_at": _moment(message.get("created_at"),
                                               f"{where}.messages[{index}].created_at")})
    _unique(ids, f"{where} message id")
    return ConversationData(conversation_id, data, _when(value.get("updated_at"), where),
                            messages)


def _tokens(content: str, given: Any) -> int:
    """A message's stored count: the document's when it is the upper bound a store keeps
    (:func:`~cogency.tokens.most_tokens`), else counted here, exactly. A count below the
    text's is never taken: it would let the message into every prompt's window past its
    budget."""
    bound = most_tokens(content)
    return bound if given == bound else count_tokens(content)


def _task(item: Any, number: int, conversations: set[str], check_id: Any) -> TaskData:
    where = f"tasks[{number}]"
    value = _object(item, where)
    task_id = check_id(value.get("task_id"), f"{where}.task_id")
    conversation_id = value.get("conversation_id")
    if conversation_id not in conversations:
        raise UsageError(f"{where}.conversation_id must name a conversation of the export")
    version = value.get("version", 1)
    if not storable_int(version, 1):
        raise UsageError(f"{where}.version must be a positive integer")
    approvals = []
    for index, raw in enumerate(_list(value.get("approvals"), f"{where}.approvals")):
        call = _object(raw, f"{where}.approvals[{index}]")
        if call.get("status") not in APPROVAL_STATUSES:
            raise UsageError(f"{where}.approvals[{index}].status must be one of "
                             f"{', '.join(APPROVAL_STATUSES)}")
        decider = call.get("decider", "person")
        if decider not in DECIDERS:
            raise UsageError(f"{where}.approvals[{index}].decider must be one of "
                             f"{', '.join(DECIDERS)}")
        output = call.get("output")
        if output is not None and not isinstance(output, str):
            raise UsageError(f"{where}.approvals[{index}].output must be text or null")
        approvals.append({
            "id": _text(call.get("id"), f"{where}.approvals[{index}].id", MAX_ID),
            "name": _text(call.get("name"), f"{where}.approvals[{index}].name", MAX_ID),
            "args": _object(call.get("args") or {}, f"{where}.approvals[{index}].args"),
            "status": call["status"],
            "decider": decider,
            "output": output,
            "created_at": _moment(call.get("created_at"), f"{where}.approvals[{index}]"),
            "decided_at": (None if call.get("decided_at") is None
                           else _moment(call["decided_at"], f"{where}.approvals[{index}]")),
        })
    _unique([call["id"] for call in approvals], f"{where} approval id")
    query = value.get("query")
    if not isinstance(query, str):
        raise UsageError(f"{where}.query must be text")
    return TaskData(task_id, conversation_id, query,
                    _object(value.get("workspace") or {}, f"{where}.workspace"),
                    _object(value.get("settings") or {}, f"{where}.settings"),
                    version, _when(value.get("updated_at"), where), approvals)


def _queued(item: Any, number: int, check_id: Any) -> dict[str, Any]:
    where = f"learning[{number}]"
    value = _object(item, where)
    conversation_id = value.get("conversation_id")
    return {"task_id": check_id(value.get("task_id"), f"{where}.task_id"),
            "conversation_id": None if conversation_id is None
            else check_id(conversation_id, f"{where}.conversation_id"),
            "at": _moment(value.get("at"), where)}


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a JSON object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError(f"{where} must be a JSON list")
    return value


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise UsageError(f"{where} must be text of 1 to {limit} characters")
    return value


def _moment(value: Any, where: str) -> str:
    """An ISO time, kept as written (the stores keep these as text)."""
    text = _text(value, where, 64)
    try:
        _time.parse(text)
    except ValueError as exc:
        raise UsageError(f"{where} must be an ISO time") from exc
    return text


def _when(value: Any, where: str) -> datetime | None:
    return None if value is None else _time.parse(_moment(value, f"{where}.updated_at"))


def _unique(values: list[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise UsageError(f"{what} {value[:80]!r} appears twice")
        seen.add(value)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


__all__ = ["FORMAT", "counts", "from_document", "to_document"]
