"""The conversation: message history that spans the tasks of one thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import _time
from .._ids import new_uuid


@dataclass
class Conversation:
    """A thread of messages; ``messages`` holds the window loaded for this task.

    Messages are stored as rows of ``conversation_messages``; the full history stays in the
    database however much of it is loaded here.
    """

    conversation_id: str = field(default_factory=new_uuid)
    user_id: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    created_at: datetime = field(default_factory=_time.now)
    last_updated: datetime = field(default_factory=_time.now)
    unsaved: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)
    """Messages added since the last save, in order; autosave appends them as rows."""

    def to_dict(self) -> dict[str, Any]:
        """The conversation's own fields (stored in ``conversation_data``); no messages."""
        return {
            "conversation_id": self.conversation_id,
            "user_id": self.user_id,
            "created_at": self.created_at.isoformat(),
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], messages: list[dict[str, Any]] | None = None
    ) -> Conversation:
        return cls(
            conversation_id=data["conversation_id"],
            user_id=data.get("user_id", ""),
            messages=list(messages or []),
            created_at=_time.parse(data["created_at"]) if data.get("created_at") else _time.now(),
            last_updated=_time.parse(data.get("last_updated") or data.get("created_at") or _time.now()),
        )
