"""Events an agent emits while it works, in the order they happen."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from .llm.base import Usage


@dataclass
class Event:
    """Base of every event; ``type`` names the kind (``start``, ``reason``, ...)."""

    type: ClassVar[str] = "event"
    task_id: str

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (``--json`` prints one per line): a copy, as
        ``dataclasses.asdict`` makes, without its cost on every streamed token."""
        data: dict[str, Any] = {"type": self.type}
        for name, value in vars(self).items():
            data[name] = value if isinstance(value, _SCALARS) else _plain(value)
        return data


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """``value`` as ``dataclasses.asdict`` would give it: dataclasses as dicts, containers
    copied, all the way down."""
    if isinstance(value, _SCALARS):
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_plain(item) for item in value)
    return copy.deepcopy(value)


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
    """A tool call that waits: for a person (``decider="person"``: decide it with
    ``Agent.resume(approvals=...)``) or for the client whose tool it is (``"client"``: send
    its result with ``Agent.resume(results=...)``).

    Emitted after the task is saved (so the call can be decided at once), before ``end``.
    """

    type: ClassVar[str] = "approval"
    id: str = ""
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    decider: str = "person"


@dataclass
class ResponseDelta(Event):
    """A piece of the answer as the model writes it, before ``response``.

    Only from a model that streams (one that does not sends none: its ``response`` event
    alone carries the answer), and only text of a step that answers (a step that calls tools
    sends none). The pieces since the last one with ``restart`` (that one included) add up
    to the ``response`` event's text. ``restart`` says that what was sent before is void and the answer starts
    again with ``text``: the reply turned out invalid and the model's next reply answers
    differently (one that repeats what was sent only sends what follows it), or the step
    turned out not to answer (``text`` is then empty).
    """

    type: ClassVar[str] = "response_delta"
    text: str = ""
    restart: bool = False


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


__all__ = ["Action", "Approval", "End", "Error", "Event", "Reason", "Response",
           "ResponseDelta", "Result", "Retry", "Start", "Token"]
