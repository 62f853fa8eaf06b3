"""The workspace: one task's working memory, saved while the task runs, deleted when it ends."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
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
        return asdict(self)

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
