"""The history window a prompt is built from: right whatever is done to it, the same prompt
as the plain rule gives, and no work per message of the window in a turn."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cogency import Agent
from cogency._history import MESSAGE_TOKENS, TOOL_FRAME_TOKENS, History, render_tool_message
from cogency._json import dumps
from cogency.context import MIN_CUT_TOKENS, prompt_messages
from cogency.errors import ContextWindowError
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens

SETTINGS = settings(max_examples=150, deadline=None)

contents = st.one_of(st.text(max_size=40), st.text(min_size=200, max_size=2_000))
tool_contents = st.builds(
    lambda output, ok: dumps({"name": "read", "args": {"path": "a"}, "ok": ok,
                              "output" if ok else "error": output}),
    contents, st.booleans())


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "assistant", "tool"]))
    content = draw(tool_contents if role == "tool" else contents)
    message = {"role": role, "content": content, "task_id": draw(st.sampled_from(["t1", "t2"]))}
    if draw(st.booleans()):
        message["tokens"] = count_tokens(content)
    return message


def _expected(history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    chats, costs = [], []
    for m in history:
        tool = m["role"] == "tool"
        chats.append({"role": "user" if tool else "assistant" if m["role"] == "assistant"
                      else "user",
                      "content": render_tool_message(m["content"]) if tool else m["content"]})
        costs.append(count_tokens(m["content"]) + MESSAGE_TOKENS
                     + (TOOL_FRAME_TOKENS if tool else 0))
    return chats, costs


operations = st.lists(st.tuples(
    st.sampled_from(["append", "extend", "iadd", "insert", "setitem", "delitem", "pop",
                     "remove", "clear", "sort", "reverse", "copy", "after", "imul"]),
    st.lists(messages(), max_size=3), st.integers(0, 8)), max_size=12)


@SETTINGS
@given(st.lists(messages(), max_size=8), operations)
def test_what_a_history_keeps_is_right_after_any_change(start, changes):
    history, plain = History(start), list(start)
    for name, more, index in changes:
        at = index % (len(plain) + 1)
        if name == "append" and more:
            history.append(more[0])
            plain.append(more[0])
        elif name == "extend":
            history.extend(iter(more))
            plain.extend(more)
        elif name == "iadd":
            history += more
            plain += more
        elif name == "insert" and more:
            history.insert(at, more[0])
            plain.insert(at, more[0])
        elif name == "setitem" and more and plain:
            history[at % len(plain)] = more[0]
            plain[at % len(plain)] = more[0]
        elif name == "delitem":
            del history[at:at + 2]
            del plain[at:at + 2]
        elif name == "pop" and plain:
            assert history.pop(at % len(plain)) is plain.pop(at % len(plain))
        elif name == "remove" and plain:
            history.remove(plain[at % len(plain)])
            plain.remove(plain[at % len(plain)])
        elif name == "clear":
            history.clear()
            plain.clear()
        elif name == "sort":
            history.sort(key=lambda m: m["content"])
            plain.sort(key=lambda m: m["content"])
        elif name == "reverse":
            history.reverse()
            plain.reverse()
        elif name == "copy":
            history = history.copy()
        elif name == "after":
            history = history.after(at)
            plain = plain[at:]
        elif name == "imul":
            history *= index % 3
            plain *= index % 3
        assert isinstance(history, History) and list(history) == plain
        chats, costs = _expected(plain)
        assert history.chats == chats
        assert [history.cost(i, i + 1) for i in range(len(plain))] == costs
        assert history.cost() == sum(costs)
        for budget in (0, 20, 200, 2_000):
            first = history.newest_within(budget)
            assert sum(costs[first:]) <= budget
            assert first == 0 or sum(costs[first - 1:]) > budget


def _plain_rule(system: str, history: list[dict[str, Any]], task_id: str, window: int,
                output: int) -> list[dict[str, Any]]:
    """What prompt_messages promises, one message at a time."""
    chats, costs = _expected(history)
    head = [{"role": "system", "content": system}]
    system_tokens = count_tokens(system) + MESSAGE_TOKENS
    budget = window - output - system_tokens
    begin = 0  # whole turns: never an answer or a tool result without its user's message
    while begin < len(history) and history[begin]["role"] != "user":
        begin += 1
    if sum(costs[begin:]) <= budget:
        return head + chats[begin:]
    start = len(history)
    while start and history[start - 1]["task_id"] == task_id:
        start -= 1
    own: list[dict[str, Any]] = []
    if start < len(history):
        if costs[start] + system_tokens + output > window:
            raise ContextWindowError("too long")
        budget -= costs[start]
        rest: list[dict[str, Any]] = []
        for index in range(len(history) - 1, start, -1):
            if costs[index] > budget:
                if history[index]["role"] == "tool" and budget >= MIN_CUT_TOKENS:
                    rest.append({"cut": index})
                return head + [chats[start]] + rest[::-1]
            budget -= costs[index]
            rest.append(chats[index])
        own = [chats[start]] + rest[::-1]
    older: list[dict[str, Any]] = []
    for index in range(start - 1, begin - 1, -1):
        if costs[index] > budget:
            break
        budget -= costs[index]
        older.append((history[index]["role"], chats[index]))
    while older and older[-1][0] != "user":  # the oldest kept must begin a turn
        older.pop()
    return head + [chat for _, chat in older[::-1]] + own


@SETTINGS
@given(st.lists(messages(), max_size=14), st.integers(300, 3_000), st.booleans())
def test_the_prompt_is_what_the_plain_rule_gives(history, window, as_history):
    system = "You are a careful agent."
    try:
        expected = _plain_rule(system, history, "t1", window, 200)
    except ContextWindowError:
        expected = None
    given_history = History(history) if as_history else history
    try:
        got = prompt_messages(system, given_history, "t1", window, 200)
    except ContextWindowError:
        got = None
    if expected is None or got is None:
        assert expected is got
        return
    assert len(got) == len(expected)
    for sent, meant in zip(got, expected):
        if "cut" in meant:  # the newest tool result that alone is too large: cut with a marker
            assert sent["role"] == "user" and "left out: too large" in sent["content"]
        else:
            assert sent == meant


class _Counted(dict):
    """A message that counts how often it is looked at."""

    reads = 0

    def __getitem__(self, key: str) -> Any:
        _Counted.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        _Counted.reads += 1
        return super().get(key, default)


async def test_a_turn_looks_at_its_new_messages_not_at_the_whole_window(any_store):
    conversation = None
    for turn in range(300):
        result = await Agent(
            llm=ScriptedLLM([{"secure": True, "response": f"answer {turn}", "actions": []}]),
            store=any_store).run(f"turn {turn}", "alice", conversation)
        conversation = result.conversation_id
    window = any_store._windows._entries[conversation]
    assert len(window.messages) == 599  # all but the last answer (added at the next turn)
    window.messages = History(_Counted(m) for m in window.messages)
    _Counted.reads = 0
    agent = Agent(llm=ScriptedLLM([{"secure": True, "response": "last", "actions": []}]),
                  store=any_store)
    result = await agent.run("one more", "alice", conversation)
    assert result.response == "last"
    sent = agent.llm.calls[0]
    assert [m["content"] for m in sent[-3:]] == ["turn 299", "answer 299", "one more"]
    assert len(sent) == 1 + 601  # the whole window and the query reached the model
    # Building the prompt read what it kept of each message: of the window's own messages,
    # at most the newest is looked at (whether it is the task's). A pass over the window
    # looked at 600.
    assert _Counted.reads <= 2, _Counted.reads
