"""The task's own query always reaches the model (issue 19): whole when it fits, a clear error
before any model call when it cannot, and tool results too large for the window cut with a
visible marker."""

from __future__ import annotations

import json

import random
import string

import pytest

from cogency import Agent, tool
from cogency.errors import ContextWindowError, LLMError
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens


def reply(response=None, actions=()):
    return {"response": response, "actions": list(actions)}


def long_text(size: int, seed: int = 7) -> str:
    """``size`` characters of word-like text (about 4 characters a token, like prose)."""
    rng = random.Random(seed)
    words = []
    total = 0
    while total < size:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    return " ".join(words)[:size]


async def test_a_200_kb_query_arrives_whole_after_earlier_history(store, db):
    llm = ScriptedLLM([reply("first answer"), reply("summary done")], context_window=200_000)
    async with Agent(llm=llm, store=store) as agent:
        first = await agent.run("a short earlier question", user_id="ana")
        query = "Summarise this:\n" + long_text(200_000)
        assert count_tokens(query) > 8_000 * 4  # far beyond history_tokens (8,000)
        result = await agent.run(query, user_id="ana", conversation_id=first.conversation_id)
    assert result.stop_reason == "completed", result.error
    sent = llm.calls[1]
    assert sent[-1] == {"role": "user", "content": query}  # whole, byte for byte
    assert [m["role"] for m in sent] == ["system", "user"]  # older history gave way first
    stored = db.execute("SELECT content FROM conversation_messages WHERE role = 'user' "
                        "ORDER BY seq DESC LIMIT 1").fetchone()[0]
    assert stored == query


async def test_older_history_is_kept_when_there_is_room(store):
    llm = ScriptedLLM([reply("one"), reply("two")], context_window=200_000)
    async with Agent(llm=llm, store=store, history_tokens=100_000) as agent:
        first = await agent.run("earlier question", user_id="ana")
        query = long_text(60_000)
        await agent.run(query, user_id="ana", conversation_id=first.conversation_id)
    sent = llm.calls[1]
    assert [m["content"] for m in sent[1:]] == ["earlier question", "one", query]


async def test_a_query_that_cannot_fit_is_a_clear_error_before_any_call(store, db):
    llm = ScriptedLLM([reply("never")], context_window=8_192)
    query = long_text(200_000)
    async with Agent(llm=llm, store=store) as agent:
        with pytest.raises(ContextWindowError) as caught:
            await agent.run(query, user_id="ana")
    message = str(caught.value)
    assert f"{count_tokens(query):,} tokens" in message and "8,192" in message
    assert "shorten the query" in message
    assert llm.calls == []  # no model call
    # nothing half-made: no task, no message (the store was not even written to)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    for table in {"task_workspaces", "conversation_messages"} & tables:
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,)


async def test_an_oversized_tool_result_is_cut_with_a_marker(store, db):
    big = long_text(20_000, seed=3)  # a tool's whole output (the tool layer's own cap)

    @tool
    def fetch_page(url: str) -> str:
        """Fetch a page."""
        return big

    llm = ScriptedLLM([reply(actions=[{"name": "fetch_page", "args": {"url": "u"}}]),
                       reply("read it")], context_window=4_000)
    async with Agent(llm=llm, tools=[fetch_page], store=store) as agent:
        result = await agent.run("what does the page say?", user_id="ana")
    assert result.stop_reason == "completed", result.error
    second = llm.calls[1]
    assert second[1] == {"role": "user", "content": "what does the page say?"}  # query kept
    tool_message = second[-1]["content"]
    assert tool_message.startswith("TOOL RESULT fetch_page")
    assert tool_message.endswith("</tool_output>")
    # What the tool layer stored (it caps every result on its own) is what the window cuts.
    (stored,) = db.execute("SELECT content FROM conversation_messages WHERE role = 'tool'").fetchone()
    body = json.loads(stored)["output"]
    kept = tool_message.split("<tool_output>\n", 1)[1].split("\n[…", 1)[0]
    assert big.startswith(kept) and body.startswith(kept) and len(kept) > 2_000
    left = len(body) - len(kept)
    assert f"[… {left:,} more characters" in tool_message
    assert "left out: too large for the model's context window]" in tool_message
    assert sum(count_tokens(m["content"]) + 8 for m in second) <= 4_000 - 1_024


async def test_on_resume_the_task_s_own_messages_come_back_whole(store):
    @tool
    def note(text: str) -> str:
        """Keep a note."""
        return "noted"

    query = long_text(60_000, seed=11)  # ~ twice history_tokens on its own
    failing = ScriptedLLM([reply(actions=[{"name": "note", "args": {"text": "x"}}]),
                           LLMError("provider down")], context_window=200_000)
    async with Agent(llm=failing, tools=[note], store=store, llm_retries=0) as agent:
        stopped = await agent.run(query, user_id="ana")
    assert stopped.stop_reason == "error"
    llm = ScriptedLLM([reply("done")], context_window=200_000)
    async with Agent(llm=llm, tools=[note], store=store) as agent:
        result = await agent.resume(stopped.task_id, user_id="ana")
    assert result.stop_reason == "completed", result.error
    sent = llm.calls[0]
    assert sent[1] == {"role": "user", "content": query}
    assert sent[2]["role"] == "assistant" and '"note"' in sent[2]["content"]
    assert sent[3]["content"].startswith("TOOL RESULT note")

