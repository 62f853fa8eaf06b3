"""The memory domain: what is known of a user, how it enters the prompt, learning, forgetting.

Learning is durable work in the store. A task that completes with memory on is queued for
learning in the transaction that completes it (``learning_queue``: one row per user, its
tasks bounded); a :class:`Memory` claims queued learning with a lease, learns the claimed
tasks together in one model call, and stores what it learned in the transaction that takes
them off the queue. So a crash between an answer and its learning loses nothing (the next
process with memory on for that store claims it), and each task is learned once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .. import _telemetry, _time
from .._fence import DATA_NOTE, fence
from ..errors import ClaimLostError, ConfigurationError, ForgottenError, UsageError
from ..tokens import count_tokens, most_tokens, truncate_tokens
from .synthesizer import EXCERPT_TOKENS, MIN_EXCERPT_TOKENS, ImpressionSynthesizer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..llm.base import LLM
    from ..state.state import State
    from ..storage.base import ForgetReceipt, LearningClaim, LearningStatus, Store
    from .entries import ProfileEntry
    from .profile import Profile

PROFILE_TOKENS = 800
"""Token budget of the user context in the prompt (v1.0)."""

MESSAGE_EXCERPT_TOKENS = 400
"""Bound on any one message in the excerpt learning sees (a long tool output is cut)."""
QUOTED_SOURCES = 3
"""Sources of an entry whose messages :meth:`Memory.explain` quotes (the newest)."""
QUOTED_LINES = 3
"""Messages quoted per source (the user's, else the first)."""
QUOTE_CHARS = 300

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
    agent gets its own copy, with its own learning in flight); used alone, ``store=None``
    means the default database.

    Learning runs in the background: a completed task is queued in the store, and this
    memory claims and learns what is queued, at most ``max_learning`` users at once (a user's
    queued tasks in one model call). A failed attempt is retried ``learn_retries`` times with
    backoff from ``retry_delay`` seconds; then the tasks stay queued and are retried after
    ``retry_backoff`` seconds, doubled after each failure up to ``max_retry_delay``, or with
    the user's next interaction, by this or any process with memory on (:meth:`status` says
    what waits and what failed).
    Every ``sweep_interval`` seconds, while runs use it, it also learns what other processes
    left queued, and prunes history older than ``history_days`` days.
    :meth:`settle` waits at most ``settle_timeout`` seconds for learning in flight; what it
    does not finish stays queued. What a :meth:`forget` erased is never learned back.
    """

    store: Store | None = None
    llm: LLM | None = None
    synthesis_threshold: int = 3
    profile_tokens: int = PROFILE_TOKENS
    settle_timeout: float = 30.0
    learn_retries: int = 2
    retry_delay: float = 0.5
    retry_backoff: float = 30.0
    max_retry_delay: float = 3600.0
    max_learning: int = 4
    sweep_interval: float = 60.0
    history_days: float = 180.0
    learn_lease: float | None = None
    """Seconds a claim on a user's learning lasts (``None``: the store's default)."""
    _pending: set[asyncio.Task[None]] = field(init=False, repr=False, compare=False)
    _working: dict[str, asyncio.Task[None]] = field(init=False, repr=False, compare=False)
    _again: set[str] = field(init=False, repr=False, compare=False)
    _handed: dict[str, LearningClaim] = field(init=False, repr=False, compare=False)
    _sweeper: asyncio.Task[None] | None = field(init=False, repr=False, compare=False,
                                                default=None)
    _slots: tuple[Any, asyncio.Semaphore] | None = field(init=False, repr=False,
                                                         compare=False, default=None)
    _new_holder: Any = field(init=False, repr=False, compare=False, default=None)
    _owns_store: bool = field(init=False, repr=False, compare=False, default=False)
    _said_cannot_learn: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if not isinstance(self.synthesis_threshold, int) or self.synthesis_threshold < 1:
            raise UsageError("synthesis_threshold must be a positive integer")
        if min(self.settle_timeout, self.learn_retries, self.retry_delay, self.retry_backoff,
               self.max_retry_delay, self.history_days) < 0:
            raise UsageError("settle_timeout, learn_retries, retry_delay, retry_backoff, "
                             "max_retry_delay and history_days must not be negative")
        if not isinstance(self.max_learning, int) or self.max_learning < 1 \
                or self.sweep_interval <= 0 or (self.learn_lease is not None
                                                and self.learn_lease <= 0):
            raise UsageError("max_learning, sweep_interval and learn_lease must be positive")
        from ..storage.base import new_runner

        self._pending = set()
        self._working = {}  # the worker learning each user, in this memory
        self._again = set()  # users queued again while their worker ran
        self._handed = {}  # claims a sweep made for a user whose worker runs
        self._new_holder = new_runner  # each claim has its own holder name

    def bind(self, store: Store, llm: LLM | None) -> Memory:
        """A copy of this memory with the agent's store and model filling what was left unset."""
        return replace(self, store=self.store or store, llm=self.llm or llm)

    def _store(self) -> Store:
        if self.store is None:
            from ..storage import open_store

            self.store = open_store()
            self._owns_store = True
        return self.store

    @property
    def learns(self) -> bool:
        """Whether this memory has a model able to learn (the default offline one is not)."""
        return self.llm is not None and bool(getattr(self.llm, "learns", True))

    def synthesizer(self) -> ImpressionSynthesizer:
        """The synthesizer learning with this memory's model and store."""
        if self.llm is None:
            raise UsageError(
                "this Memory has no model to learn with; pass Memory(llm=...) or give it to an "
                "Agent, whose model it then uses"
            )
        if not self.learns:
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
        Only current entries are in it: what was superseded is history.
        """
        profile = await self.profile(user_id)
        if profile is None or profile.is_empty():
            return ""
        inside = fence(profile.compress())
        if most_tokens(inside) + most_tokens(_FRAME) > self.profile_tokens:  # else it fits
            inside = truncate_tokens(inside, max(0, self.profile_tokens - count_tokens(_FRAME)))
        return f"{USER_CONTEXT}\n<user_profile>\n{inside}\n</user_profile>"

    async def entries(self, user_id: str) -> list[ProfileEntry]:
        """The user's current profile entries (each with its sources), oldest first."""
        return await self._store().load_entries(_user(user_id))

    async def history(self, user_id: str) -> list[ProfileEntry]:
        """The user's superseded entries, most recently superseded first."""
        entries = await self._store().load_entries(_user(user_id), history=True)
        old = [entry for entry in entries if not entry.current]
        old.sort(key=lambda entry: (entry.superseded_at, entry.rank), reverse=True)
        return old

    async def explain(self, user_id: str) -> list[dict[str, Any]]:
        """Each current entry (``to_dict()``) with why it is believed: every source, the
        newest :data:`QUOTED_SOURCES` with ``quotes``, the messages they cite (the user's
        lines, else the first, each cut to :data:`QUOTE_CHARS` characters; ``[]`` when the
        messages are no longer stored)."""
        store = self._store()
        loaded: dict[str, list[dict[str, Any]]] = {}
        explained = []
        for entry in await self.entries(user_id):
            item = entry.to_dict()
            sources = [dict(source) for source in entry.sources]
            for source in sources[-QUOTED_SOURCES:]:
                task = source.get("task_id")
                if not task:
                    source["quotes"] = []
                    continue
                if task not in loaded:
                    loaded[task] = await store.load_task_messages(task, user_id)
                source["quotes"] = _quotes(loaded[task], source.get("message_ids") or [])
            item["sources"] = sources
            explained.append(item)
        return explained

    async def status(self, user_id: str) -> LearningStatus | None:
        """What waits to be learned about the user (queued, failed), or ``None``."""
        return await self._store().learning_status(_user(user_id))

    # -- a person's corrections -------------------------------------------------------------

    async def set_entry(self, user_id: str, field: str, value: str, *, key: str | None = None,
                        replaces: str | None = None) -> ProfileEntry:
        """Add or change an entry as the user (``field``: a :class:`Profile` field; ``key``:
        a preference's or project's name; ``replaces``: the id of a current entry it
        replaces). The user's entry wins over learning: learning and consolidation never
        replace or drop it. Returns it."""
        made: list[ProfileEntry] = []

        def change(book: Any) -> None:
            made[:] = [book.set(field, value, key=key, replaces=replaces)]

        await self._store().change_profile(_user(user_id), change)
        return made[0]

    async def remove_entry(self, user_id: str, entry_id: str) -> ProfileEntry:
        """Take a current entry out of the profile (it stays as history, marked removed);
        ``NotFoundError`` if the user has no such current entry."""
        removed: list[ProfileEntry] = []

        def change(book: Any) -> None:
            removed[:] = [book.remove(entry_id)]

        await self._store().change_profile(_user(user_id), change)
        return removed[0]

    # -- learning ---------------------------------------------------------------------------

    async def generation(self, user_id: str) -> int:
        """The user's generation now: learning from what happens from here on passes it, so
        that a :meth:`forget` in between (in any process) keeps it from being stored."""
        return await self._store().user_generation(user_id)

    async def learn(
        self, user_id: str, interaction: dict[str, Any], *, generation: int | None = None
    ) -> Profile:
        """Learn from one interaction now (not queued); raises on failure.

        ``generation`` is the user's :meth:`generation` when the interaction began (read now
        when not given): if the user was forgotten since, nothing is stored and
        :class:`~cogency.errors.ForgottenError` is raised.
        """
        return await self.synthesizer().update_impression(
            user_id, interaction, generation=generation
        )

    def after_run(self, user_id: str, queued: bool) -> None:
        """Called by the agent after each run: learn the user's queued tasks soon (``queued``:
        the run queued one), and :meth:`start` sweeping."""
        if not self.learns:
            self._cannot_learn()
            return
        self.start()
        if queued:
            self.learn_soon(user_id)

    def start(self) -> None:
        """Learn, in the background, what any process left queued for any user (and prune
        old history), now and every ``sweep_interval`` seconds until :meth:`close`. A
        service calls it when it starts; the agent after each run. Needs a running event
        loop; does nothing with a model that cannot learn."""
        if not self.learns:
            return
        loop = asyncio.get_running_loop()
        if self._sweeper is None or self._sweeper.done() or self._sweeper.get_loop() is not loop:
            # The first sweep is pending from now: a close() that comes before the loop has
            # run anything else still settles it.
            self._sweeper = loop.create_task(self._sweep_forever(self._sweep_now()))

    def learn_soon(self, user_id: str) -> asyncio.Task[None] | None:
        """Learn the user's queued tasks in the background (one worker per user: a user
        queued again while it works is learned by the same worker). Returns the worker, or
        ``None`` with a model that cannot learn. Needs a running event loop."""
        if not self.learns:
            self._cannot_learn()
            return None
        working = self._working.get(user_id)
        if working is not None and not working.done():
            self._again.add(user_id)
            return working
        return self._start(user_id, None)

    def learning(self, user_id: str) -> asyncio.Task[None] | None:
        """The worker learning about the user in this memory now, if any."""
        task = self._working.get(user_id)
        return task if task is not None and not task.done() else None

    async def catch_up(self) -> int:
        """Claim what is queued and due for any user (at most ``max_learning`` users) and
        learn it in the background; also prune old history. Returns how many users."""
        if not self.learns:
            return 0
        store = self._store()
        await self._prune(store)
        claims = await self._claim(store, limit=self.max_learning)
        for claim in claims:
            if self.learning(claim.user_id) is not None:
                self._handed[claim.user_id] = claim  # its worker here takes it next
            else:
                self._start(claim.user_id, claim)
        return len(claims)

    @property
    def pending(self) -> int:
        """Background learning tasks not finished yet."""
        return len(self._pending)

    async def settle(self, timeout: float | None = None) -> bool:
        """Wait for learning in flight; past ``timeout`` (default ``settle_timeout``) cancel it.

        Returns ``True`` when everything finished. Never raises: a cancelled or failed learning
        is logged on the ``cogency.memory`` logger, and what it claimed stays queued.
        """
        limit = self.settle_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        stranded = {task for task in self._pending if task.get_loop() is not loop}
        if stranded:  # left by an event loop that has ended (asyncio.run): nothing can finish them
            logger.warning("%d learning task(s) of an ended event loop are dropped (their "
                           "tasks stay queued)", len(stranded))
            self._pending -= stranded
            for user in [u for u, t in self._working.items() if t in stranded]:
                del self._working[user]
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
                "what they claimed stays queued for the next process with memory on",
                len(late), limit,
            )
            for task in late:
                task.cancel()
            await asyncio.wait(late, timeout=1.0)
            self._pending -= late
            return False
        return True

    async def close(self) -> None:
        """Stop sweeping, settle learning in flight, then close the store if this memory
        opened it."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None and not sweeper.done():
            sweeper.cancel()
            if sweeper.get_loop() is asyncio.get_running_loop():
                await asyncio.wait([sweeper], timeout=1.0)
        await self.settle()
        if self._owns_store and self.store is not None:
            await self.store.close()
            self._owns_store = False

    # -- forgetting, export and import ------------------------------------------------------

    async def forget(self, user_id: str) -> ForgetReceipt:
        """Erase the user's profile (entries and history), conversations, messages,
        workspaces, approvals and queued learning in one transaction; returns the receipt
        (what was erased, per kind, and the user's new generation).

        Once it returns, nothing learned from before it is ever stored for the user, by this
        or any other Memory or process: the store advances the user's generation in the same
        transaction, and every learning write checks it (or its claim) inside its own.
        """
        self._again.discard(user_id)
        return await self._store().forget_user(_user(user_id))

    async def export_user(self, user_id: str) -> dict[str, Any]:
        """Everything stored about the user as one JSON document (see
        :mod:`cogency.storage.export`): profile, entries with their history, conversations
        with every message, unfinished tasks with their approvals, queued learning."""
        from ..storage.export import to_document

        return to_document(await self._store().export_user(_user(user_id)))

    async def import_user(self, document: Any, *, user_id: str | None = None) -> dict[str, int]:
        """Restore a document of :meth:`export_user` (as ``user_id`` when given) into a store
        holding nothing of that user; returns what it stored, per kind. ``UsageError`` for
        a malformed document, ``ConflictError`` when the user or one of its ids exists."""
        from ..storage.export import counts, from_document

        # Off the event loop: checking a large document (and counting its tokens) takes time.
        data = await asyncio.to_thread(
            from_document, document, user_id=None if user_id is None else _user(user_id))
        await self._store().import_user(data)
        return counts(data)

    # -- internals --------------------------------------------------------------------------

    def _cannot_learn(self) -> None:
        if not self._said_cannot_learn and self.llm is not None:
            self._said_cannot_learn = True
            logger.warning("%s is too small to learn user profiles: nothing is learned; "
                           "use Memory(llm=...) with a capable model", self.llm.name)

    def _lease(self) -> float:
        from ..storage.base import LEARN_LEASE

        return LEARN_LEASE if self.learn_lease is None else self.learn_lease

    def _start(self, user_id: str, claim: LearningClaim | None) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._work(user_id, claim))
        _telemetry.learning_pending(task)
        self._working[user_id] = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    def _sweep_now(self) -> asyncio.Task[None]:
        # Each sweep is pending learning: settle() waits for it (it may hold claims it has
        # not handed to a worker yet).
        sweep = asyncio.get_running_loop().create_task(self._sweep())
        self._pending.add(sweep)
        sweep.add_done_callback(self._pending.discard)
        return sweep

    async def _sweep_forever(self, sweep: asyncio.Task[None]) -> None:
        while True:
            await asyncio.wait([sweep])
            await asyncio.sleep(self.sweep_interval)
            sweep = self._sweep_now()

    async def _sweep(self) -> None:
        try:
            await self.catch_up()
        except Exception as exc:  # noqa: BLE001 - logged; the next sweep tries again
            logger.warning("looking for queued learning failed: %s: %s",
                           type(exc).__name__, exc)

    async def _prune(self, store: Store) -> None:
        before = _time.now() - timedelta(days=self.history_days)
        pruned = await store.prune_history(before)
        if pruned:
            logger.info("pruned %d profile history entries older than %g days", pruned,
                        self.history_days)

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_learning))
        return self._slots[1]

    async def _work(self, user_id: str, claim: LearningClaim | None) -> None:
        """Learn the user's queued tasks until none is due (one claim at a time)."""
        store = self._store()
        try:
            while True:
                claim = claim or self._handed.pop(user_id, None)
                if claim is None:
                    claims = await self._claim(store, user_id=user_id)
                    # Nothing awaits between these checks and returning: a user queued again
                    # (or a claim handed over) meanwhile is seen here, or finds no worker.
                    if not claims and user_id in self._handed:
                        continue
                    if not claims:
                        if user_id in self._again:
                            self._again.discard(user_id)
                            continue
                        return
                    claim = claims[0]
                async with self._slot():
                    learned = await self._learn_claim(claim)
                claim = None
                if not learned:
                    return
        except Exception as exc:  # noqa: BLE001 - logged; learning never breaks a run
            logger.warning("learning about user %r failed: %s: %s (what is queued stays "
                           "queued)", user_id, type(exc).__name__, exc)
        finally:
            if self._working.get(user_id) is asyncio.current_task():
                del self._working[user_id]
                left = self._handed.pop(user_id, None)
                if left is not None:  # (a worker that failed): let the next claim take it
                    await asyncio.shield(self._release(left, None))

    async def _learn_claim(self, claim: LearningClaim) -> bool:
        """Learn one claim, retrying; ``False`` when it failed and was released to wait."""
        attempts = self.learn_retries + 1
        failure: BaseException | None = None
        try:
            for attempt in range(1, attempts + 1):
                try:
                    await self._learn_once(claim)
                    return True
                except (ForgottenError, ClaimLostError) as exc:
                    logger.info("learning about user %r is dropped: %s", claim.user_id, exc)
                    return True
                except Exception as exc:  # noqa: BLE001 - logged, retried, then kept queued
                    failure = exc
                    logger.warning(
                        "learning about user %r failed (attempt %d of %d): %s: %s",
                        claim.user_id, attempt, attempts, type(exc).__name__, exc,
                    )
                if attempt < attempts:
                    await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
        except BaseException:
            # Cancelled (a settle that timed out, a shutdown): let another process take it.
            await asyncio.shield(self._release(claim, None))
            raise
        assert failure is not None
        delay = min(self.max_retry_delay, self.retry_backoff * 2 ** claim.attempts)
        retry_at = _time.now() + timedelta(seconds=delay)
        await self._release(claim, f"{type(failure).__name__}: {failure}"[:500], retry_at)
        logger.warning(
            "kept %d task(s) of user %r queued after %d failed attempts; retried at %s or "
            "with their next interaction (`cogency profile show` shows it)",
            len(claim.tasks), claim.user_id, attempts, retry_at.isoformat(timespec="seconds"),
        )
        return False

    async def _claim(self, store: Store, **which: Any) -> list[LearningClaim]:
        """``store.claim_learning`` under a holder of its own, safe to cancel. Cancelled while
        the claim is in flight (a settle that timed out, a shutdown), the holder is let go at
        once (a claim that lands is free to take in this process) and what landed is released
        in the store (free to take in any process): never held until its lease lapses."""
        from ..storage.base import abandon_runner  # storage builds on memory's modules

        holder = self._new_holder()
        claiming = asyncio.ensure_future(
            store.claim_learning(holder, lease=self._lease(), **which))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            abandon_runner(holder)
            try:
                claims = await asyncio.shield(claiming)
            except Exception:  # noqa: BLE001 - nothing was claimed
                claims = []
            for claim in claims:
                await asyncio.shield(self._release(claim, None))
            raise

    async def _release(self, claim: LearningClaim, error: str | None,
                       retry_at: Any = None) -> None:
        try:
            await self._store().release_learning(claim, error=error, retry_at=retry_at)
        except Exception as exc:  # noqa: BLE001 - the claim lapses by itself
            logger.warning("could not release the learning claim on user %r (it lapses by "
                           "itself): %s: %s", claim.user_id, type(exc).__name__, exc)

    async def _learn_once(self, claim: LearningClaim) -> None:
        store = self._store()
        user = claim.user_id
        generation = await store.user_generation(user)
        share = max(EXCERPT_TOKENS // max(len(claim.tasks), 1), MIN_EXCERPT_TOKENS)
        interactions = []
        for ref in claim.tasks:
            messages = await store.load_task_messages(ref["task_id"], user)
            if messages:  # (a task that left no message leaves nothing to learn)
                interaction = interaction_from(ref["task_id"], ref.get("conversation_id"),
                                               messages, excerpt_tokens=share)
                if ref.get("trace"):  # its run's trace link: learning's spans link to it
                    interaction["trace"] = ref["trace"]
                interactions.append(interaction)
        if claim.dropped:
            logger.warning("%d older finished task(s) of user %r were not learned: more than "
                           "the queue holds waited", claim.dropped, user)
        await self.synthesizer().learn(user, interactions, generation=generation, claim=claim)


def _user(user_id: str) -> str:
    from ..state.state import check_id  # state imports storage, which imports this package

    return check_id(user_id, "user_id")


def _quotes(messages: Sequence[dict[str, Any]], ids: Sequence[str]) -> list[dict[str, Any]]:
    wanted = set(ids)
    cited = [m for m in messages if m.get("id") in wanted]
    said = [m for m in cited if m.get("role") == "user"] or cited[:1]
    return [{"id": m.get("id"), "role": m.get("role"), "created_at": m.get("created_at"),
             "content": _clip(str(m.get("content") or ""), QUOTE_CHARS)}
            for m in said[:QUOTED_LINES]]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def interaction_of(state: State, *, excerpt_tokens: int = EXCERPT_TOKENS) -> dict[str, Any]:
    """What learning sees of a finished task: query, final response, success, and the task's
    own messages (newest kept within ``excerpt_tokens``), with the ids of those messages."""
    execution = state.execution
    own = [m for m in execution.messages if m.get("task_id") == state.task_id]
    interaction = interaction_from(state.task_id, state.conversation.conversation_id, own,
                                   excerpt_tokens=excerpt_tokens)
    interaction.update(query=state.query, response=execution.response,
                       success=execution.stop_reason == "completed",
                       **_telemetry.trace_field())  # {"trace": …} when traced: keep it
    return interaction


def interaction_from(
    task_id: str, conversation_id: str | None, messages: Sequence[dict[str, Any]], *,
    excerpt_tokens: int = EXCERPT_TOKENS,
) -> dict[str, Any]:
    """What learning sees of a completed task from its stored messages (oldest first): its
    query (its first user message), its answer (its last assistant message), and an excerpt
    of its messages, the newest kept within ``excerpt_tokens``, with their ids."""
    kept: list[tuple[str, Any]] = []
    budget = excerpt_tokens
    for message in reversed(messages):
        if budget <= 0:
            break
        line = f"{message['role']}: {message['content']}"
        piece = truncate_tokens(line, min(budget, MESSAGE_EXCERPT_TOKENS))
        budget -= count_tokens(piece)
        kept.append((piece, message.get("id")))
    kept.reverse()
    query = next((m["content"] for m in messages if m.get("role") == "user"), "")
    response = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"),
                    None)
    return {
        "task_id": task_id,
        "conversation_id": conversation_id,
        "query": query,
        "response": response,
        "success": True,
        "conversation": "\n".join(piece for piece, _ in kept),
        "message_ids": [str(ident) for _, ident in kept if ident],
    }
