"""Runs in flight on this replica: started by one request, followed by it (or waited for).

A run is ``Agent.stream``/``Agent.resume_stream`` driven by its own asyncio task, so a client
that goes away does not stop it: it ends as it would have, and its answer is in the
conversation. The store decides who may run a conversation (``hold_conversation``), so the
one-run-per-conversation rule holds across replicas; the per-key limit is per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from .. import _time
from .._ids import new_uuid
from ..agent import Agent, AgentResult
from ..client import SETTINGS_KEY
from ..errors import CogencyError, NotFoundError, UsageError
from ..events import Approval, End, Response, Start
from ..llm.base import OPTIONS, check_options
from ..state.state import check_id
from ..storage.base import RequestRecord, new_runner
from .errors import (
    InvalidValue,
    KeyReused,
    RequestTooLarge,
    RunError,
    ShuttingDown,
    StillRunning,
    TooManyRuns,
    status_of,
)

log = logging.getLogger("cogency.server")


@dataclass(frozen=True)
class Once:
    """A request that starts at most one run, whoever sends it again (a client's retry):
    ``key`` and ``request`` are SHA-256 hex digests of its idempotency key and of the request
    itself; ``replace`` takes the key over from an older request (the first attempt of an
    SDK's request, whose key is the request itself); ``ttl`` seconds it is remembered."""

    key: str
    request: str
    replace: bool = False
    ttl: float = 24 * 3600.0


def _not_yours(conversation_id: str) -> NotFoundError:
    return NotFoundError(
        f"no conversation {conversation_id[:80]!r} among yours (GET /api/conversations lists "
        "them; leave the id out to start a new conversation)")


class Run:
    """One run: the events so far (as ``event.to_dict()``), then its result or failure."""

    def __init__(self, key_id: str, conversation_id: str, user_id: str = "") -> None:
        self.key_id = key_id
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.task_id: str | None = None
        self.events: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        """The result as the API returns it (:meth:`summary`), once the run ended with one."""
        self.failure: BaseException | None = None
        self.done = False
        self._changed = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None
        self.created = int(time.time())
        """When the run began (Unix seconds): what the OpenAI endpoints call ``created``, the
        same in every answer to the request, its retries' too."""
        self.kept = True
        """Whether its task is stored to resume (``False``: a run that keeps nothing, deleted
        with its conversation once it ends, unless it paused)."""

    @classmethod
    def replayed(cls, record: RequestRecord) -> Run:
        """The run a request with an idempotency key started, over, as its outcome was
        stored: its result (with the events that tell it: start, response, approvals, end),
        or its failure."""
        assert record.outcome is not None
        run = cls("", record.conversation_id or "")
        run.task_id = task = record.task_id or ""
        run.created = int(record.outcome.get("created", run.created))
        run.events.append(Start(task, run.conversation_id).to_dict())
        if "result" in record.outcome:
            result = run.result = record.outcome["result"]
            if result["response"] is not None:
                run.events.append(Response(task, result["response"]).to_dict())
            run.events += [Approval(task, call["id"], call["name"], call["args"],
                                    call.get("decider", "person")).to_dict()
                           for call in result["pending_approvals"]]
            run.events.append(End(task, result["stop_reason"], result["iterations"]).to_dict())
        else:
            error = record.outcome["error"]
            run.failure = RunError(error["status"], error["kind"], error["message"])
        run.done = True
        return run

    async def publish(self, event: dict[str, Any] | None) -> None:
        """Add an event for the followers (``None`` only wakes them: the run is done)."""
        async with self._changed:
            if event is not None:
                self.events.append(event)
            self._changed.notify_all()

    async def started(self) -> None:
        """Wait for the first event; a run that failed before it raises its error."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self.events) or self.done)
        if not self.events and self.failure is not None:
            raise self.failure

    async def finished(self) -> dict[str, Any]:
        """Wait for the end; the result, or the failure as a :class:`RunError` (told after the
        run started, so no client retries it into another run)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.done)
        if self.failure is not None:
            raise RunError(*self.problem())
        assert self.result is not None
        return self.result

    async def follow(self, heartbeat: float = 15.0) -> AsyncIterator[dict[str, Any] | None]:
        """Every event from the first, live; ``None`` when nothing happened for ``heartbeat``
        seconds (a keep-alive). A run that fails midway ends with a fatal ``error`` event."""
        seen = 0
        while True:
            async with self._changed:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: len(self.events) > seen or self.done),
                        heartbeat,
                    )
                except asyncio.TimeoutError:
                    pass
                fresh = self.events[seen:]
                finished = self.done  # set after the last event: `fresh` holds the rest
            if not fresh and not finished:
                yield None
                continue
            for event in fresh:
                yield event
            seen += len(fresh)
            if finished:
                if self.failure is not None:  # it raised: no `end` event came
                    status, _, message = self.problem()
                    yield {"type": "error", "task_id": self.task_id or "", "message": message,
                           "fatal": True, "status": status}
                return

    def problem(self) -> tuple[int, str, str]:
        """The failure as its client is told it: status, error type and message (anything
        but the package's own errors is an internal error, its details only in the log)."""
        assert self.failure is not None
        if isinstance(self.failure, CogencyError):
            return (*status_of(self.failure), str(self.failure))
        return 500, "internal", "internal server error"

    def summary(self) -> dict[str, Any]:
        """The result as the API returns it."""
        assert self.result is not None
        return self.result

    def outcome(self) -> dict[str, Any]:
        """What a retry of the request that started this run is answered (stored as JSON)."""
        if self.failure is not None:
            status, kind, message = self.problem()
            return {"error": {"status": status, "kind": kind, "message": message},
                    "created": self.created}
        return {"result": self.summary(), "created": self.created}


def _summary(result: AgentResult) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "conversation_id": result.conversation_id,
        "response": result.response,
        "stop_reason": result.stop_reason,
        "iterations": result.iterations,
        "usage": asdict(result.usage),
        "error": result.error,
        "pending_approvals": [
            {"id": call["id"], "name": call["name"], "args": call.get("args", {}),
             "decider": call.get("decider", "person")}
            for call in result.pending_approvals
        ],
        "truncated": result.truncated,
    }


class Runs:
    """Starts runs, enforces the limits, and finishes or saves them on shutdown."""

    def __init__(self, agent: Agent, *, max_per_key: int = 4, max_query: int = 32_000) -> None:
        self.agent = agent
        self.max_per_key = max_per_key
        self.max_query = max_query
        self._per_key: Counter[str] = Counter()
        self._learning: set[tuple[str, str]] = set()
        """(key, user) pairs whose slot is held by the user's learning in flight."""
        self._live: set[Run] = set()
        self._keyed: dict[tuple[str, str], Run] = {}
        """Runs in flight here that a request with an idempotency key started."""
        self._closing = False

    def __len__(self) -> int:
        return len(self._live)

    def model_options(self, options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``options`` without the model options the agent's model cannot take (named in the
        list returned): a client's sampling settings are honoured where the model can, never
        a reason to refuse its request. A value out of range is an :class:`InvalidValue`."""
        kept: dict[str, Any] = {}
        dropped: list[str] = []
        for name, value in options.items():
            if name in OPTIONS:
                try:
                    check_options({name: value})
                except UsageError as exc:
                    raise InvalidValue(str(exc), name) from None
                try:
                    self.agent.llm.with_options(**{name: value})
                except UsageError:
                    dropped.append(name)
                    continue
            kept[name] = value
        return kept, dropped

    async def start(
        self,
        user_id: str,
        key_id: str,
        *,
        query: str | None = None,
        conversation_id: str | None = None,
        task_id: str | None = None,
        approvals: dict[str, bool] | None = None,
        history: Sequence[tuple[str, str]] = (),
        find: Callable[[], Awaitable[str | None]] | None = None,
        once: Once | None = None,
        asks: Mapping[str, Any] | None = None,
        results: Mapping[str, Any] | None = None,
    ) -> Run:
        """Start a new run (``query``, after storing ``history`` as ``Agent.stream`` does, with
        what the client ``asks``: ``Agent.stream``'s ``instructions``, ``options``,
        ``client_tools``, ``output_schema``, ``keep``) or resume ``task_id`` (deciding the calls
        it waits for with ``approvals``, and the client's with ``results``); returns once it
        has begun. A run that keeps nothing (``keep=False``) gets a new conversation that no
        one else can know, so it takes no hold on it.

        ``conversation_id`` is one the client named: it must be one of the user's (the
        service makes the ids of new conversations). ``find``, for a ``history`` resent
        without one, names the stored conversation that it is (continued instead of storing
        ``history`` again) or None; it is called only once the key's slot is taken, so a key
        at its limit costs no reads.

        With ``once``, a request sent again (the same idempotency key) gets the run the
        first one started: that run itself while it is in flight here, its stored outcome
        once over (on any replica, after a restart), :class:`StillRunning` while it runs on
        another replica; never a second run.

        Errors before the run begins (a bad id, another user's conversation or task, a
        conversation with a run in flight, too many runs) are raised here.
        """
        if self._closing:
            raise ShuttingDown("the server is shutting down; retry on another replica")
        if query is not None and len(query) > self.max_query:
            raise RequestTooLarge(
                f"the query has {len(query)} characters; this server takes at most "
                f"{self.max_query}"
            )
        if self._per_key[key_id] >= self.max_per_key:
            raise TooManyRuns(
                f"this key has {self._per_key[key_id]} runs in flight (learning from finished "
                "ones counts as one), the most this server allows; wait for one to end"
            )
        self._per_key[key_id] += 1  # taken before any await: concurrent requests see it
        claimed = False
        try:
            if once is not None:
                earlier = await self._claim(user_id, once)
                if earlier is not None:
                    self._release_slot(key_id)
                    return earlier
                claimed = True
            named = conversation_id is not None
            if conversation_id is not None:
                check_id(conversation_id, "conversation_id")
                if asks and asks.get("keep", True) is False:  # no hold: it is checked here
                    await self._check_named(conversation_id, user_id)
            if find is not None and conversation_id is None:
                conversation_id = await find()
                if conversation_id is not None:
                    history = ()  # stored already
            run = await self._open(key_id, user_id, query, conversation_id, task_id, history,
                                   approvals, once, asks or {}, results, named)
        except BaseException:
            self._release_slot(key_id)
            if claimed:
                assert once is not None
                await self._forget_claim(user_id, once)
            raise
        await run.started()
        if once is not None and run.task_id is not None:
            try:
                await self.agent.store.settle_request(user_id, once.key, task_id=run.task_id,
                                                      conversation_id=run.conversation_id)
            except Exception as exc:  # noqa: BLE001 - the outcome is recorded at the end
                log.warning("could not record an idempotency key's run: %s", type(exc).__name__)
        return run

    async def _claim(self, user_id: str, once: Once) -> Run | None:
        """None once ``once``'s key is this request's; else the run an earlier request with
        it started (or the error that says where it stands)."""
        expires = _time.now() + timedelta(seconds=once.ttl)
        record = RequestRecord(user_id, once.key, once.request, expires)
        earlier = await self.agent.store.claim_request(record, replace=once.replace)
        if earlier is None:
            return None
        if earlier.request != once.request:
            raise KeyReused("this Idempotency-Key was sent before with another request; use a "
                            "new key for a new request")
        if earlier.outcome is not None:
            return Run.replayed(earlier)
        live = self._keyed.get((user_id, once.key))
        if live is not None:
            return live
        task = f" (task {earlier.task_id})" if earlier.task_id else ""
        raise StillRunning(
            f"the run this request started before{task} has not ended: retry to get its "
            "outcome; if its server stopped, its task is unfinished (GET /api/tasks lists it, "
            "POST /api/tasks/TASK_ID/resume continues it)")

    async def _forget_claim(self, user_id: str, once: Once) -> None:
        try:
            await asyncio.shield(self.agent.store.drop_request(user_id, once.key))
        except Exception as exc:  # noqa: BLE001 - the key answers "in progress" till it expires
            log.warning("could not drop an idempotency key: %s", type(exc).__name__)

    async def _check_named(self, conversation_id: str, user_id: str) -> None:
        """A conversation a client names must be one of the user's: new ones get ids made
        here, so no client can take an id before its owner does. (The hold on a named
        conversation checks it as it is taken: this is for a run that takes none.)"""
        try:
            await self.agent.store.load_conversation(conversation_id, user_id)
        except NotFoundError:
            raise _not_yours(conversation_id) from None

    async def _open(self, key_id: str, user_id: str, query: str | None,
                    conversation_id: str | None, task_id: str | None,
                    history: Sequence[tuple[str, str]],
                    approvals: dict[str, bool] | None, once: Once | None,
                    asks: Mapping[str, Any], results: Mapping[str, Any] | None,
                    named: bool = False) -> Run:
        store = self.agent.store
        runner: str | None = new_runner()
        kept = asks.get("keep", True) is not False
        if task_id is not None:
            # checks the ids first
            events = self.agent.resume_stream(task_id, user_id, approvals=approvals,
                                              results=results)
            record = await store.load_task(task_id, user_id)
            conversation_id = record.conversation_id
            # A task begun with store: false is deleted when this run ends, whatever its end.
            kept = record.settings.get(SETTINGS_KEY, {}).get("keep", True) is not False
        elif not kept:
            assert query is not None
            events = self.agent.stream(query, user_id, history=history, **asks)
            runner = None  # its conversation is new, made by the agent: no one else can run it
        else:
            # The id is chosen here, so that even a new conversation is held from the start.
            conversation_id = conversation_id or new_uuid()
            assert query is not None
            events = self.agent.stream(query, user_id, conversation_id, history=history, **asks)
        if runner is not None:
            assert conversation_id is not None
            try:
                await store.hold_conversation(conversation_id, user_id, runner,
                                              existing=named)
            except NotFoundError:
                if not named:
                    raise
                raise _not_yours(conversation_id) from None
        run = Run(key_id, conversation_id or "", user_id)
        run.kept = kept
        self._live.add(run)
        if once is not None:
            self._keyed[(user_id, once.key)] = run
        run.task = asyncio.create_task(self._drive(run, events, runner, user_id, once))
        return run

    async def _drive(self, run: Run, events: Any, runner: str | None, user_id: str,
                     once: Once | None) -> None:
        try:
            async for event in events:
                run.task_id = run.task_id or event.task_id
                if isinstance(event, Start):
                    run.conversation_id = event.conversation_id
                await run.publish(event.to_dict())
            run.result = _summary(events.result)
        except Exception as exc:  # the run's error belongs to its followers
            run.failure = exc
            if not isinstance(exc, CogencyError):
                log.error("a run failed: %s", type(exc).__name__, exc_info=exc)
        except BaseException:
            # Cancelled by a shutdown, or KeyboardInterrupt, SystemExit: the process stops.
            # The agent saved and released the task (as on any exception); the followers are
            # told so, and the stop goes on up, never swallowed as this run's error.
            task = run.task_id or "TASK_ID"
            run.failure = ShuttingDown(
                f"the server shut down during this run; its task {task} was saved: resume it "
                f"with POST /api/tasks/{task}/resume (on any replica)"
            )
            raise
        finally:
            try:
                await asyncio.shield(self._settle(run, runner, user_id, once))
            finally:  # also when a second cancellation cuts the release short
                self._live.discard(run)
                if once is not None and self._keyed.get((user_id, once.key)) is run:
                    del self._keyed[(user_id, once.key)]
                self._release_after_learning(run)
                run.done = True
                await run.publish(None)

    async def _settle(self, run: Run, runner: str | None, user_id: str,
                      once: Once | None) -> None:
        """Let the conversation go, and store the outcome for the idempotency key (if any),
        before the followers hear the run is over."""
        store = self.agent.store
        try:
            if runner is not None:
                await store.release_conversation(run.conversation_id, runner)
        except Exception as exc:  # noqa: BLE001 - the hold dies with this process anyway
            log.warning("could not release a conversation: %s", type(exc).__name__)
        if once is None:
            return
        if not run.events:  # it failed before it began: nothing ran, a retry may run it
            await self._forget_claim(user_id, once)
            return
        try:
            await store.settle_request(user_id, once.key, task_id=run.task_id,
                                       conversation_id=run.conversation_id,
                                       outcome=run.outcome())
        except Exception as exc:  # noqa: BLE001 - retries then hear "in progress" until expiry
            log.warning("could not record a run's outcome for its idempotency key: %s",
                        type(exc).__name__)

    def _release_after_learning(self, run: Run) -> None:
        """Free the run's slot, or, when it left its user's learning in flight, once that
        ends: background learning counts in the per-key limit (one slot per key and user,
        however many runs it learns from; a user's learning is one worker, its queue one
        bounded row)."""
        memory = self.agent.memory
        learning = memory.learning(run.user_id) if memory is not None else None
        pair = (run.key_id, run.user_id)
        if learning is None or pair in self._learning:
            self._release_slot(run.key_id)
            return
        self._learning.add(pair)

        def done(_: object) -> None:
            self._learning.discard(pair)
            self._release_slot(run.key_id)

        learning.add_done_callback(done)

    def _release_slot(self, key_id: str) -> None:
        self._per_key[key_id] -= 1
        if self._per_key[key_id] <= 0:
            del self._per_key[key_id]

    async def shutdown(self, grace: float) -> None:
        """Let runs in flight finish for ``grace`` seconds, then cancel the rest (each saves
        its task, which stays resumable, and its followers are told so). No new run starts
        meanwhile."""
        self._closing = True
        tasks = [run.task for run in self._live if run.task is not None]
        if not tasks:
            return
        log.info("waiting up to %gs for %d runs in flight", grace, len(tasks))
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.info("saved %d unfinished runs; their tasks can be resumed", len(pending))
            with contextlib.suppress(Exception):
                await asyncio.wait(pending, timeout=30)
