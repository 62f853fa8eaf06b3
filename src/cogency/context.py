"""Context assembly (v5.0 canonical order): pure functions of their inputs.

The system message is the context (memory first, then workspace, execution, tools last,
joined by a blank line) followed by the instructions; the conversation follows as chat
messages (:func:`prompt_messages`): the current task's own messages, its query first, always
whole when they fit; older history fills what is left, newest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._fence import fence
from ._history import (
    MESSAGE_TOKENS,
    TOOL_FOOTER,
    History,
    tool_parts,
)
from .errors import ContextWindowError
from .llm.base import Message
from .reason import SECURITY_PREAMBLE, contract
from .state.execution import Execution
from .state.workspace import Workspace
from .tokens import count_tokens, most_tokens, truncate_tokens
from .tools.base import Tool


@dataclass(frozen=True)
class Budgets:
    """Token budgets of each part of the prompt (v1.0: profile 800, reasoning 1000)."""

    profile: int = 800
    workspace: int = 1000
    execution: int = 500
    tools: int = 2000
    output: int = 1024
    """Reserved for the model's reply."""


MIN_CUT_TOKENS = 64
"""A tool result is cut to fit only if at least this much of it can be shown."""


def build_context(
    memory: str,
    workspace: Workspace,
    execution: Execution,
    tools: Sequence[Tool],
    budgets: Budgets = Budgets(),
) -> str:
    """Memory, workspace, execution, tools: each within its budget, joined by ``"\\n\\n"``."""
    parts = []
    if memory:
        parts.append(_within(memory, budgets.profile))
    parts.append(_within(_workspace_part(workspace), budgets.workspace))
    parts.append(_within(_execution_part(execution), budgets.execution))
    parts.append(_within(_tools_part(tools), budgets.tools))
    return "\n\n".join(parts)


def _within(text: str, budget: int) -> str:
    return truncate_tokens(text, budget)  # text of no more bytes than the budget is not counted


def system_prompt(context: str, identity: str, first_iteration: bool, client: str = "") -> str:
    """The context, then who the agent is, the security preamble (iteration 1), the contract,
    and last the client's part (:meth:`~cogency.client.ClientRequest.prompt`): after every
    rule, so it can add to them but not come before them."""
    parts = [context]
    if identity:
        parts.append(identity)
    if first_iteration:
        parts.append(SECURITY_PREAMBLE)
    parts.append(contract(first_iteration))
    if client:
        parts.append(client)
    return "\n\n".join(parts)


def prompt_messages(
    system: str, history: Sequence[dict[str, Any]], task_id: str, window: int, output: int
) -> list[Message]:
    """The system message, then the conversation as chat messages, within ``window`` tokens
    less ``output`` kept for the reply.

    The messages of ``task_id`` (the newest, from its query on) come whole when they fit; if
    they do not, the query stays and the newest of the rest that fit follow it, the newest
    tool result cut with a marker if it alone is too large. Older history fills what is left
    with the newest whole turns that fit: it always begins with a user's message, never with
    an answer or a tool result whose question was left out (of the window, or of this
    prompt). A query that cannot fit with the system message raises
    :class:`ContextWindowError`. Tool calls and results appear as the model's own action
    message and a user message marked as tool data.

    Runs every iteration over a window that can hold thousands of messages: given a
    :class:`~cogency._history.History` (as ``execution.messages`` is), it does no Python work
    per message, so a turn costs the same at turn 10 and turn 1,000.

    Stored counts may be upper bounds (see :mod:`cogency.tokens`). When the bounds fit, all
    is sent and nothing is counted; when they do not, what is left out depends on the counts,
    so ``history``'s messages get their exact counts first (in place, once: the only change
    made to an argument) and only then is anything left out or refused.
    """
    if not isinstance(history, History):
        history = History(history)
    head: list[Message] = [{"role": "system", "content": system}]
    room = window - output
    count = len(history)
    begin = _turn_start(history, 0, count)  # a window may begin inside a turn
    # Tokens never outnumber UTF-8 bytes: when that bound leaves room for everything,
    # counting the system message (~250 µs) cannot change what is sent.
    if most_tokens(system) + MESSAGE_TOKENS + history.cost(begin) <= room:
        return [*head, *history.chats[begin:]]
    history.count_exactly()
    chats = history.chats
    total = history.cost(begin)
    system_tokens = count_tokens(system) + MESSAGE_TOKENS
    budget = room - system_tokens
    if total <= budget:
        return [*head, *chats[begin:]]
    start = count  # the task's own messages are the newest: from its query on
    while start and history[start - 1].get("task_id") == task_id:
        start -= 1
    own: list[Message] = []
    if start < count:
        query = history.cost(start, start + 1)
        check_query_fits(query - MESSAGE_TOKENS, system_tokens, window, output)
        budget -= query
        first = history.newest_within(budget, start + 1)
        rest = chats[first:]
        if first > start + 1:  # the task's own need all the room
            spare = budget - history.cost(first)
            if history[first - 1]["role"] == "tool" and spare >= MIN_CUT_TOKENS:
                rest.insert(0, _cut_tool(history[first - 1]["content"], spare))
            return [*head, chats[start], *rest]
        own = [chats[start], *rest]
        budget -= history.cost(start + 1)
    # Older history: the newest whole turns that fit.
    older = _turn_start(history, history.newest_within(budget, begin, start), start)
    return [*head, *chats[older:start], *own]


def _turn_start(history: Sequence[dict[str, Any]], index: int, end: int) -> int:
    """The first message from ``index`` on (before ``end``) that begins a turn: a user's
    message (``end`` when none does). Only the few messages of one turn are looked at."""
    while index < end and history[index]["role"] != "user":
        index += 1
    return index


def check_query_fits(query_tokens: int, system_tokens: int, window: int, output: int) -> None:
    """Raise :class:`ContextWindowError` unless a query of ``query_tokens`` fits the window
    with a system message of ``system_tokens`` and ``output`` tokens kept for the reply."""
    if query_tokens + MESSAGE_TOKENS + system_tokens + output <= window:
        return
    raise ContextWindowError(
        f"the query is {query_tokens:,} tokens, too long for the model's context window of "
        f"{window:,} tokens (the system message takes {system_tokens:,} and {output:,} are "
        f"kept for the reply, leaving {max(window - system_tokens - output, 0):,}): shorten "
        "the query or use a model with a larger context window"
    )


def _cut_tool(content: str, budget: int) -> Message:
    """A tool result too large for the window, cut to ``budget`` tokens with a marker saying
    how much was left out."""
    header, body = tool_parts(content)
    room = budget - count_tokens(header) - MESSAGE_TOKENS - 52  # the footer and the marker
    kept = truncate_tokens(body, max(room, 0), marker="")
    left = body[len(kept):]
    marker = (
        f"\n[… {len(left):,} more characters (~{count_tokens(left):,} tokens) of this tool "
        "result left out: too large for the model's context window]"
    )
    return {"role": "user", "content": f"{header}{fence(kept)}{marker}{TOOL_FOOTER}"}


def _workspace_part(workspace: Workspace) -> str:
    return (
        "WORKSPACE:\n"
        f"objective: {workspace.objective}\n"
        f"understanding: {workspace.understanding}\n"
        f"approach: {workspace.approach}\n"
        f"discoveries: {workspace.discoveries}"
    )


def _execution_part(execution: Execution) -> str:
    lines = [f"EXECUTION:\niteration {execution.iteration} of {execution.max_iterations}"]
    recent = execution.completed_calls[-3:]
    if recent:
        lines.append(
            "recent tool results: "
            + ", ".join(
                f"{'✓' if call.get('ok') else '✗'} {call.get('name')}" for call in recent
            )
        )
    if execution.iteration >= execution.max_iterations:
        lines.append("this is the last iteration: give your final response now")
    return "\n".join(lines)


def _tools_part(tools: Sequence[Tool]) -> str:
    if not tools:
        return "TOOLS: none; answer directly with \"response\"."
    return "TOOLS:\n" + "\n".join(f"- {t.signature()}" for t in tools)
