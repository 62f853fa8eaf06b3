"""The agent: a pure ReAct loop over the state, with live events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ._json import dumps
from .approvals import Policy, check_policy, run_step, settle_decided
from .context import (
    MESSAGE_TOKENS,
    Budgets,
    build_context,
    check_query_fits,
    prompt_messages,
    system_prompt,
)
from .errors import ContextLengthError, LeaseLostError, LLMError, StoreLockedError, UsageError
from .events import (
    Action, Approval, End, Error, Event, Reason, Response, Result, Retry, Start, Token,
)
from .llm.base import LLM, Usage, retries_reported_to
from .llm.resolve import resolve_llm
from .memory.memory import Memory
from .reason import Step, reason
from .state.execution import Execution
from .state.state import DEFAULT_HISTORY_TOKENS, State, add_message, autosave, check_id
from .storage import open_store
from .storage.base import Store, new_runner
from .tokens import count_tokens
from .state.workspace import Workspace
from .tools.base import Tool, Toolset, hide_store_files

_log = logging.getLogger(__name__)
STOP_REASONS = (
    "completed", "security", "max_iterations", "no_progress", "invalid_response", "error",
    "cancelled", "awaiting_approval",
)
NO_PROGRESS_LIMIT = 3
"""Consecutive steps with neither a response nor an action before the run stops."""
REFUSAL = "I can't help with that request."
CANCELLED_RESULT = {
    "ok": False, "cancelled": True,
    "error": "cancelled before it finished (it may or may not have taken effect)",
}
"""The result stored for a call the run was cancelled in: resume never replays it."""


@dataclass
class AgentResult:
    """What a run produced. ``stop_reason`` is one of :data:`STOP_REASONS`."""

    response: str | None
    task_id: str
    conversation_id: str
    stop_reason: str
    iterations: int
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    security_assessment: str | None = None
    pending_approvals: list[dict[str, Any]] = field(default_factory=list)
    """With ``stop_reason="awaiting_approval"``: the calls waiting for a person, each a dict
    with ``id``, ``name`` and ``args``; decide them with ``resume(approvals=...)``."""


class Agent:
    """A stateful agent: give it a model, tools and a store, then ``run`` queries.

    ``store=None`` opens the default SQLite file; ``memory=True`` learns a profile of each
    user with the agent's model (``Memory(llm=...)`` chooses another). Every run saves its
    workspace after each iteration; a run that stops early keeps it so ``resume`` continues.

    ``approve`` decides the calls of tools that need approval: ``None`` pauses the task
    (``stop_reason="awaiting_approval"``, resumable with ``resume(approvals=...)``), ``True``
    allows them all, an async (or plain) callable of the call (a dict with ``id``, ``name``,
    ``args``, ``task_id``, ``user_id``) returns True to allow it, False to deny it.
    """

    def __init__(
        self,
        llm: LLM | str | None = None,
        tools: Sequence[Tool | Toolset] = (),
        store: Store | str | None = None,
        memory: Memory | bool = False,
        identity: str = "",
        max_iterations: int = 10,
        *,
        invalid_retries: int = 2,
        llm_retries: int = 2,
        retry_delay: float = 0.5,
        history_tokens: int = DEFAULT_HISTORY_TOKENS,
        budgets: Budgets = Budgets(),
        approve: Policy = None,
    ) -> None:
        if not isinstance(max_iterations, int) or max_iterations < 1:
            raise UsageError("max_iterations must be a positive integer")
        self.llm, self._owns_llm = resolve_llm(llm)
        self.tools: dict[str, Tool] = {}
        self.toolsets: list[Toolset] = []
        for item in tools:
            if _is_toolset(item):
                self.toolsets.append(cast(Toolset, item))
                continue
            if not isinstance(item, Tool):
                raise UsageError(
                    f"tools must be Tool objects (decorate functions with @tool), got {item!r}"
                )
            if item.name in self.tools:
                raise UsageError(f"two tools are named {item.name!r}; tool names must be unique")
            self.tools[item.name] = item
        # A duck-typed check: isinstance() against the runtime Protocol costs more than the rest.
        self._owns_store = not _is_store(store)
        self.store: Store = cast(Store, store) if _is_store(store) else open_store(cast(str, store))
        hide_store_files(self.tools.values(), self.store)  # e.g. the shell sandbox hides them
        if memory is True:
            memory = Memory()
        self.memory: Memory | None = memory.bind(self.store, self.llm) if memory else None
        self.identity = identity
        self.max_iterations = max_iterations
        self.invalid_retries = invalid_retries
        self.llm_retries = llm_retries
        self.retry_delay = retry_delay
        self.history_tokens = history_tokens
        self.budgets = budgets
        self.approve = check_policy(approve)
        self._closed = False
        self._runs: set[asyncio.Task[AgentResult]] = set()

    # -- public API -----------------------------------------------------------------------

    async def run(
        self, query: str, user_id: str = "default", conversation_id: str | None = None
    ) -> AgentResult:
        """Run a new task to its end and return what it produced."""
        return await self._collect(self.stream(query, user_id, conversation_id))

    async def resume(
        self, task_id: str, user_id: str = "default", *,
        approvals: Mapping[str, bool] | None = None,
    ) -> AgentResult:
        """Continue an unfinished task from its saved workspace and conversation.

        A task paused for approval needs its calls decided first: ``approvals`` maps each
        call id to True (run it) or False (the model is told the user denied it); the agent's
        ``approve`` policy decides what is left, and with ``approve=None`` an undecided call
        raises :class:`~cogency.errors.ApprovalRequiredError` listing them.
        """
        return await self._collect(self.resume_stream(task_id, user_id, approvals=approvals))

    def stream(
        self,
        query: str,
        user_id: str = "default",
        conversation_id: str | None = None,
        *,
        settings: dict[str, Any] | None = None,
        history: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[Event]:
        """Run a new task, yielding its events as they happen; the last one is ``end``.

        ``settings`` (a JSON object) is stored with the task and read back as
        ``TaskRecord.settings`` (``store.load_task``), e.g. to rebuild this agent to resume it.
        ``history`` (``("user" | "assistant", text)`` pairs) is stored in the conversation
        before the query, in the same transaction: turns held elsewhere, now its own.
        """
        check_id(user_id, "user_id")
        if not isinstance(query, str) or not query.strip():
            raise UsageError("query must be a non-empty string")

        async def open_task(runner: str) -> tuple[State, bool]:
            # One transaction creates the task, holds it for this runner, and stores the query.
            state = await State.start_task(
                query, user_id, conversation_id, self.store,
                max_iterations=self.max_iterations, history_tokens=self.history_tokens,
                record_query=True, runner=runner, settings=settings, history=history,
            )
            return state, False

        return self._drive(open_task, query)

    def resume_stream(
        self, task_id: str, user_id: str = "default", *,
        approvals: Mapping[str, bool] | None = None,
    ) -> AsyncIterator[Event]:
        """Continue an unfinished task, yielding its events as they happen (see :meth:`resume`)."""
        check_id(task_id, "task_id")
        check_id(user_id, "user_id")
        if approvals is not None and not isinstance(approvals, Mapping):
            raise UsageError("approvals must be a mapping of call id to True or False")

        async def open_task(runner: str) -> tuple[State, bool]:
            state = await State.continue_task(
                task_id, user_id, self.store,
                max_iterations=self.max_iterations, history_tokens=self.history_tokens,
            )
            state.epoch = await self.store.claim_task(task_id, user_id, runner)
            return state, True

        return self._drive(open_task, approvals=approvals)

    def run_sync(
        self, query: str, user_id: str = "default", conversation_id: str | None = None
    ) -> AgentResult:
        """:meth:`run` for code without an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._run_and_settle(query, user_id, conversation_id))
        raise UsageError("run_sync cannot be called inside a running event loop; await run()")

    async def release(self, task_id: str, user_id: str = "default") -> str | None:
        """Take an unfinished task away from a runner known to be dead, so it can be resumed
        at once: that runner's later writes are refused. Returns the runner it held, if any.

        Only for a runner that cannot finish (its machine is gone, its process was killed
        under another host name): a live one stops at its next write with ``LeaseLostError``.
        """
        check_id(task_id, "task_id")
        check_id(user_id, "user_id")
        return await self.store.force_release(task_id, user_id)

    async def close(self) -> None:
        """Stop the runs still in flight (each saves its task and releases it, as a
        cancellation does), then release what the agent opened (never a store or model that
        was passed in). A run stopped here raises ``UsageError`` to whoever awaits it."""
        if self._closed:
            return
        self._closed = True
        runs = list(self._runs)
        for run in runs:
            run.cancel()
        if runs:
            await asyncio.wait(runs)
        if self.toolsets:  # stops the servers this agent started
            closed = await asyncio.gather(
                *(toolset.aclose() for toolset in self.toolsets), return_exceptions=True
            )
            for toolset, outcome in zip(self.toolsets, closed):
                if isinstance(outcome, Exception):
                    _log.warning("closing %r failed: %s", toolset, outcome)
        if self.memory is not None:
            await self.memory.close()  # waits (bounded) for pending learning; never raises
        if self._owns_store:
            await self.store.close()
        if self._owns_llm:
            await self.llm.close()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the loop -------------------------------------------------------------------------

    async def _run_and_settle(
        self, query: str, user_id: str, conversation_id: str | None
    ) -> AgentResult:
        result = await self.run(query, user_id, conversation_id)
        if self.memory is not None:
            await self.memory.settle()  # asyncio.run would cancel learning left pending
        return result

    async def _collect(self, events: AsyncIterator[Event]) -> AgentResult:
        async for _ in events:
            pass
        result = getattr(events, "result", None)
        assert isinstance(result, AgentResult)
        return result

    def _drive(
        self, open_task: Callable[[str], Awaitable[tuple[State, bool]]], query: str | None = None,
        approvals: Mapping[str, bool] | None = None,
    ) -> _EventStream:
        if self._closed:
            raise UsageError("this agent is closed; create a new Agent")
        return _EventStream(lambda emit: self._execute(open_task, emit, query, approvals), self)

    async def _execute(
        self,
        open_task: Callable[[str], Awaitable[tuple[State, bool]]],
        emit: Callable[[Event], None],
        query: str | None = None,
        approvals: Mapping[str, bool] | None = None,
    ) -> AgentResult:
        await self.llm.start()  # e.g. learn the context window from the server
        window = self.llm.context_window
        runner = new_runner()
        tools = await self._tools_for_run()
        if query is not None:
            # Before anything is stored: a query that can never fit is the caller's to fix.
            self._check_fits(query, window, tools)
        state, resumed = await open_task(runner)
        ex, usage, error = state.execution, Usage(), None
        task = state.task_id
        recorded: dict[str, list[dict[str, Any]]] = {}
        saving: asyncio.Future[None] | None = None
        waiting: list[dict[str, Any]] = []  # calls that wait for a person when the run ends

        async def save() -> None:
            # Shielded: a cancellation never parts a write from the state's record of it.
            nonlocal saving
            saving = asyncio.ensure_future(autosave(state))
            await asyncio.shield(saving)

        emit(Start(task, state.conversation.conversation_id, state.query, resumed))
        try:
            if resumed:
                # State.continue_task loaded the task's own messages whole, whatever the
                # history window (by task from the store when they outgrew it).
                stored = [m for m in ex.messages if m.get("task_id") == task]
                recorded = _recorded_results(stored)
                if not stored:  # begun by State.start_task alone: the query is not stored yet
                    add_message(state, "user", state.query)
                    await save()
                if await settle_decided(state, tools, approvals, self.approve, emit):
                    await save()
            memory = ""
            if self.memory is not None:
                memory = await self.memory.activate(state.user_id)
            while True:
                if ex.iteration >= ex.max_iterations:
                    ex.stop_reason = "max_iterations"
                    break
                ex.advance_iteration()
                first = ex.iteration == 1
                system = system_prompt(
                    build_context(memory, state.workspace, ex, list(tools.values()),
                                  self.budgets),
                    self.identity,
                    first,
                )
                step, spent, window = await self._ask(system, ex.messages, task, window, tools,
                                                      first, emit)
                usage = usage + spent
                if step is None:
                    ex.stop_reason = "invalid_response"
                    error = "the model's replies did not follow the JSON contract"
                    break
                state.workspace.update(step.workspace)
                emit(Reason(task, ex.iteration, state.workspace.to_dict()))
                if first and not step.secure:
                    state.security_assessment = (
                        step.workspace.get("understanding") or step.response or "judged unsafe"
                    )
                    ex.response = step.response or REFUSAL
                    ex.stop_reason = "security"
                elif step.actions:
                    # A call whose result this task already stored (before a crash) is not run
                    # again: its recorded result is reused and nothing is stored twice.
                    replayed = [_take_recorded(recorded, call) for call in step.actions]
                    fresh = [call for call, old in zip(step.actions, replayed) if old is None]
                    ex.set_tool_calls(fresh)
                    if fresh:
                        add_message(state, "assistant", dumps({"actions": fresh}))
                    for call in step.actions:
                        emit(Action(task, ex.iteration, call["name"], call["args"]))
                    step_results, waiting = await run_step(tools, fresh, self.approve, state)
                    ran = iter(step_results)
                    results: list[dict[str, Any] | None] = [
                        next(ran) if old is None else old for old in replayed
                    ]
                    ex.complete_tool_calls([r for r in results if r is not None])
                    for result, old in zip(results, replayed):
                        if result is None:
                            continue  # it waits for a person: no result yet
                        if old is None:
                            add_message(state, "tool", dumps(result))
                        emit(Result(task, ex.iteration, result["name"], result["ok"],
                                    result.get("output", result.get("error", ""))))
                    ex.iterations_without_tools = 0
                    if waiting:
                        ex.stop_reason = "awaiting_approval"
                elif step.response is not None:
                    ex.response = step.response
                    ex.stop_reason = "completed"
                else:
                    ex.iterations_without_tools += 1
                    if ex.iterations_without_tools >= NO_PROGRESS_LIMIT:
                        ex.stop_reason = "no_progress"
                if ex.response is not None:
                    add_message(state, "assistant", ex.response)
                    break
                if ex.stop_reason:
                    break
                await save()
        except LLMError as exc:
            ex.stop_reason, error = "error", str(exc)
            emit(Error(task, error, fatal=True))
        except asyncio.CancelledError:
            ex.stop_reason = "cancelled"
            for call in ex.pending_calls:  # every stored action keeps a result: no half step
                add_message(state, "tool", dumps({**call, **CANCELLED_RESULT}))
            await asyncio.shield(self._settle(state, runner, saving))
            raise
        except BaseException as exc:
            # A storage failure or a bug: keep what can be kept and free the task for resume.
            # After a lock time-out saving again would only wait as long again (one bound for
            # the whole run); after losing the lease nothing may be written.
            ex.stop_reason = ex.stop_reason or "error"
            with contextlib.suppress(Exception):
                await self._settle(state, runner, write=not isinstance(
                    exc, (StoreLockedError, LeaseLostError)))
            raise
        await self._settle(state, runner)
        if ex.response is not None:
            # Only once it is stored: a caller that stops reading here loses nothing.
            emit(Response(task, ex.response))
        if self.memory is not None:
            # In the background: the answer never waits for learning; close() settles it.
            self.memory.after_run(state.user_id, queued=self._learns(state))
        for call in waiting:  # after the save above: each can be decided as soon as it is seen
            emit(Approval(task, call["id"], call["name"], call["args"]))
        emit(End(task, ex.stop_reason or "error", ex.iteration))
        return AgentResult(
            response=ex.response,
            task_id=task,
            conversation_id=state.conversation.conversation_id,
            stop_reason=ex.stop_reason or "error",
            iterations=ex.iteration,
            usage=usage,
            error=error,
            security_assessment=state.security_assessment,
            pending_approvals=[{**call, "task_id": task} for call in waiting],
        )

    async def _ask(
        self,
        system: str,
        history: Sequence[dict[str, Any]],
        task: str,
        window: int,
        tools: dict[str, Tool],
        first: bool,
        emit: Callable[[Event], None],
    ) -> tuple[Step | None, Usage, int]:
        """One step of the model (``reason``) over the prompt within ``window``; returns the
        step, what it cost and the window for the rest of the run. A server that says the
        prompt is too long for it is asked once more with the prompt trimmed to what it says."""
        for trimmed in (False, True):
            try:
                with retries_reported_to(
                    lambda attempt, delay, why: emit(Retry(task, attempt, delay, why))
                ):
                    step, spent = await reason(
                        self.llm,
                        prompt_messages(system, history, task, window, self.budgets.output),
                        tools,
                        first_iteration=first,
                        on_token=lambda text: emit(Token(task, text)),
                        on_invalid=lambda message: emit(Error(task, f"invalid reply: {message}")),
                        invalid_retries=self.invalid_retries,
                        llm_retries=self.llm_retries,
                        retry_delay=self.retry_delay,
                    )
                return step, spent, window
            except ContextLengthError as exc:
                if trimmed:
                    raise
                # The server's window is smaller than we knew (or counts tokens its own way):
                # trim to what it says, with a margin, and ask once more.
                window = int(min(exc.window or window, window) * 0.85)
                emit(Retry(task, 1, 0.0, f"{exc}; trimming the prompt to {window:,} tokens"))
        raise AssertionError("unreachable")

    def _check_fits(self, query: str, window: int, tools: dict[str, Tool]) -> None:
        """Raise ContextWindowError if ``query`` cannot fit ``window`` with the first system
        message (the memory, unknown yet, is left out: the loop checks again with it)."""
        if len(query.encode()) < window // 2:
            return  # tokens never outnumber bytes: it fits, whatever the count
        system = system_prompt(
            build_context("", Workspace(objective=query), Execution(max_iterations=1),
                          list(tools.values()), self.budgets),
            self.identity, True,
        )
        check_query_fits(count_tokens(query), count_tokens(system) + MESSAGE_TOKENS, window,
                         self.budgets.output)

    async def _tools_for_run(self) -> dict[str, Tool]:
        """The agent's tools and its toolsets' (an MCP server's, started on first use)."""
        if not self.toolsets:
            return self.tools
        tools = dict(self.tools)
        listings = await asyncio.gather(*(toolset.list_tools() for toolset in self.toolsets))
        for toolset, listing in zip(self.toolsets, listings):
            for item in listing:
                if item.name in tools:
                    raise UsageError(
                        f"two tools are named {item.name!r} (one from {toolset!r}); "
                        "give the server a prefix= so its tool names are unique"
                    )
                tools[item.name] = item
        return tools

    def _learns(self, state: State) -> bool:
        """Whether the task is learned from: memory is on (with a model able to learn) and
        it completed. Then its completion queues it for learning, in the same transaction."""
        return (self.memory is not None and self.memory.learns
                and state.execution.stop_reason == "completed")

    async def _settle(
        self,
        state: State,
        runner: str,
        saving: asyncio.Future[None] | None = None,
        *,
        write: bool = True,
    ) -> None:
        """Complete the task on an answer or refusal; otherwise save it and let it go.

        ``saving`` is a save a cancellation interrupted: it finishes first, so nothing is
        written twice. ``write=False`` only lets the task go (releasing never waits on a lock).
        """
        if saving is not None:
            await asyncio.wait([saving])  # if it failed, the save below retries it
        try:
            if write and state.execution.stop_reason in ("completed", "security"):
                # which lets the task go: nothing to release
                await state.complete_task(learn=self._learns(state))
                return
            if write:
                await autosave(state)
        except BaseException:
            # Also after LeaseLostError: a release names this runner, so it never frees the
            # task from the runner that holds it now.
            await self.store.release_task(state.task_id, runner)
            raise
        await self.store.release_task(state.task_id, runner)


class _EventStream:
    """The events of one run, produced by a task so they arrive while it works."""

    _DONE = object()

    def __init__(
        self, work: Callable[[Callable[[Event], None]], Awaitable[AgentResult]], agent: Agent
    ) -> None:
        self._work = work
        self._agent = agent
        self._iterator: AsyncIterator[Event] | None = None
        self.result: AgentResult | None = None

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._iterator is None:
            self._iterator = self._events()
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        """Stop the run (as if cancelled) and wait until its state is saved."""
        if self._iterator is not None:
            await self._iterator.aclose()  # type: ignore[attr-defined]

    async def _events(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def produce() -> AgentResult:
            try:
                return await self._work(queue.put_nowait)
            finally:
                queue.put_nowait(self._DONE)

        task = asyncio.create_task(produce())
        runs = self._agent._runs
        runs.add(task)
        task.add_done_callback(runs.discard)
        try:
            while (event := await queue.get()) is not self._DONE:
                yield event
            if task.cancelled() and self._agent._closed:
                raise UsageError(
                    "the agent was closed while this run was in flight: its task was saved and "
                    "released; resume it with a new Agent"
                )
            self.result = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])


def _recorded_results(messages: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The tool results among a task's stored ``messages``, by call (name and arguments)."""
    recorded: dict[str, list[dict[str, Any]]] = {}
    for message in messages:
        if message.get("role") != "tool":
            continue
        try:
            result = json.loads(message["content"])
        except ValueError:
            continue
        if isinstance(result, dict) and isinstance(result.get("name"), str):
            if result.get("cancelled"):
                continue  # interrupted, not a result: the call may run again
            key = _call_key(result["name"], result.get("args") or {})
            recorded.setdefault(key, []).append(result)
    return recorded


def _take_recorded(
    recorded: dict[str, list[dict[str, Any]]], call: dict[str, Any]
) -> dict[str, Any] | None:
    """The oldest unused recorded result of this exact call, each reused at most once."""
    results = recorded.get(_call_key(call["name"], call.get("args") or {}))
    return results.pop(0) if results else None


def _call_key(name: str, args: Any) -> str:
    return json.dumps([name, args], sort_keys=True, ensure_ascii=False, default=str)


def _is_toolset(value: Any) -> bool:
    return callable(getattr(value, "list_tools", None)) and callable(getattr(value, "aclose", None))


def _is_store(value: Any) -> bool:
    return value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "save")
