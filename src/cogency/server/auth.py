"""The one place a request becomes a user: its key is checked, and everything it may do is
bound to the key's user in a :class:`Caller`. Routes get a ``Caller`` and nothing else, so no
route can read or write another user's rows (theirs look "not found")."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel

from ..memory import Memory, Profile, ProfileEntry
from ..storage.base import (
    ConversationRecord,
    ForgetReceipt,
    LearningStatus,
    Store,
    TaskRecord,
    turns_digest,
)
from .errors import ServiceError, Unauthorized
from .keys import authenticate
from .runs import Once, Run, Runs

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


IDEMPOTENCY_HEADER = "idempotency-key"
RETRY_HEADER = "x-stainless-retry-count"
"""Sent by the official OpenAI SDKs (and every SDK made with Stainless) on each attempt of a
request: 0 first, then 1, 2 on its retries. They send no idempotency key of their own."""
SDK_RETRY_SECONDS = 3600.0
"""How long an SDK's request is remembered for its retries (they come within minutes)."""
_KEY_CHARS = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass(frozen=True)
class Caller:
    """What one request may do: the key's user's data, and runs as that user."""

    user_id: str
    key_id: str
    _store: Store
    _runs: Runs
    _path: str = ""
    _idempotency_key: str | None = None
    _attempt: str | None = None

    async def conversations(self, limit: int | None = None) -> list[ConversationRecord]:
        """Newest first (the ``limit`` newest)."""
        return await self._store.list_conversations(self.user_id, limit=limit)

    async def messages(self, conversation_id: str, limit: int) -> list[dict[str, Any]]:
        return await self._store.load_messages(conversation_id, self.user_id, limit=limit)

    async def conversation_with_turns(self, turns: Sequence[tuple[str, str]]) -> str | None:
        """The user's newest conversation whose turns are exactly ``turns`` (one lookup)."""
        digest = turns_digest(turns)
        if digest is None:
            return None
        return await self._store.find_conversation_by_turns(self.user_id, digest)

    async def find_call(self, call_id: str) -> str | None:
        """The user's unfinished task that has the waiting call ``call_id``, if any."""
        return await self._store.find_call(self.user_id, call_id)

    async def task_messages(self, task_id: str) -> list[dict[str, Any]]:
        """The messages a task of the user wrote (none for another user's)."""
        return await self._store.load_task_messages(task_id, self.user_id)

    async def approvals(self, task_id: str) -> list[dict[str, Any]]:
        """An unfinished task's waiting calls (``NotFoundError`` for another user's)."""
        return await self._store.load_approvals(task_id, self.user_id)

    def model_options(self, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """See :meth:`.Runs.model_options`."""
        return self._runs.model_options(options)

    async def tasks(self) -> list[TaskRecord]:
        return await self._store.list_tasks(self.user_id)

    async def task(self, task_id: str) -> TaskRecord:
        return await self._store.load_task(task_id, self.user_id)

    async def profile(self) -> Profile | None:
        return await self._store.load_profile(self.user_id)

    async def learning(self) -> LearningStatus | None:
        return await self._memory().status(self.user_id)

    async def explain(self) -> list[dict[str, Any]]:
        return await self._memory().explain(self.user_id)

    async def history(self) -> list[ProfileEntry]:
        return await self._memory().history(self.user_id)

    async def set_entry(self, field: str, value: str, key: str | None,
                        replaces: str | None) -> ProfileEntry:
        return await self._memory().set_entry(self.user_id, field, value, key=key,
                                              replaces=replaces)

    async def remove_entry(self, entry_id: str) -> ProfileEntry:
        return await self._memory().remove_entry(self.user_id, entry_id)

    async def export(self) -> dict[str, Any]:
        return await self._memory().export_user(self.user_id)

    async def import_(self, document: Any) -> dict[str, int]:
        """Restore an export as this user, whoever the document names."""
        return await self._memory().import_user(document, user_id=self.user_id)

    async def forget(self) -> ForgetReceipt:
        """Everything of the user: what the store keeps, and their tools' directories."""
        return await self._runs.agent.forget(self.user_id)

    def _memory(self) -> Memory:
        # Reading and correcting the profile needs no model: the store's, as this user.
        return Memory(store=self._store)

    def once(self, body: BaseModel) -> Once | None:
        """How this request starts at most one run: by its ``Idempotency-Key``, or (sent by
        an OpenAI SDK, which numbers its attempts) by the request itself, so an SDK's retry
        gets the first attempt's run; ``None`` for a request with neither."""
        numbered = self._attempt is not None and self._attempt.isdigit()
        if self._idempotency_key is None and not numbered:
            return None
        text = f"{self._path}\n{body.model_dump_json()}"
        request = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        if self._idempotency_key is not None:
            if not _KEY_CHARS.match(self._idempotency_key):
                raise ServiceError("the Idempotency-Key header must be 1 to 255 printable ASCII "
                                   "characters (a UUID is a good one)")
            key = hashlib.sha256(f"key\n{self._idempotency_key}".encode()).hexdigest()
            return Once(key, request)
        assert self._attempt is not None
        key = hashlib.sha256(f"sdk\n{request}".encode()).hexdigest()
        return Once(key, request, replace=int(self._attempt) == 0, ttl=SDK_RETRY_SECONDS)

    async def run(self, query: str, conversation_id: str | None,
                  history: Sequence[tuple[str, str]] = (),
                  find: Callable[[], Awaitable[str | None]] | None = None,
                  once: Once | None = None, asks: dict[str, Any] | None = None) -> Run:
        """A run as this user (``find``, ``once``, ``asks``: see :meth:`.Runs.start`)."""
        return await self._runs.start(
            self.user_id, self.key_id, query=query, conversation_id=conversation_id,
            history=history, find=find, once=once, asks=asks,
        )

    async def resume(self, task_id: str, approvals: dict[str, bool] | None = None,
                     once: Once | None = None, results: dict[str, Any] | None = None) -> Run:
        return await self._runs.start(self.user_id, self.key_id, task_id=task_id,
                                      approvals=approvals, once=once, results=results)


class _KeyCheck(HTTPBearer):
    """The dependency every route has (``caller``): the request's :class:`Caller`; 401
    without a live key (``Authorization: Bearer KEY``).

    An ``HTTPBearer``, so the API's documents name the scheme, that reads the header itself:
    FastAPI solves one dependency per request, not a second for the header (~30 µs less)."""

    async def __call__(self, request: Request) -> Caller:  # type: ignore[override]
        scheme, key = get_authorization_scheme_param(request.headers.get("authorization"))
        if not key or scheme.lower() != "bearer":
            raise Unauthorized("send an API key as `Authorization: Bearer KEY` "
                               "(`cogency keys create --user USER` makes one)", _CHALLENGE)
        state = request.app.state
        record = await authenticate(state.store, key)
        if record is None:
            raise Unauthorized("this API key is not valid (unknown, mistyped or revoked)",
                               _CHALLENGE)
        return Caller(record.user_id, record.key_id, state.store, state.runs,
                      request.scope["path"], request.headers.get(IDEMPOTENCY_HEADER),
                      request.headers.get(RETRY_HEADER))


caller = _KeyCheck(auto_error=False, scheme_name="HTTPBearer",
                   description="A key from `cogency keys create`.")
