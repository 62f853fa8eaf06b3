"""The agent: a pure ReAct loop over the state, with live events."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from . import _telemetry
from ._answer import AnswerStream
from ._json import dumps
from .approvals import Policy, check_policy, pause_reason, run_step, settle_decided
from .client import SETTINGS_KEY, ClientRequest
from .context import (
    MESSAGE_TOKENS,
    Budgets,
    build_context,
    check_query_fits,
    prompt_messages,
    system_prompt,
)
from .errors import (
    CogencyError,
    ContextLengthError,
    InvalidResponseError,
    LeaseLostError,
    LLMError,
    StoreLockedError,
    UsageError,
)
from .events import (
    Action, Approval, End, Error, Event, Reason, Response, ResponseDelta, Result, Retry, Start,
    Token,
)
from .llm.base import LLM, Usage, retries_reported_to
from .llm.resolve import resolve_llm
from .memory.memory import Memory
from .reason import Step, reason
from .state.execution import Execution
from .state.state import DEFAULT_HISTORY_TOKENS, State, add_message, autosave, check_id
from .storage import open_store
from .storage.base import ForgetReceipt, Store, new_runner
from .tokens import count_tokens
from .state.workspace import Workspace
from .tools.base import Tool, Toolset, hide_store_files
from .tools.rooms import Rooms, remove_user_directories

_log = logging.getLogger(__name__)
STOP_REASONS = (
    "completed", "security", "max_iterations", "no_progress", "repeated_calls",
    "invalid_response", "error", "cancelled", "awaiting_approval", "awaiting_tool_results",
)
PAUSED = ("awaiting_approval", "awaiting_tool_results")
"""Stop reasons of a task that waits for a decision or a client's result (it is kept)."""
NO_PROGRESS_LIMIT = 3
"""Consecutive steps with neither a response nor an action before the run stops."""
REPEAT_LIMIT = 3
"""Times one call (same tool, same arguments) may give the same result in a run: from the
second, its result tells the model so; at this many the run stops (``repeated_calls``)."""
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
    """With ``stop_reason="awaiting_approval"`` or ``"awaiting_tool_results"``: the calls that
    wait, each a dict with ``id``, ``name``, ``args`` and ``decider``: ``"person"`` (decide it
    with ``resume(approvals=...)``) or ``"client"`` (send its result with
    ``resume(results=...)``)."""
    truncated: bool = False
    """The answer was cut at the client's ``max_tokens`` (OpenAI's ``finish_reason: length``)."""
    exception: CogencyError | None = field(default=None, repr=False, compare=False)
    """With ``stop_reason`` ``"error"`` or ``"invalid_response"``: the error that ended the
    run, as its own type (``error`` is its message)."""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The waiting calls of the client's tools (``id``, ``name``, ``args``), in order."""
        return [call for call in self.pending_approvals if call.get("decider") == "client"]

    def raise_for_error(self) -> AgentResult:
        """Raise the error that ended the run, as its own type, if it ended in one; else
        return this result (so ``result = (await agent.run(q)).raise_for_error()`` works).

        A run that stopped with ``stop_reason="error"`` raises what stopped it
        (:class:`~cogency.errors.AuthenticationError`, ``RateLimitError``,
        ``LLMTimeoutError``, …: catch it by type); ``"invalid_response"`` raises
        :class:`~cogency.errors.InvalidResponseError`. Every other stop reason is an outcome,
        not an error, and returns: ``completed``, ``security`` (a refusal), ``max_iterations``,
        ``no_progress``, ``repeated_calls``, ``cancelled``, ``awaiting_approval``,
        ``awaiting_tool_results``. The task of a run that raised stays resumable, as before.
        """
        if self.stop_reason in ("error", "invalid_response"):
            if self.exception is not None:
                raise self.exception
            if self.stop_reason == "invalid_response":
                raise InvalidResponseError(self.error or "the model's replies were invalid")
            raise LLMError(self.error or "the run failed")
        return self


class Agent:
    """A stateful agent: give it a model, tools and a store, then ``run`` queries.

    ``store=None`` opens the default SQLite file; ``memory=True`` learns a profile of each
    user with the agent's model (``Memory(llm=...)`` chooses another). Every run saves its
    workspace after each iteration; a run that stops early keeps it so ``resume`` continues.

    ``approve`` decides the calls of tools that need approval: ``None`` pauses the task
    (``stop_reason="awaiting_approval"``, resumable with ``resume(approvals=...)``), ``True``
    allows them all, an async (or plain) callable of the call (a dict with ``id``, ``name``,
    ``args``, ``task_id``, ``user_id``) returns True to allow it, False to deny it.

    ``root_per_user=True`` (for an agent that serves many users, as ``cogency serve`` does)
    runs each user's tools that have a root (the files and shell tools) in a directory of
    that user's own under it, made on first use; :meth:`forget` deletes it with the rest.
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
        root_per_user: bool = False,
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
        self.rooms = Rooms(self.tools, lambda tools: hide_store_files(tools, self.store)) \
            if root_per_user else None
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
        self._runs: set[_Run] = set()

    # -- public API -----------------------------------------------------------------------

    async def run(
        self, query: str, user_id: str = "default", conversation_id: str | None = None, *,
        instructions: str | None = None,
        options: Mapping[str, Any] | None = None,
        client_tools: Sequence[Mapping[str, Any]] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        keep: bool = True,
    ) -> AgentResult:
        """Run a new task to its end and return what it produced (the keyword arguments:
        see :meth:`stream`)."""
        return await self._collect(self.stream(
            query, user_id, conversation_id, instructions=instructions, options=options,
            client_tools=client_tools, output_schema=output_schema, keep=keep))

    async def resume(
        self, task_id: str, user_id: str = "default", *,
        approvals: Mapping[str, bool] | None = None,
        results: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        """Continue an unfinished task from its saved workspace and conversation.

        A task paused with waiting calls needs them decided first, all at once: ``approvals``
        maps the id of each call waiting for a person to True (run it) or False (the model is
        told the user denied it); ``results`` maps the id of each call of a client's tool to
        the result the client got (text, or a JSON value), which becomes that call's result.
        The agent's ``approve`` policy decides what is left of a person's calls; an undecided
        call (any client's; a person's with ``approve=None``) raises
        :class:`~cogency.errors.ApprovalRequiredError` listing them, and nothing is recorded.
        A result sent again for a call already answered is ignored.
        """
        return await self._collect(self.resume_stream(task_id, user_id, approvals=approvals,
                                                      results=results))

    def stream(
        self,
        query: str,
        user_id: str = "default",
        conversation_id: str | None = None,
        *,
        settings: dict[str, Any] | None = None,
        history: Sequence[tuple[str, str]] = (),
        instructions: str | None = None,
        options: Mapping[str, Any] | None = None,
        client_tools: Sequence[Mapping[str, Any]] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        keep: bool = True,
    ) -> AsyncIterator[Event]:
        """Run a new task, yielding its events as they happen; the last one is ``end``.

        ``settings`` (a JSON object) is stored with the task and read back as
        ``TaskRecord.settings`` (``store.load_task``), e.g. to rebuild this agent to resume it.
        ``history`` (``("user" | "assistant", text)`` pairs) is stored in the conversation
        before the query, in the same transaction: turns held elsewhere, now its own.

        What a client asks of this task (see :mod:`cogency.client`; stored with it, in
        ``settings["client"]``, so a resume runs it the same way): ``instructions`` for the
        model, after Cogency's own rules and the user's profile; ``options`` for the model
        (``temperature``, ``top_p``, ``seed``, ``reasoning_effort``: every call) and for the
        answer (``max_tokens``, ``stop``); ``client_tools``, function definitions (OpenAI's)
        the model may call, each call pausing the task (``awaiting_tool_results``) until
        ``resume(results=...)``; ``output_schema``, a JSON schema the answer must be valid
        for. Anything wrong with them raises :class:`~cogency.errors.UsageError` here.

        ``keep=False`` runs a one-off task (a chat UI's title request; OpenAI's
        ``store: false``): in a new conversation of its own (so no ``conversation_id``), which
        is deleted from the store with everything of the task once the task ends, and nothing
        is learned from it. A task that pauses (for an approval or a client's tool) is kept
        until the resume that ends it.
        """
        check_id(user_id, "user_id")
        if not isinstance(query, str) or not query.strip():
            raise UsageError("query must be a non-empty string")
        if keep is False and conversation_id is not None:
            raise UsageError("a run that keeps nothing (keep=False) has a conversation of its "
                             "own, deleted when it ends: leave conversation_id out")
        request = ClientRequest.build(instructions, options, client_tools, output_schema, keep)
        if request:
            request.tools_with(self.tools)  # a clash with an MCP server's tool: when listed
            request.model(self.llm)  # refuses what the model cannot honour, before any run
            if settings and SETTINGS_KEY in settings:
                raise UsageError(f"settings[{SETTINGS_KEY!r}] is the client's request: pass "
                                 "instructions=, options=, client_tools=, output_schema=")
            settings = {**(settings or {}), **request.settings()}

        async def open_task(runner: str) -> tuple[State, bool]:
            # One transaction creates the task, holds it for this runner, and stores the query.
            state = await State.start_task(
                query, user_id, conversation_id, self.store,
                max_iterations=self.max_iterations, history_tokens=self.history_tokens,
                record_query=True, runner=runner, settings=settings, history=history,
            )
            return state, False

        return self._drive(open_task, user_id, query, request=request)

    def resume_stream(
        self, task_id: str, user_id: str = "default", *,
        approvals: Mapping[str, bool] | None = None,
        results: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Event]:
        """Continue an unfinished task, yielding its events as they happen (see :meth:`resume`)."""
        check_id(task_id, "task_id")
        check_id(user_id, "user_id")
        if approvals is not None and not isinstance(approvals, Mapping):
            raise UsageError("approvals must be a mapping of call id to True or False")
        if results is not None and not isinstance(results, Mapping):
            raise UsageError("results must be a mapping of call id to the call's result")

        async def open_task(runner: str) -> tuple[State, bool]:
            state = await State.continue_task(
                task_id, user_id, self.store,
                max_iterations=self.max_iterations, history_tokens=self.history_tokens,
            )
            state.epoch = await self.store.claim_task(task_id, user_id, runner)
            return state, True

        return self._drive(open_task, user_id, approvals=approvals, results=results)

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

    async def forget(self, user_id: str) -> ForgetReceipt:
        """Erase everything stored about ``user_id`` (as ``Memory.forget``: profile with its
        history, conversations, messages, tasks, queued learning; learning in flight is never
        stored) and, with ``root_per_user``, the user's tool directories with all they hold.
        Returns the receipt: what was erased, per kind, and the tool directory removed."""
        if self.rooms is not None:
            self.rooms.forget(user_id)
        return await forget_user(self.store, user_id, memory=self.memory,
                                 roots=self.rooms.roots if self.rooms is not None else ())

    async def close(self) -> None:
        """Stop the runs still in flight (each saves its task and releases it, as a
        cancellation does), then release what the agent opened (never a store or model that
        was passed in). A run stopped here raises ``UsageError`` to whoever awaits it."""
        if self._closed:
            return
        self._closed = True
        runs = list(self._runs)
        for run in runs:
            run.stop()
        if runs:
            await asyncio.wait([run.ended for run in runs])
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
        assert isinstance(events, _EventStream)
        return await events.outcome()

    def _drive(
        self, open_task: Callable[[str], Awaitable[tuple[State, bool]]], user_id: str,
        query: str | None = None, approvals: Mapping[str, bool] | None = None, *,
        request: ClientRequest | None = None, results: Mapping[str, Any] | None = None,
    ) -> _EventStream:
        if self._closed:
            raise UsageError("this agent is closed; create a new Agent")
        return _EventStream(lambda emit: _telemetry.invoke_agent(
            self.llm, self._execute(open_task, emit, user_id, query, approvals, request,
                                    results)), self)

    async def _execute(
        self,
        open_task: Callable[[str], Awaitable[tuple[State, bool]]],
        emit: Callable[[Event], None],
        user_id: str,
        query: str | None = None,
        approvals: Mapping[str, bool] | None = None,
        request: ClientRequest | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        await self.llm.start()  # e.g. learn the context window from the server
        window = self.llm.context_window
        runner = new_runner()
        tools = await self._tools_for_run(user_id)
        if request is not None:  # a new task; a resumed one reads its request below
            tools = request.tools_with(tools)
        if query is not None:
            # Before anything is stored: a query that can never fit is the caller's to fix.
            self._check_fits(query, window, tools, request or ClientRequest())
        state, resumed = await open_task(runner)
        _telemetry.task_opened(state, resumed)
        if request is None:
            request = ClientRequest.from_settings(state.settings)
            tools = request.tools_with(tools)
        llm = request.model(self.llm)  # after start(): a copy shares what start() set up
        client = request.prompt()
        ex, usage, error, truncated = state.execution, Usage(), None, False
        failure: CogencyError | None = None  # the error that ends the run, as its own type
        outcomes: dict[bytes, int] = {}  # each call's outcomes in this run, for _mark_repeats
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
                if await settle_decided(state, tools, approvals, self.approve, emit, answers):
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
                    client,
                )
                answer = AnswerStream(
                    None if emit is _drop
                    else lambda text, restart: emit(ResponseDelta(task, text, restart)),
                    tools=bool(tools), stop=request.stop, max_tokens=request.max_tokens)
                step, spent, window, problem = await self._ask(
                    llm, system, ex.messages, task, window, tools, first, emit, answer,
                    request.output_schema)
                usage = usage + spent
                if step is None:
                    answer.finish(None)
                    ex.stop_reason = "invalid_response"
                    error = f"the model's replies did not follow the JSON contract ({problem})"
                    failure = InvalidResponseError(f"{error} after {1 + self.invalid_retries} "
                                                   "tries")
                    break
                state.workspace.update(step.workspace)
                if emit is not _drop:
                    emit(Reason(task, ex.iteration, state.workspace.to_dict()))
                if first and not step.secure:
                    state.security_assessment = (
                        step.workspace.get("understanding") or step.response or "judged unsafe"
                    )
                    ex.response, truncated = request.cut(step.response or REFUSAL)
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
                    # A call that gives the result it gave before says so to the model.
                    repeats = _mark_repeats(outcomes, results, replayed)
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
                        ex.stop_reason = pause_reason(waiting)
                    elif repeats is not None and repeats["repeated"] >= REPEAT_LIMIT:
                        ex.stop_reason = "repeated_calls"
                        error = (f"the model called {_call_text(repeats)} "
                                 f"{repeats['repeated']} times and got the same result each "
                                 "time; stopped (resume to let it try again)")
                        emit(Error(task, error))
                elif step.response is not None:
                    ex.response, truncated = request.cut(step.response)
                    ex.stop_reason = "completed"
                else:
                    ex.iterations_without_tools += 1
                    if ex.iterations_without_tools >= NO_PROGRESS_LIMIT:
                        ex.stop_reason = "no_progress"
                answer.finish(ex.response)
                if ex.response is not None:
                    add_message(state, "assistant", ex.response)
                    break
                if ex.stop_reason:
                    break
                await save()
        except LLMError as exc:
            ex.stop_reason, error, failure = "error", str(exc), exc
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
        if not request.keep and ex.stop_reason not in PAUSED:
            await self.store.delete_conversation(state.conversation.conversation_id, user_id)
        if ex.response is not None:
            # Only once it is stored (or, keeping nothing, deleted): a caller that stops
            # reading here loses nothing.
            emit(Response(task, ex.response))
        if self.memory is not None:
            # In the background: the answer never waits for learning; close() settles it.
            self.memory.after_run(state.user_id, queued=self._learns(state))
        for call in waiting:  # after the save above: each can be decided as soon as it is seen
            emit(Approval(task, call["id"], call["name"], call["args"], call["decider"]))
        emit(End(task, ex.stop_reason or "error", ex.iteration, usage))
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
            truncated=truncated,
            exception=failure,
        )

    async def _ask(
        self,
        llm: LLM,
        system: str,
        history: Sequence[dict[str, Any]],
        task: str,
        window: int,
        tools: dict[str, Tool],
        first: bool,
        emit: Callable[[Event], None],
        answer: AnswerStream,
        answer_schema: dict[str, Any] | None,
    ) -> tuple[Step | None, Usage, int, str]:
        """One step of the model (``reason``) over the prompt within ``window``; returns the
        step, what it cost, the window for the rest of the run and the last reply's problem
        (if any). A server that says the prompt is too long for it is asked once more with the
        prompt trimmed to what it says. The answer streams to ``answer`` as it is written."""
        problems = [""]

        def token(text: str) -> None:
            if emit is not _drop:  # (no event to build when no one reads them: Agent.run)
                emit(Token(task, str(text)))
                answer.feed(text)

        def invalid(message: str) -> None:
            problems.append(message)
            answer.retry()
            emit(Error(task, f"invalid reply: {message}"))

        for trimmed in (False, True):
            try:
                with retries_reported_to(
                    lambda attempt, delay, why: emit(Retry(task, attempt, delay, why))
                ):
                    step, spent = await reason(
                        llm,
                        prompt_messages(system, history, task, window, self.budgets.output),
                        tools,
                        first_iteration=first,
                        on_token=token,
                        on_invalid=invalid,
                        on_note=lambda message: emit(Error(task, message)),
                        invalid_retries=self.invalid_retries,
                        llm_retries=self.llm_retries,
                        retry_delay=self.retry_delay,
                        answer_schema=answer_schema,
                    )
                return step, spent, window, problems[-1]
            except ContextLengthError as exc:
                if trimmed:
                    raise
                # The server's window is smaller than we knew (or counts tokens its own way):
                # trim to what it says, with a margin, and ask once more.
                window = int(min(exc.window or window, window) * 0.85)
                answer.retry()
                emit(Retry(task, 1, 0.0, f"{exc}; trimming the prompt to {window:,} tokens"))
        raise AssertionError("unreachable")

    def _check_fits(
        self, query: str, window: int, tools: dict[str, Tool], request: ClientRequest
    ) -> None:
        """Raise ContextWindowError if ``query`` cannot fit ``window`` with the first system
        message (the memory, unknown yet, is left out: the loop checks again with it)."""
        client = request.prompt()
        if len(query.encode()) + len(client.encode()) < window // 2:
            return  # tokens never outnumber bytes: it fits, whatever the count
        system = system_prompt(
            build_context("", Workspace(objective=query), Execution(max_iterations=1),
                          list(tools.values()), self.budgets),
            self.identity, True, client,
        )
        check_query_fits(count_tokens(query), count_tokens(system) + MESSAGE_TOKENS, window,
                         self.budgets.output)

    async def _tools_for_run(self, user_id: str) -> dict[str, Tool]:
        """The agent's tools (in the user's own directories, with ``root_per_user``) and its
        toolsets' (an MCP server's, started on first use)."""
        own = self.tools if self.rooms is None else self.rooms.tools(user_id)
        if not self.toolsets:
            return own
        tools = dict(own)
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
        """Whether the task is learned from: memory is on (with a model able to learn), it
        completed, and its client keeps it (a ``keep=False`` task teaches nothing). Then its
        completion queues it for learning, in the same transaction."""
        return (self.memory is not None and self.memory.learns
                and state.execution.stop_reason == "completed"
                and state.settings.get("client", {}).get("keep", True) is not False)

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

    async def outcome(self) -> AgentResult:
        """The run to its end, its events dropped (``Agent.run``), worked in the caller's
        own task: no task, no queue, no hand-over between them. Cancelling the caller
        cancels the run (it is saved first, as when the stream is closed); closing the
        agent does too, and the caller gets :class:`UsageError`."""
        caller = asyncio.current_task()
        assert caller is not None  # (awaited: always in a task)
        # Once per run the loop runs what is due (other tasks, the store's threads' callbacks):
        # a caller running turn after turn with a model that never waits would starve them.
        await asyncio.sleep(0)
        if self._agent._closed:  # closed meanwhile: this run never began
            raise UsageError("the agent was closed before this run began: nothing of it was "
                             "stored; run it with a new Agent")
        run = _Run(caller, asyncio.get_running_loop().create_future())
        runs = self._agent._runs
        runs.add(run)
        try:
            self.result = await self._work(_drop)
        except asyncio.CancelledError:
            if run.stopped:  # by Agent.close(), not by the caller
                caller.uncancel()
                raise UsageError(_CLOSED) from None
            raise
        finally:
            runs.discard(run)
            run.ended.set_result(None)
        return self.result

    async def _events(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def produce() -> AgentResult:
            try:
                return await self._work(queue.put_nowait)
            finally:
                queue.put_nowait(self._DONE)

        task = asyncio.create_task(produce())
        run = _Run(task, task)
        runs = self._agent._runs
        runs.add(run)
        task.add_done_callback(lambda _: runs.discard(run))
        try:
            while (event := await queue.get()) is not self._DONE:
                yield event
            if task.cancelled() and run.stopped:
                raise UsageError(_CLOSED)
            self.result = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])


class _Run:
    """A run in flight, as ``Agent.close()`` stops it: ``task`` is cancelled (the caller's
    own, for ``Agent.run``), and ``ended`` is done once the run is saved and released."""

    __slots__ = ("task", "ended", "stopped")

    def __init__(self, task: asyncio.Task[Any], ended: asyncio.Future[Any]) -> None:
        self.task, self.ended, self.stopped = task, ended, False

    def stop(self) -> None:
        self.stopped = True
        self.task.cancel()


_CLOSED = ("the agent was closed while this run was in flight: its task was saved and "
           "released; resume it with a new Agent")


def _drop(event: Event) -> None:
    """The events of a run no one reads (``Agent.run``)."""


async def forget_user(
    store: Store, user_id: str, *, memory: Memory | None = None,
    roots: Sequence[str | os.PathLike[str]] = (),
) -> ForgetReceipt:
    """Erase everything ``store`` holds about ``user_id`` (through ``memory`` when given, so
    its learning in flight stops too), then the user's tool directories under ``roots``
    (``root_per_user``; ``cogency serve --root``): the one way a user is forgotten
    (:meth:`Agent.forget`, ``DELETE /api/profile``, ``cogency profile forget``). Returns the
    receipt, its ``tool_directory`` and ``tool_files`` saying what went of the directories."""
    check_id(user_id, "user_id")
    receipt = await (memory.forget(user_id) if memory is not None
                     else store.forget_user(user_id))
    if roots:
        receipt.tool_directory, receipt.tool_files = await asyncio.to_thread(
            remove_user_directories, roots, user_id)
    return receipt


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


def _mark_repeats(
    outcomes: dict[bytes, int], results: Sequence[dict[str, Any] | None],
    replayed: Sequence[dict[str, Any] | None],
) -> dict[str, Any] | None:
    """Count this step's results in ``outcomes`` (the run's, by call and outcome) and mark each
    new one that repeats an earlier call's outcome: ``result["repeated"]`` counts the times
    (this one included), stored with it and shown to the model beside it. Returns the most
    repeated result of the step, if any."""
    worst: dict[str, Any] | None = None
    for result, old in zip(results, replayed):
        if result is None:
            continue  # it waits for a person: no outcome yet
        key = _outcome_key(result)
        outcomes[key] = times = outcomes.get(key, 0) + 1
        if old is None and times > 1:
            result["repeated"] = times
            if worst is None or times > worst["repeated"]:
                worst = result
    return worst


def _outcome_key(result: dict[str, Any]) -> bytes:
    outcome = result.get("output") if result.get("ok") else result.get("error")
    text = _call_key(result["name"], [result.get("args") or {}, bool(result.get("ok")), outcome])
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _call_text(result: dict[str, Any], limit: int = 200) -> str:
    args = json.dumps(result.get("args") or {}, ensure_ascii=False, default=str)
    return f"{result['name']}({args[:limit]}{'…' if len(args) > limit else ''})"


def _is_toolset(value: Any) -> bool:
    return callable(getattr(value, "list_tools", None)) and callable(getattr(value, "aclose", None))


def _is_store(value: Any) -> bool:
    return value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "save")
