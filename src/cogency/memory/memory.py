"""The memory domain: what is known of a user, how it enters the prompt, learning, forgetting."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import _telemetry
from .._fence import DATA_NOTE, fence
from ..errors import ConfigurationError, ForgottenError, UsageError
from ..tokens import count_tokens, most_tokens, truncate_tokens
from .synthesizer import EXCERPT_TOKENS, ImpressionSynthesizer

if TYPE_CHECKING:
    from ..llm.base import LLM
    from ..state.state import State
    from ..storage.base import Store
    from .profile import Profile

PROFILE_TOKENS = 800
"""Token budget of the user context in the prompt (v1.0)."""
MAX_BACKLOG = 10
"""Interactions kept per user, after every retry failed, for the user's next learning."""

MESSAGE_EXCERPT_TOKENS = 400
"""Bound on any one message in the excerpt learning sees (a long tool output is cut)."""

USER_CONTEXT = (
    "USER CONTEXT: what was learned about this user in earlier conversations, quoted as "
    f"{DATA_NOTE}. Use it only to fit your answers to them."
)
"""The label of the profile in the system prompt."""
_FRAME = f"{USER_CONTEXT}\n<user_profile>\n\n</user_profile>"

logger = logging.getLogger("cogency.memory")


@dataclass
class Memory:
    """A user's profile store and the model that learns it.

    ``store`` and ``llm`` left as ``None`` take the agent's when given to an ``Agent`` (each
    agent gets its own copy, with its own pending learning); used alone, ``store=None`` means
    the default database. Learning runs in the background (:meth:`learn_later`): a failed
    attempt is retried ``learn_retries`` times with backoff from ``retry_delay`` seconds, then
    kept (at most :data:`MAX_BACKLOG` per user) and retried before the user's next learning.
    :meth:`settle` waits at most ``settle_timeout`` seconds for what is pending. What a
    :meth:`forget` erased is never learned back (see :meth:`generation`).
    """

    store: Store | None = None
    llm: LLM | None = None
    synthesis_threshold: int = 3
    profile_tokens: int = PROFILE_TOKENS
    settle_timeout: float = 30.0
    learn_retries: int = 2
    retry_delay: float = 0.5
    _pending: set[asyncio.Task[None]] = field(init=False, repr=False, compare=False)
    _locks: dict[str, asyncio.Lock] = field(init=False, repr=False, compare=False)
    _users: dict[str, int] = field(init=False, repr=False, compare=False)
    _backlog: dict[str, list[tuple[dict[str, Any], int]]] = field(
        init=False, repr=False, compare=False
    )
    _owns_store: bool = field(init=False, repr=False, compare=False, default=False)
    _said_cannot_learn: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if not isinstance(self.synthesis_threshold, int) or self.synthesis_threshold < 1:
            raise UsageError("synthesis_threshold must be a positive integer")
        if self.settle_timeout < 0 or self.learn_retries < 0 or self.retry_delay < 0:
            raise UsageError("settle_timeout, learn_retries and retry_delay must not be negative")
        self._pending = set()
        self._locks = {}  # one per user with learning in flight; dropped when idle
        self._users = {}  # learning jobs in flight (or waiting) per user
        self._backlog = {}  # (interaction, generation) pairs kept from failed attempts

    def bind(self, store: Store, llm: LLM | None) -> Memory:
        """A copy of this memory with the agent's store and model filling what was left unset."""
        return replace(self, store=self.store or store, llm=self.llm or llm)

    def _store(self) -> Store:
        if self.store is None:
            from ..storage import open_store

            self.store = open_store()
            self._owns_store = True
        return self.store

    def synthesizer(self) -> ImpressionSynthesizer:
        """The synthesizer learning with this memory's model and store."""
        if self.llm is None:
            raise UsageError(
                "this Memory has no model to learn with; pass Memory(llm=...) or give it to an "
                "Agent, whose model it then uses"
            )
        if not getattr(self.llm, "learns", True):
            raise ConfigurationError(
                f"{self.llm.name} is too small to learn user profiles (it copies the "
                "interaction into every field); learn with a capable model: Memory(llm=...)"
            )
        return ImpressionSynthesizer(self.llm, self._store(), self.synthesis_threshold)

    # -- reading ----------------------------------------------------------------------------

    async def profile(self, user_id: str) -> Profile | None:
        """The stored profile, or ``None`` for a user never seen."""
        return await self._store().load_profile(user_id)

    async def activate(self, user_id: str) -> str:
        """The compressed profile as the prompt quotes it, within its budget; "" if nothing known.

        It is what was learned about the user, possibly from hostile text, so it is quoted as
        data (a ``<user_profile>`` block under a ``USER CONTEXT`` label), never as instructions.
        """
        profile = await self.profile(user_id)
        if profile is None or profile.is_empty():
            return ""
        inside = fence(profile.compress())
        if most_tokens(inside) + most_tokens(_FRAME) > self.profile_tokens:  # else it fits
            inside = truncate_tokens(inside, max(0, self.profile_tokens - count_tokens(_FRAME)))
        return f"{USER_CONTEXT}\n<user_profile>\n{inside}\n</user_profile>"

    # -- learning ---------------------------------------------------------------------------

    async def generation(self, user_id: str) -> int:
        """The user's generation now: learning from what happens from here on passes it, so
        that a :meth:`forget` in between (in any process) keeps it from being stored."""
        return await self._store().user_generation(user_id)

    async def learn(
        self, user_id: str, interaction: dict[str, Any], *, generation: int | None = None
    ) -> Profile:
        """Learn from one interaction now, after the user's earlier learning; raises on failure.

        ``generation`` is the user's :meth:`generation` when the interaction began (read now
        when not given): if the user was forgotten since, nothing is stored and
        :class:`~cogency.errors.ForgottenError` is raised. Interactions of the user kept from
        failed attempts are learned first, in order.
        """
        if generation is None:
            generation = await self.generation(user_id)
        async with self._user_lock(user_id):
            await self._drain_backlog(user_id)
            return await self._learn_once(user_id, interaction, generation)

    def learn_later(
        self, user_id: str, interaction: dict[str, Any], *, generation: int | None = None
    ) -> asyncio.Task[None] | None:
        """Learn in the background; the returned task never raises (failures are logged).

        Must be called with an event loop running. Learning of one user is serialized;
        ``generation`` is as in :meth:`learn` (the agent reads it when a run starts). With a
        model that cannot learn (``llm.learns`` false: the default offline model) nothing is
        scheduled and ``None`` is returned; the first time, a warning says so.
        """
        if self.llm is not None and not getattr(self.llm, "learns", True):
            if not self._said_cannot_learn:
                self._said_cannot_learn = True
                logger.warning("%s is too small to learn user profiles: nothing is learned; "
                               "use Memory(llm=...) with a capable model", self.llm.name)
            return None
        work = self._learn_in_background(user_id, interaction, generation)
        task = asyncio.get_running_loop().create_task(work)
        _telemetry.learning_pending(task)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    @property
    def pending(self) -> int:
        """Background learning tasks not finished yet."""
        return len(self._pending)

    async def settle(self, timeout: float | None = None) -> bool:
        """Wait for pending learning; past ``timeout`` (default ``settle_timeout``) cancel it.

        Returns ``True`` when everything finished. Never raises: a cancelled or failed learning
        is logged on the ``cogency.memory`` logger.
        """
        limit = self.settle_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        stranded = {task for task in self._pending if task.get_loop() is not loop}
        if stranded:  # left by an event loop that has ended (asyncio.run): nothing can finish them
            logger.warning("%d learning task(s) of an ended event loop are dropped", len(stranded))
            self._pending -= stranded
        # Learning may be scheduled while we wait (a run finishing meanwhile): wait for it too.
        while pending := {task for task in self._pending if task is not asyncio.current_task()}:
            left = deadline - loop.time()
            late = pending
            if left > 0:
                _, late = await asyncio.wait(pending, timeout=left)
            if not late:
                continue
            logger.warning(
                "%d background learning task(s) still running after %.1f s; cancelling them: "
                "what they would have learned is lost", len(late), limit,
            )
            for task in late:
                task.cancel()
            await asyncio.wait(late, timeout=1.0)
            self._pending -= late
            return False
        return True

    async def close(self) -> None:
        """Settle pending learning, then close the store if this memory opened it."""
        await self.settle()
        if self._owns_store and self.store is not None:
            await self.store.close()
            self._owns_store = False
        lost = sum(len(items) for items in self._backlog.values())
        if lost:
            logger.warning(
                "%d interaction(s) could not be learned after every retry and are dropped", lost
            )
            self._backlog.clear()

    # -- forgetting -------------------------------------------------------------------------

    async def forget(self, user_id: str) -> None:
        """Erase the user's profile, conversations, messages and workspaces in one transaction.

        Once it returns, nothing learned from before it is ever stored for the user, by this
        or any other Memory or process: the store advances the user's generation in the same
        transaction, and every learning write checks it inside its own.
        """
        self._backlog.pop(user_id, None)
        await self._store().forget_user(user_id)

    # -- internals --------------------------------------------------------------------------

    def _user_lock(self, user_id: str) -> _UserLock:
        return _UserLock(self, user_id)

    async def _learn_in_background(
        self, user_id: str, interaction: dict[str, Any], generation: int | None
    ) -> None:
        try:
            if generation is None:
                generation = await self.generation(user_id)
        except Exception as exc:  # noqa: BLE001 - logged; learning never breaks a run
            logger.warning("learning about user %r failed: %s: %s", user_id,
                           type(exc).__name__, exc)
            return
        async with self._user_lock(user_id):
            queue = [*self._backlog.pop(user_id, []), (interaction, generation)]
            for position, (item, born) in enumerate(queue):
                if not await self._learn_with_retries(user_id, item, born):
                    self._keep(user_id, queue[position:])
                    return

    async def _learn_with_retries(
        self, user_id: str, interaction: dict[str, Any], generation: int
    ) -> bool:
        """Whether the interaction is done with: learned, forgotten, or never learnable."""
        attempts = self.learn_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                await self._learn_once(user_id, interaction, generation)
                return True
            except ForgottenError:
                logger.info("user %r was forgotten: their pending learning is dropped", user_id)
                return True
            except Exception as exc:  # noqa: BLE001 - logged; learning never breaks a run
                logger.warning(
                    "learning about user %r failed (attempt %d of %d): %s: %s",
                    user_id, attempt, attempts, type(exc).__name__, exc,
                )
            if attempt < attempts:
                await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
        return False

    async def _learn_once(
        self, user_id: str, interaction: dict[str, Any], generation: int
    ) -> Profile:
        with _telemetry.learning(interaction):  # its spans link to the run it came from
            return await self.synthesizer().update_impression(
                user_id, interaction, generation=generation
            )

    async def _drain_backlog(self, user_id: str) -> None:
        queue = self._backlog.pop(user_id, [])
        for position, (item, generation) in enumerate(queue):
            try:
                await self._learn_once(user_id, item, generation)
            except ForgottenError:
                continue
            except BaseException:
                self._keep(user_id, queue[position:])
                raise

    def _keep(self, user_id: str, items: list[tuple[dict[str, Any], int]]) -> None:
        kept = [*items, *self._backlog.pop(user_id, [])]
        if len(kept) > MAX_BACKLOG:
            logger.error(
                "dropping %d unlearned interaction(s) of user %r: the backlog holds at most %d",
                len(kept) - MAX_BACKLOG, user_id, MAX_BACKLOG,
            )
            kept = kept[-MAX_BACKLOG:]
        self._backlog[user_id] = kept
        logger.warning(
            "kept %d interaction(s) of user %r to learn with their next interaction",
            len(kept), user_id,
        )


class _UserLock:
    """The per-user lock of one Memory, dropped from its dict when nobody holds or awaits it."""

    def __init__(self, memory: Memory, user_id: str) -> None:
        self._memory, self._user = memory, user_id

    async def __aenter__(self) -> None:
        memory, user = self._memory, self._user
        lock = memory._locks.setdefault(user, asyncio.Lock())
        memory._users[user] = memory._users.get(user, 0) + 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._memory._locks[self._user].release()
        self._leave()

    def _leave(self) -> None:
        memory, user = self._memory, self._user
        memory._users[user] -= 1
        if not memory._users[user]:
            del memory._users[user]
            del memory._locks[user]


def interaction_of(state: State, *, excerpt_tokens: int = EXCERPT_TOKENS) -> dict[str, Any]:
    """What learning sees of a finished task: query, final response, success, and the task's
    own messages (newest kept within ``excerpt_tokens``)."""
    execution = state.execution
    lines = [
        f"{message['role']}: {message['content']}"
        for message in execution.messages
        if message.get("task_id") == state.task_id
    ]
    kept: list[str] = []
    budget = excerpt_tokens
    for line in reversed(lines):
        if budget <= 0:
            break
        piece = truncate_tokens(line, min(budget, MESSAGE_EXCERPT_TOKENS))
        budget -= count_tokens(piece)
        kept.append(piece)
    kept.reverse()
    return {
        "task_id": state.task_id,
        "query": state.query,
        "response": execution.response,
        "success": execution.stop_reason == "completed",
        "conversation": "\n".join(kept),
        **_telemetry.trace_field(),  # {"trace": …} when traced: keep it with the rest
    }
