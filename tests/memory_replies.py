"""Scripted replies for memory tests: an agent's final answer and a learner's extraction."""

from __future__ import annotations

from typing import Any


def answer(text: str = "done") -> dict[str, Any]:
    return {"secure": True, "objective": "help", "response": text, "actions": []}


def insights(**fields: Any) -> dict[str, Any]:
    """An extraction reply in the strict-schema shape (maps as key/value pairs)."""
    reply: dict[str, Any] = {
        "preferences": [], "goals": [], "expertise": [], "communication_style": "",
        "project_context": [], "interests": [], "constraints": [], "success_pattern": "",
        "failure_pattern": "",
    }
    for key, value in fields.items():
        if isinstance(value, dict):
            value = [{"key": k, "value": v} for k, v in value.items()]
        reply[key] = value
    return reply
