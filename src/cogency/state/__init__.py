"""Task state in four parts: conversation (stored), workspace (stored until the task
completes), execution (never stored); the profile lives in :mod:`cogency.memory`."""

from .conversation import Conversation
from .execution import Execution
from .state import DEFAULT_HISTORY_TOKENS, State, add_message, autosave
from .workspace import WORKSPACE_FIELDS, Workspace

__all__ = [
    "DEFAULT_HISTORY_TOKENS",
    "WORKSPACE_FIELDS",
    "Conversation",
    "Execution",
    "State",
    "Workspace",
    "add_message",
    "autosave",
]
