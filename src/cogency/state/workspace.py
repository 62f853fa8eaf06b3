"""The workspace: one task's working memory, saved while the task runs, deleted when it ends."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import UsageError

WORKSPACE_FIELDS = ("objective", "understanding", "approach", "discoveries")


@dataclass
class Workspace:
    """The four v5.0 fields; the model's reply replaces each one it sends."""

    objective: str = ""
    understanding: str = ""
    approach: str = ""
    discoveries: str = ""

    def to_dict(self) -> dict[str, str]:
        # Not dataclasses.asdict: its deep copy of four strings cost ~50 µs, 5 times a turn.
        return {name: getattr(self, name) for name in WORKSPACE_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workspace:
        if not isinstance(data, dict):
            raise UsageError("workspace data must be a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in known and v is not None})

    def update(self, values: dict[str, Any]) -> None:
        """Replace the fields present (as strings) in ``values``; absent fields keep their value."""
        for name in WORKSPACE_FIELDS:
            value = values.get(name)
            if isinstance(value, str):
                setattr(self, name, value)
