"""Scripted replies for memory tests: an agent's final answer and a learner's extraction."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from cogency.memory.entries import ProfileBook
from cogency.memory.profile import Profile


def learn_into(profile: Profile, reply: dict[str, Any]) -> None:
    """One extraction reply applied to ``profile``'s values by the book's rules (what the
    learner does, without provenance): for ``store.update_profile`` callbacks."""
    _through_book(profile, lambda book: book.learn(reply))


def consolidate_into(profile: Profile, synthesis: dict[str, Any]) -> bool:
    """A consolidation reply applied to ``profile``'s values; ``True`` if it was usable."""
    return bool(_through_book(profile, lambda book: book.consolidate(synthesis)))


def _through_book(profile: Profile, change: Any) -> Any:
    book = ProfileBook.adopt(profile)
    outcome = change(book)
    result = book.finish()
    for item in fields(result):
        setattr(profile, item.name, getattr(result, item.name))
    return outcome


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
