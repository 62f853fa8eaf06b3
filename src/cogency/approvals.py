"""Waiting calls: tool calls that wait for a person or for the client, and how a resumed task
settles them. One mechanism for both: a waiting call is a row of ``task_approvals`` (see
:data:`~cogency.storage.base.APPROVAL_STATUSES`) with its decider.

A call whose tool ``needs_approval`` runs only when the agent's policy allows it: ``True``
allows every call, a callable decides each one at once, and ``None`` pauses the task; a person
decides it (``Agent.resume(approvals=...)`` or ``Store.decide_approvals``) and the resumed task
runs it if approved. An approved call is marked ``running`` in the database before it starts,
so a crash during it never makes it run again. A call of a tool the client declared
(:class:`~cogency.client.ClientTool`) always pauses the task: the client runs it and its result
(``Agent.resume(results=...)``) becomes the call's result. Calls of the same step that need
neither run before the pause.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Union

from . import _telemetry
from ._json import dumps
from .errors import ApprovalRequiredError, UsageError
from .events import Action, Event, Result
from .state.state import State, add_message, await_approval, settle_approval
from .client import ClientTool
from .tools.base import Tool, render_output, run_tools

_log = logging.getLogger(__name__)

Policy = Union[Literal[True], None, Callable[[dict[str, Any]], Union[Awaitable[bool], bool]]]
"""``None`` (pause), ``True`` (allow all) or a callable of the call returning a bool."""

DENIED = "denied by the user: this call did not run"
INTERRUPTED = (
    "interrupted while it ran (the process stopped): it may or may not have taken effect, and "
    "it will not run again"
)


def check_policy(approve: Any) -> Policy:
    """``approve`` as given to ``Agent``, or a :class:`UsageError` saying what it may be."""
    if approve is None or approve is True or callable(approve):
        return approve
    raise UsageError(
        f"approve must be None (pause for a person), True (allow every call) or a callable "
        f"of the call returning True or False, not {approve!r}"
    )


async def run_step(
    tools: dict[str, Tool], calls: Sequence[dict[str, Any]], policy: Policy, state: State
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """Run the calls of one step that may run: a result per call, ``None`` for each call
    that waits for a person (also returned, with their ids, and stored by the next save)."""
    allowed: list[bool | None] = []
    for call in calls:
        tool = tools.get(call["name"])
        if isinstance(tool, ClientTool):
            allowed.append(None)  # only the client can run it
        elif policy is True or tool is None or not await tool.requires_approval(
                call.get("args") or {}):
            allowed.append(True)
        elif policy is None:
            allowed.append(None)
        else:
            try:
                allowed.append(await _ask(policy, {**call, "task_id": state.task_id,
                                                   "user_id": state.user_id}))
            except _PolicyRaised as exc:  # fails closed: the call waits for a person
                _log.warning("%s; call %s of task %s now waits for approval", exc,
                             call.get("id"), state.task_id)
                allowed.append(None)
    ran = iter(await run_tools(tools, [c for c, ok in zip(calls, allowed) if ok]))
    results: list[dict[str, Any] | None] = []
    waiting = []
    for call, ok in zip(calls, allowed):
        if ok is None:
            decider = "client" if isinstance(tools.get(call["name"]), ClientTool) else "person"
            waiting.append(await_approval(state, call, decider))
            results.append(None)
        else:
            results.append(next(ran) if ok else _refused(call, DENIED, denied=True))
    return results, waiting


def pause_reason(waiting: Sequence[dict[str, Any]]) -> str:
    """The stop reason of a run that ends with ``waiting`` calls: ``awaiting_approval`` while
    a person must decide one (the client's calls, if any, are listed too), else
    ``awaiting_tool_results``."""
    people = any(call.get("decider", "person") == "person" for call in waiting)
    return "awaiting_approval" if people else "awaiting_tool_results"


async def settle_decided(
    state: State,
    tools: dict[str, Tool],
    decisions: Mapping[str, bool] | None,
    policy: Policy,
    emit: Callable[[Event], None],
    results: Mapping[str, Any] | None = None,
) -> bool:
    """At resume: record ``decisions`` (a person's) and ``results`` (the client's), have the
    policy decide what is left of a person's calls (or refuse when it is ``None``), run the
    approved calls and add every decided call's result. All or nothing: while a call stays
    undecided, nothing is recorded. A result for a client's call that was answered before is
    ignored (the first one stands), so a client may send it again. Returns whether any result
    was added (the caller saves them)."""
    store, task, user = state.store, state.task_id, state.user_id
    assert store is not None
    decisions = dict(decisions or {})
    stored = await store.load_approvals(task, user)
    answered = {c["id"] for c in stored if c["decider"] == "client" and c["status"] != "pending"}
    answers = {call_id: render_output(output) for call_id, output in (results or {}).items()
               if call_id not in answered}
    both = sorted(set(decisions) & set(answers))
    if both:
        raise UsageError(f"call {both[0]!r} was given both a decision and a result")
    calls = [c for c in stored if c["status"] != "done"]
    missing = sorted({c["name"] for c in calls if c["name"] not in tools and c["status"] in
                      ("pending", "approved") and c["decider"] == "person"
                      and decisions.get(c["id"]) is not False})
    if missing:
        raise UsageError(
            f"task {task!r} waits to run {', '.join(missing)}, which this agent does not have; "
            "resume it with the same tools it was started with"
        )
    given: dict[str, bool | str] = {**decisions, **answers}
    pending = {c["id"] for c in calls if c["status"] == "pending"}
    if set(given) - pending:
        await store.decide_approvals(task, user, given)  # refuses the unknown or decided id
    undecided = [c for c in calls if c["status"] == "pending" and c["id"] not in given]
    people = [c for c in undecided if c["decider"] == "person"]
    clients = [c for c in undecided if c["decider"] == "client"]
    if clients or (people and policy is None):
        raise ApprovalRequiredError(_waiting_for(task, people if policy is None else [],
                                                 clients),
                                    [_public(c) for c in (people if policy is None else [])
                                     + clients])
    if given:  # all or none; an unknown id or a second decision is refused here
        await store.decide_approvals(task, user, given)
    for call in people:  # one at a time: a person answers each in turn
        verdict = await _ask(policy, {**_public(call), "user_id": user})
        await store.decide_approvals(task, user, {call["id"]: verdict})
    if not calls:
        return False
    calls = [c for c in await store.load_approvals(task, user) if c["status"] != "done"]
    approved = [c for c in calls if c["status"] == "approved"]
    if approved:  # marked before they start: a crash from here on never runs them again
        await store.start_approvals(task, user, [c["id"] for c in approved])
    for call in calls:
        emit(Action(task, 0, call["name"], call["args"]))
    ran = iter(await run_tools(tools, approved))
    for call in calls:
        if call["status"] == "approved":
            result = {**next(ran), "id": call["id"]}
        elif call["status"] == "answered":
            result = {"name": call["name"], "args": call["args"], "id": call["id"], "ok": True,
                      "output": call["output"] or ""}
        elif call["status"] == "denied":
            result = _refused(call, DENIED, denied=True)
        else:  # running: it started before the process stopped
            result = _refused(call, INTERRUPTED, interrupted=True)
        add_message(state, "tool", dumps(result))
        settle_approval(state, call["id"])
        emit(Result(task, 0, call["name"], result["ok"],
                    result.get("output", result.get("error", ""))))
    return True


def _waiting_for(task: str, people: list[dict[str, Any]], clients: list[dict[str, Any]]) -> str:
    """What an undecided resume is told to do."""
    said = []
    if people:
        shown = ", ".join(f"{c['id']} ({c['name']})" for c in people)
        said.append(f"task {task!r} waits for a decision on {shown}: pass approvals={{call_id: "
                    f"True or False}} to resume (or `cogency approve {task}`)")
    if clients:
        shown = ", ".join(f"{c['id']} ({c['name']})" for c in clients)
        said.append(f"task {task!r} waits for the client's result of {shown}: pass "
                    "results={call_id: output} to resume")
    return "; ".join(said)


class _PolicyRaised(UsageError):
    """The approve callable raised: during a run its call waits for a person instead."""


async def _ask(policy: Policy, call: dict[str, Any]) -> bool:
    if policy is None or policy is True:
        return policy is True
    try:
        verdict = policy(call)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as exc:
        raise _PolicyRaised(
            f"the approve callable raised {type(exc).__name__}: {exc} (deciding {call['name']})"
        ) from exc
    if not isinstance(verdict, bool):
        raise UsageError(f"the approve callable must return True or False, not {verdict!r}")
    return verdict


def _refused(call: dict[str, Any], error: str, **flag: bool) -> dict[str, Any]:
    _telemetry.tool_not_run(call, next(iter(flag)))
    named = {"id": call["id"]} if "id" in call else {}
    return {"name": call["name"], "args": call.get("args") or {}, **named, "ok": False,
            "error": error, **flag}


def _public(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": call["id"], "task_id": call.get("task_id"), "name": call["name"],
            "args": call["args"], "decider": call.get("decider", "person")}
