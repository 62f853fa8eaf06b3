"""The execution: mechanics of one run of the loop. Never stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._history import History


@dataclass
class Execution:
    """Iteration counters, the messages the model sees, and the tool calls of this run."""

    iteration: int = 0
    max_iterations: int = 10
    stop_reason: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=History)
    """The history window and this run's messages: a :class:`~cogency._history.History`, a
    list that keeps what building each prompt needs of every message."""
    response: str | None = None
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    completed_calls: list[dict[str, Any]] = field(default_factory=list)
    iterations_without_tools: int = 0
    tool_results: dict[str, Any] = field(default_factory=dict)

    def add_message(self, role: str, content: str, **extra: Any) -> dict[str, Any]:
        """Append a message to this run only (``state.add_message`` also persists it)."""
        message = {"role": role, "content": content, **extra}
        self.messages.append(message)
        return message

    def set_tool_calls(self, calls: list[dict[str, Any]]) -> None:
        self.pending_calls = list(calls)

    def complete_tool_calls(self, results: list[dict[str, Any]]) -> None:
        """Record finished calls; ``tool_results`` keeps the latest result per tool name."""
        self.completed_calls.extend(results)
        for result in results:
            self.tool_results[result["name"]] = result
        self.pending_calls.clear()

    def should_continue(self) -> bool:
        """More iterations are allowed and nothing has ended the run."""
        return (
            self.iteration < self.max_iterations
            and self.response is None
            and self.stop_reason is None
        )

    def advance_iteration(self) -> None:
        self.iteration += 1
