"""The memory domain: what is known of a user, how it enters the prompt, and forgetting it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..tokens import truncate_tokens

if TYPE_CHECKING:
    from ..llm.base import LLM
    from ..storage.base import Store
    from .profile import Profile

PROFILE_TOKENS = 800
"""Token budget of the user context in the prompt (v1.0)."""


@dataclass
class Memory:
    """A user's profile store and the model that learns it.

    ``store`` and ``llm`` left as ``None`` take the agent's when given to an ``Agent``;
    used alone, ``store=None`` means the default database.
    """

    store: Store | None = None
    llm: LLM | None = None
    synthesis_threshold: int = 3
    profile_tokens: int = PROFILE_TOKENS

    def bind(self, store: Store, llm: LLM | None) -> Memory:
        """This memory with the agent's store and model filling what was left unset."""
        return replace(self, store=self.store or store, llm=self.llm or llm)

    def _store(self) -> Store:
        if self.store is None:
            from ..storage import open_store

            self.store = open_store()
        return self.store

    async def profile(self, user_id: str) -> Profile | None:
        """The stored profile, or ``None`` for a user never seen."""
        return await self._store().load_profile(user_id)

    async def activate(self, user_id: str) -> str:
        """``"USER CONTEXT:"`` and the compressed profile within its budget; "" if nothing known."""
        profile = await self.profile(user_id)
        if profile is None or profile.is_empty():
            return ""
        return truncate_tokens(f"USER CONTEXT:\n{profile.compress()}", self.profile_tokens)

    async def forget(self, user_id: str) -> None:
        """Erase the user's profile, conversations, messages and workspaces in one transaction."""
        await self._store().forget_user(user_id)
