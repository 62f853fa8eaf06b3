"""The user profile: what the agent has learned about one user, kept forever (v1.0 fields)."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from .. import _time
from ..errors import UsageError

# v1.0 bounds. Lists and maps keep their newest entries.
MAX_GOALS = 10
MAX_EXPERTISE = 15
MAX_PROJECTS = 10
MAX_PATTERNS = 5
MAX_PREFERENCES = 20
MAX_INTERESTS = 15
MAX_CONSTRAINTS = 10
MAX_TEXT = 500  # characters kept of any one learned string

_LIST_BOUNDS = {
    "goals": MAX_GOALS,
    "expertise_areas": MAX_EXPERTISE,
    "interests": MAX_INTERESTS,
    "constraints": MAX_CONSTRAINTS,
    "success_patterns": MAX_PATTERNS,
    "failure_patterns": MAX_PATTERNS,
}
_MAP_BOUNDS = {"preferences": MAX_PREFERENCES, "projects": MAX_PROJECTS}
SYNTHESIS_FIELDS = (
    "preferences", "goals", "expertise_areas", "communication_style", "projects", "interests",
    "constraints", "success_patterns", "failure_patterns",
)
"""The learned fields: what consolidation rewrites (the rest is identity and metadata)."""


@dataclass
class Profile:
    """Permanent per-user understanding; stored as one flat JSON object in ``user_profiles``."""

    user_id: str
    preferences: dict[str, Any] = field(default_factory=dict)
    goals: list[str] = field(default_factory=list)
    expertise_areas: list[str] = field(default_factory=list)
    communication_style: str = ""
    projects: dict[str, str] = field(default_factory=dict)
    interests: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    success_patterns: list[str] = field(default_factory=list)
    failure_patterns: list[str] = field(default_factory=list)
    created_at: datetime = field(default_factory=_time.now)
    last_updated: datetime = field(default_factory=_time.now)
    interaction_count: int = 0
    synthesis_version: int = 1

    def is_empty(self) -> bool:
        """True when nothing has been learned yet."""
        return not any(getattr(self, name) for name in (*_LIST_BOUNDS, *_MAP_BOUNDS)) and not (
            self.communication_style
        )

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["created_at"] = self.created_at.isoformat()
        data["last_updated"] = self.last_updated.isoformat()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Rebuild from stored JSON; unknown keys are ignored, missing ones take defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("user_id"), str):
            raise UsageError("profile data must be an object with a string 'user_id'")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        _check_shapes(values)
        for name in ("created_at", "last_updated"):
            if name in values:
                try:
                    values[name] = _time.parse(values[name])
                except ValueError as exc:
                    raise UsageError(f"profile field {name!r} is not an ISO timestamp") from exc
        profile = cls(**values)
        profile.enforce_bounds()
        return profile

    def enforce_bounds(self) -> None:
        """Trim every collection to its v1.0 bound, keeping the newest entries."""
        for name, bound in _LIST_BOUNDS.items():
            items = getattr(self, name)
            if len(items) > bound:
                setattr(self, name, items[-bound:])
        for name, bound in _MAP_BOUNDS.items():
            items = getattr(self, name)
            if len(items) > bound:
                setattr(self, name, dict(list(items.items())[-bound:]))

    def learned(self) -> dict[str, Any]:
        """What has been learned (no ids or metadata), oldest entries first in each field."""
        return {name: getattr(self, name) for name in SYNTHESIS_FIELDS}

    def compress(self, max_chars: int = 3200) -> str:
        """The profile as a few labelled lines, newest entries first in importance."""
        sections = []
        if self.communication_style:
            sections.append(f"COMMUNICATION: {self.communication_style}")
        if self.goals:
            sections.append(f"CURRENT GOALS: {'; '.join(self.goals[-3:])}")
        if self.preferences:
            prefs = list(self.preferences.items())[-5:]
            sections.append("PREFERENCES: " + ", ".join(f"{k}: {v}" for k, v in prefs))
        if self.projects:
            projects = list(self.projects.items())[-3:]
            sections.append("ACTIVE PROJECTS: " + "; ".join(f"{k}: {v}" for k, v in projects))
        if self.expertise_areas:
            sections.append(f"EXPERTISE: {', '.join(self.expertise_areas[-5:])}")
        if self.interests:
            sections.append(f"INTERESTS: {', '.join(self.interests[-5:])}")
        if self.constraints:
            sections.append(f"CONSTRAINTS: {'; '.join(self.constraints[-3:])}")
        if self.success_patterns:
            sections.append(f"WHAT WORKS: {'; '.join(self.success_patterns[-2:])}")
        if self.failure_patterns:
            sections.append(f"WHAT TO AVOID: {'; '.join(self.failure_patterns[-2:])}")
        return "\n".join(sections)[:max_chars]


def _check_shapes(values: dict[str, Any]) -> None:
    # Stored data is read back as-is: a wrong shape would surface much later as a crash in
    # compress() or the synthesizer, far from the row that holds it.
    for name, value in values.items():
        if name in _LIST_BOUNDS:
            ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
        elif name in _MAP_BOUNDS:
            ok = isinstance(value, dict)
        elif name in ("interaction_count", "synthesis_version"):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif name == "communication_style":
            ok = isinstance(value, str)
        elif name in ("created_at", "last_updated"):
            ok = isinstance(value, (str, datetime))
        else:
            ok = True
        if not ok:
            # reprlib: bounded even for hostile, deeply nested values
            raise UsageError(f"profile field {name!r} holds {type(value).__name__} {reprlib.repr(value)}")


def _text(value: Any) -> str:
    """A learned string, or "" for what holds nothing (small models echo "..." placeholders)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value).strip()[:MAX_TEXT]
        return text if any(ch.isalnum() for ch in text) else ""
    return ""
