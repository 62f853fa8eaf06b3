"""Every error Cogency raises, under one root.

    CogencyError
    ├── UsageError            you called something wrongly (also a ValueError)
    │   ├── ConfigurationError  something must be installed or set first
    │   ├── ContextWindowError  the query cannot fit the model's context window
    │   └── ApprovalRequiredError  a paused task was resumed without deciding its calls
    ├── NotFoundError         no such row for this user (also another user's data)
    ├── ConflictError         someone else changed or holds it
    │   ├── TaskRunningError    the task is being run by another runner
    │   │   └── LeaseLostError    this runner's hold on its task was taken over or released
    │   ├── ForgottenError      the user was forgotten after this learning began
    │   ├── ClaimLostError      this process no longer holds the learning it claimed
    │   └── ConversationBusyError  the conversation has a run in flight (``cogency serve``)
    ├── StorageError          the database failed or holds something unusable
    │   ├── SchemaTooNewError   written by a newer Cogency
    │   ├── CorruptDataError    a row's JSON cannot be read (names the row)
    │   └── StoreUnavailableError  the database cannot be reached or is locked
    │       └── StoreLockedError  a lock stayed held past the timeout
    ├── LLMError              the model call failed
    │   ├── AuthenticationError, RateLimitError, LLMTimeoutError,
    │   ├── ModelNotFoundError, RefusalError, ContextLengthError
    │   ├── InvalidResponseError  the reply breaks the JSON contract
    │   └── ScriptExhaustedError  a ScriptedLLM ran out of replies
    └── ToolError             a tool is defined or called wrongly
        └── ToolArgumentError   arguments do not match the tool's schema

Third-party errors are mapped at the boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any


class CogencyError(Exception):
    """Root of every error raised by Cogency."""


class UsageError(CogencyError, ValueError):
    """A call was made with arguments that cannot work."""


class ConfigurationError(UsageError):
    """Something must be installed or configured before this can run."""


class ApprovalRequiredError(UsageError):
    """A task waits for a person to approve or deny tool calls; ``pending`` lists them
    (dicts with ``id``, ``name`` and ``args``)."""

    def __init__(self, message: str, pending: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.pending = pending


class NotFoundError(CogencyError, LookupError):
    """The row does not exist for this user (another user's rows are never visible)."""


class ConflictError(CogencyError):
    """A concurrent writer got there first; reload and try again."""


class TaskRunningError(ConflictError):
    """The task is being run right now by another runner."""


class LeaseLostError(TaskRunningError):
    """This runner no longer holds its task (another runner took it over, or it was released
    by force): the run stops and writes nothing more."""


class ForgottenError(ConflictError):
    """The user was forgotten after this learning began, so nothing of it is stored."""

    def __init__(self, user_id: str) -> None:
        super().__init__(
            f"user {user_id!r} was forgotten after this learning began: nothing learned "
            "before a forget is stored"
        )
        self.user_id = user_id


class ClaimLostError(ConflictError):
    """The learning this process claimed was taken over (its claim lapsed) or the user was
    forgotten meanwhile: nothing of it is stored, and the holder of the claim learns it."""


class ConversationBusyError(ConflictError):
    """The conversation has a run in flight; one run at a time per conversation."""


class StorageError(CogencyError):
    """The database failed, or holds something Cogency cannot use."""


class SchemaTooNewError(StorageError):
    """The database was written by a newer version of Cogency."""


class CorruptDataError(StorageError):
    """A stored row holds data that cannot be decoded."""


class StoreUnavailableError(StorageError):
    """The database cannot be reached, or stayed locked past the timeout."""


class StoreLockedError(StoreUnavailableError):
    """Another writer held a lock past the timeout; nothing of this operation was written."""


class LLMError(CogencyError):
    """The model call failed."""

    retried: bool = False
    """True when the adapter already retried (or knows retrying cannot help): retry no more."""


class AuthenticationError(LLMError):
    """The provider rejected the API key."""


class RateLimitError(LLMError):
    """The provider kept refusing for rate limits after the retries."""


class LLMTimeoutError(LLMError):
    """The model did not answer within the time limit."""


class ModelNotFoundError(LLMError):
    """The provider does not know the model name."""


class ContextLengthError(LLMError):
    """The provider rejected a prompt longer than its context window.

    ``window`` is the window the provider reported, when it said.
    """

    window: int | None = None


class ContextWindowError(UsageError):
    """The task's query cannot fit the model's context window with the system message.

    Raised before any model call; the message names both sizes.
    """


class RefusalError(LLMError):
    """The provider refused to produce output."""


class InvalidResponseError(LLMError):
    """The model's reply does not follow the JSON contract (the message says how)."""


class ScriptExhaustedError(LLMError):
    """A ScriptedLLM was called more times than it has replies."""


class ToolError(CogencyError):
    """A tool is defined or called wrongly."""


class ToolArgumentError(ToolError):
    """Arguments do not match the tool's schema."""


__all__ = [
    "ApprovalRequiredError",
    "AuthenticationError",
    "CogencyError",
    "ConfigurationError",
    "ConflictError",
    "ContextLengthError",
    "ContextWindowError",
    "ConversationBusyError",
    "CorruptDataError",
    "InvalidResponseError",
    "LLMError",
    "LLMTimeoutError",
    "LeaseLostError",
    "ModelNotFoundError",
    "NotFoundError",
    "RateLimitError",
    "RefusalError",
    "SchemaTooNewError",
    "ScriptExhaustedError",
    "StorageError",
    "StoreLockedError",
    "StoreUnavailableError",
    "TaskRunningError",
    "ToolArgumentError",
    "ToolError",
    "UsageError",
]
