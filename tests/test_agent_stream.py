"""Agent.stream: typed events, in order, delivered while the run works."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from cogency import Agent, tool
from cogency.errors import UsageError
from cogency.testing import ScriptedLLM


def reply(response=None, actions=(), **fields):
    return {"response": response, "actions": list(actions), **fields}


async def test_events_arrive_in_order_while_the_run_works(store, db):
    release = asyncio.Event()

    @tool(timeout=5)
    async def fetch(url: str) -> str:
        """Fetch a page; finishes only when the test says so."""
        await release.wait()
        return "<html>ok</html>"

    llm = ScriptedLLM([
        reply(actions=[{"name": "fetch", "args": {"url": "http://x"}}], approach="fetch it"),
        reply("The page says ok."),
    ])
    agent = Agent(llm=llm, tools=[fetch], store=store)
    events = []
    async for event in agent.stream("what does x say?", user_id="ada"):
        events.append(event)
        if event.type == "action":
            # The tool is blocked on `release`: this event reached us mid-run, not after it.
            assert not release.is_set()
            rows = db.execute("SELECT runner FROM task_workspaces").fetchall()
            assert len(rows) == 1 and rows[0][0]  # the task is held by the running run
            assert len(llm.calls) == 1
            release.set()

    assert [e.type for e in events] == [
        "start", "reason", "action", "result", "reason", "response", "end",
    ]
    start, reason1, action, result, reason2, response, end = events
    assert start.query == "what does x say?" and not start.resumed
    assert {e.task_id for e in events} == {start.task_id}
    assert reason1.iteration == 1 and reason1.workspace["approach"] == "fetch it"
    assert (action.iteration, action.name, action.args) == (1, "fetch", {"url": "http://x"})
    assert (result.name, result.ok, result.output) == ("fetch", True, "<html>ok</html>")
    assert reason2.iteration == 2
    assert response.text == "The page says ok."
    assert (end.stop_reason, end.iterations) == ("completed", 2)
    assert json.loads(json.dumps([e.to_dict() for e in events]))[0]["type"] == "start"
    stored = db.execute(
        "SELECT role FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (start.conversation_id,),
    ).fetchall()
    assert [r for (r,) in stored] == ["user", "assistant", "tool", "assistant"]


async def test_token_events_carry_the_streamed_reply(store):
    first = reply(actions=[{"name": "echo", "args": {"text": "hi"}}])
    second = reply("done")

    @tool
    def echo(text: str) -> str:
        """Echo text."""
        return text

    llm = ScriptedLLM([first, second], chunk=7)
    events = [e async for e in Agent(llm=llm, tools=[echo], store=store).stream("echo hi")]
    types = [e.type for e in events]
    # Tokens of each step come before that step's reason event.
    first_reason = types.index("reason")
    second_reason = types.index("reason", first_reason + 1)
    tokens_one = [e.text for e in events[:first_reason] if e.type == "token"]
    tokens_two = [e.text for e in events[first_reason:second_reason] if e.type == "token"]
    assert "".join(tokens_one) == json.dumps(first)
    assert "".join(tokens_two) == json.dumps(second)
    assert all(len(t) <= 7 for t in tokens_one + tokens_two)
    assert len(tokens_one) == -(-len(json.dumps(first)) // 7)
    assert types[-1] == "end"


async def test_llm_failure_is_a_fatal_error_event(store, db):
    llm = ScriptedLLM([ConnectionError("no route to host")] * 2)
    agent = Agent(llm=llm, store=store, llm_retries=1, retry_delay=0)
    events = [e async for e in agent.stream("hello")]
    assert [e.type for e in events] == ["start", "retry", "error", "end"]
    retry = events[1].to_dict()  # what --json and the service show
    assert retry == {"type": "retry", "task_id": events[0].task_id, "attempt": 1,
                     "delay": 0.0, "reason": "ConnectionError: no route to host"}
    assert events[2].fatal and "no route to host" in events[2].message
    assert events[-1].stop_reason == "error"
    assert db.execute("SELECT runner FROM task_workspaces").fetchall() == [(None,)]


async def test_closing_the_stream_early_stops_the_run_cleanly(store, db):
    started = asyncio.Event()

    @tool(timeout=30)
    async def forever() -> str:
        """Never ends."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    llm = ScriptedLLM([reply(actions=[{"name": "forever", "args": {}}])])
    agent = Agent(llm=llm, tools=[forever], store=store)
    stream = agent.stream("wait forever", user_id="ada").__aiter__()
    async for event in stream:
        if event.type == "action":
            break
    await asyncio.wait_for(started.wait(), 5)
    await stream.aclose()  # a client going away
    rows = db.execute("SELECT runner FROM task_workspaces").fetchall()
    assert rows == [(None,)]  # kept for resume, and free
    roles = [r for (r,) in db.execute("SELECT role FROM conversation_messages ORDER BY seq")]
    assert roles == ["user", "assistant", "tool"]



async def test_history_is_stored_before_the_query_and_reaches_the_model(store, db):
    llm = ScriptedLLM([reply("Your name is Ada.")])
    agent = Agent(llm=llm, store=store, memory=False)
    history = [("user", "my name is Ada"), ("assistant", "Hello Ada.")]
    events = [event async for event in agent.stream("my name?", "ada", history=history)]
    assert events[-1].type == "end"
    sent = [(m["role"], m["content"]) for m in llm.calls[0][1:]]
    assert sent == [*history, ("user", "my name?")]
    rows = db.execute("SELECT role, content, task_id IS NULL FROM conversation_messages "
                      "ORDER BY seq").fetchall()
    assert rows == [("user", "my name is Ada", 1), ("assistant", "Hello Ada.", 1),
                    ("user", "my name?", 0), ("assistant", "Your name is Ada.", 0)]
    with pytest.raises(UsageError, match="history"):
        async for _ in agent.stream("q", "ada", history=[("system", "obey")]):
            pass
    assert db.execute("SELECT count(*) FROM conversation_messages").fetchone() == (4,)


class _Stalls(ScriptedLLM):
    """Streams each scripted text in pieces, then fails as a stream that stalled does (the
    provider adapters raise LLMTimeoutError, retried, once part of a reply was shown)."""

    async def stream(self, messages, *, schema=None):
        from cogency.errors import LLMTimeoutError

        completion = await self.generate(messages, schema=schema)
        for start in range(0, len(completion.text), 7):
            yield completion.text[start:start + 7]
        error = LLMTimeoutError("local: no complete reply within 120 s (after part of the "
                                "reply was shown)")
        error.retried = True
        raise error


async def test_an_answer_already_streamed_survives_a_later_time_out(store, db):
    llm = _Stalls(['{"secure": true, "objective": "capital", "response": "Il capital di Italy '
                   'è Roma", "actions": [  '])
    events = [event async for event in Agent(llm=llm, store=store).stream("Capitale?")]
    end = events[-1]
    assert end.stop_reason == "completed"
    [answer] = [event.text for event in events if event.type == "response"]
    assert answer == "Il capital di Italy è Roma"
    notes = [event for event in events if event.type == "error"]
    assert len(notes) == 1 and not notes[0].fatal and "after its answer was complete" in \
        notes[0].message and "LLMTimeoutError" in notes[0].message
    stored = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert stored == [("user", "Capitale?"), ("assistant", "Il capital di Italy è Roma")]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)  # completed


@pytest.mark.parametrize("partial", [
    '{"secure": true, "response": "Il capital di It',                  # the answer not closed
    '{"response": null, "actions": [{"name": "look", "args": {"q": "x',  # a call begun
    '{"response": "Roma", "actions": [{"name": "look", "args": {}}',    # a call made
])
async def test_a_reply_cut_before_a_whole_answer_is_still_an_error(store, db, partial):
    @tool
    def look(q: str = "") -> str:
        """Look something up."""
        return q

    result = await Agent(llm=_Stalls([partial]), tools=[look], store=store).run("Capitale?")
    assert result.stop_reason == "error" and "no complete reply" in (result.error or "")
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (1,)  # resumable


async def test_the_end_event_carries_the_runs_token_usage(store):
    script = [reply(actions=[{"name": "echo", "args": {"text": "hi"}}]), reply("said hi")]

    @tool
    def echo(text: str) -> str:
        """Say it back."""
        return text

    streamed = Agent(llm=ScriptedLLM(script, count_usage=True), tools=[echo], store=store)
    events = [event async for event in streamed.stream("say hi", user_id="ada")]
    ran = await Agent(llm=ScriptedLLM(script, count_usage=True), tools=[echo],
                      store=store).run("say hi", user_id="bob")
    end = events[-1]
    assert end.type == "end" and end.usage == ran.usage
    assert end.usage.calls == 2 and end.usage.input_tokens > 50 and end.usage.output_tokens > 5
    assert end.to_dict()["usage"] == {"input_tokens": ran.usage.input_tokens,
                                      "output_tokens": ran.usage.output_tokens, "calls": 2}


async def test_every_event_is_the_same_plain_copy_asdict_would_make(store):
    @tool
    def echo(text: str, deep: dict | None = None) -> str:
        """Say it back."""
        return text

    script = [reply(actions=[{"name": "echo", "args": {"text": "hi", "deep": {"list": [1, 2]}}}],
                    workspace={"notes": "n"}),
              reply("said hi")]
    agent = Agent(llm=ScriptedLLM(script, count_usage=True), tools=[echo], store=store)
    events = [event async for event in agent.stream("say hi", user_id="ada")]
    kinds = {event.type for event in events}
    assert {"start", "reason", "action", "result", "response", "end"} <= kinds
    for event in events:
        data = event.to_dict()
        assert data == {"type": event.type, **dataclasses.asdict(event)}
        assert list(data) == ["type", *(f.name for f in dataclasses.fields(event))]
        assert json.loads(json.dumps(data)) == data  # JSON as it is
    action = next(event for event in events if event.type == "action")
    data = action.to_dict()
    data["args"]["deep"]["list"].append(3)  # the caller's copy: the event keeps its own
    assert action.args["deep"]["list"] == [1, 2]
    assert isinstance(next(e for e in events if e.type == "end").to_dict()["usage"], dict)
