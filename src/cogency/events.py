"""Events an agent emits while it works, in the order they happen."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from .llm.base import Usage


@dataclass
class Event:
    """Base of every event; ``type`` names the kind (``start``, ``reason``, ...)."""

    type: ClassVar[str] = "event"
    task_id: str

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (``--json`` prints one per line)."""
        return {"type": self.type, **asdict(self)}


@dataclass
class Start(Event):
    type: ClassVar[str] = "start"
    conversation_id: str = ""
    query: str = ""
    resumed: bool = False


@dataclass
class Token(Event):
    """A piece of the model's reply as it streams (only from models that stream)."""

    type: ClassVar[str] = "token"
    text: str = ""


@dataclass
class Reason(Event):
    """One reasoning step: the workspace as the model left it."""

    type: ClassVar[str] = "reason"
    iteration: int = 0
    workspace: dict[str, str] = field(default_factory=dict)


@dataclass
class Action(Event):
    type: ClassVar[str] = "action"
    iteration: int = 0
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result(Event):
    type: ClassVar[str] = "result"
    iteration: int = 0
    name: str = ""
    ok: bool = True
    output: str = ""


@dataclass
class Approval(Event):
    """A tool call that waits for a person: decide it with ``Agent.resume(approvals=...)``.

    Emitted after the task is saved (so the call can be decided at once), before ``end``.
    """

    type: ClassVar[str] = "approval"
    id: str = ""
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Response(Event):
    type: ClassVar[str] = "response"
    text: str = ""


@dataclass
class Retry(Event):
    """A model call failed in a way worth retrying; the next attempt starts after ``delay``.

    ``attempt`` counts retries of that call from 1; ``reason`` says what failed (a rate
    limit, a server error, a timeout, a reply cut off at the token limit...).
    """

    type: ClassVar[str] = "retry"
    attempt: int = 0
    delay: float = 0.0
    reason: str = ""


@dataclass
class Error(Event):
    """Something went wrong; ``fatal`` when it ends the run."""

    type: ClassVar[str] = "error"
    message: str = ""
    fatal: bool = False


@dataclass
class End(Event):
    """The run is over; the last event. ``usage`` is the tokens the whole run spent, as
    ``AgentResult.usage`` (so a caller that streams has them too)."""

    type: ClassVar[str] = "end"
    stop_reason: str = ""
    iterations: int = 0
    usage: Usage = field(default_factory=Usage)


__all__ = ["Action", "Approval", "End", "Error", "Event", "Reason", "Response", "Result",
           "Retry", "Start", "Token"]
