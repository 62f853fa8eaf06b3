"""The ReAct loop end to end through Agent.run: answers, tools, retries, stop reasons.

Every test drives the public API with a ScriptedLLM and checks what the user gets, what the
model was sent (``llm.calls``) and what the database holds.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading

import pytest

from cogency import Agent, AgentResult, tool
from cogency.errors import UsageError
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens


def reply(response=None, actions=(), **fields):
    """One reply of the JSON contract."""
    return {"response": response, "actions": list(actions), **fields}


def call(name, **args):
    return {"name": name, "args": args}


def messages(db: sqlite3.Connection, conversation_id: str) -> list[tuple[str, str]]:
    return db.execute(
        "SELECT role, content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    ).fetchall()


def workspace_rows(db: sqlite3.Connection) -> list[tuple]:
    return db.execute("SELECT task_id, workspace_data, runner FROM task_workspaces").fetchall()


@tool
def weather(city: str) -> str:
    """Current weather in a city."""
    return {"Paris": "rain, 12C", "Oslo": "snow, -3C"}[city]


async def test_direct_answer(store, db):
    llm = ScriptedLLM([reply("Hello, Ada!", secure=True, objective="greet the user")])
    result = await Agent(llm=llm, store=store).run("Hi, I am Ada", user_id="ada")

    assert isinstance(result, AgentResult)
    assert (result.response, result.stop_reason, result.iterations) == (
        "Hello, Ada!", "completed", 1,
    )
    assert len(llm.calls) == 1
    system, *chat = llm.calls[0]
    assert system["role"] == "system" and "WORKSPACE:" in system["content"]
    assert chat == [{"role": "user", "content": "Hi, I am Ada"}]
    assert messages(db, result.conversation_id) == [
        ("user", "Hi, I am Ada"), ("assistant", "Hello, Ada!"),
    ]
    assert db.execute("SELECT user_id, message_count FROM conversations").fetchall() == [("ada", 2)]
    assert db.execute("SELECT user_id FROM user_profiles").fetchall() == [("ada",)]
    assert workspace_rows(db) == []  # completed: the workspace is gone
    tasks = db.execute("SELECT DISTINCT task_id FROM conversation_messages").fetchall()
    assert tasks == [(result.task_id,)]


async def test_tool_loop_over_two_iterations(store, db):
    llm = ScriptedLLM([
        reply(actions=[call("weather", city="Paris")], approach="check Paris, then Oslo"),
        reply(actions=[call("weather", city="Oslo")], discoveries="Paris: rain"),
        reply("Paris has rain, Oslo has snow."),
    ])
    result = await Agent(llm=llm, tools=[weather], store=store).run("Weather in Paris and Oslo?")

    assert result.stop_reason == "completed" and result.iterations == 3
    assert result.response == "Paris has rain, Oslo has snow."
    # The model saw each result in the call after the one that asked for it.
    second, third = llm.calls[1], llm.calls[2]
    assert "rain, 12C" in second[-1]["content"] and "TOOL RESULT weather" in second[-1]["content"]
    assert second[-2]["role"] == "assistant"
    assert json.loads(second[-2]["content"]) == {"actions": [call("weather", city="Paris")]}
    assert "snow, -3C" in third[-1]["content"] and "rain, 12C" in third[-3]["content"]
    assert "iteration 3 of 10" in third[0]["content"]
    rows = messages(db, result.conversation_id)
    assert [role for role, _ in rows] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert json.loads(rows[1][1]) == {"actions": [call("weather", city="Paris")]}
    assert json.loads(rows[2][1]) == {
        "name": "weather", "args": {"city": "Paris"}, "ok": True, "output": "rain, 12C",
    }
    assert json.loads(rows[4][1])["output"] == "snow, -3C"
    assert rows[5] == ("assistant", "Paris has rain, Oslo has snow.")
    assert workspace_rows(db) == []


async def test_two_actions_in_one_step_run_concurrently_and_keep_order(store, db):
    first_started, second_done = asyncio.Event(), asyncio.Event()

    @tool(timeout=5)
    async def first() -> str:
        """Finishes only after `second` has finished: it cannot run before it."""
        first_started.set()
        await second_done.wait()
        return "first result"

    @tool(timeout=5)
    async def second() -> str:
        """Waits for `first` to start: they only both finish if they run at the same time."""
        await first_started.wait()
        second_done.set()
        return "second result"

    llm = ScriptedLLM([reply(actions=[call("first"), call("second")]), reply("both done")])
    result = await Agent(llm=llm, tools=[first, second], store=store).run("do both")

    assert result.stop_reason == "completed" and result.iterations == 2
    rows = messages(db, result.conversation_id)
    outputs = [json.loads(content) for role, content in rows if role == "tool"]
    # `second` finished first, yet the results keep the order of the actions.
    assert [(o["name"], o["ok"], o["output"]) for o in outputs] == [
        ("first", True, "first result"), ("second", True, "second result"),
    ]
    sent = [m["content"] for m in llm.calls[1][-2:]]
    assert "TOOL RESULT first" in sent[0] and "TOOL RESULT second" in sent[1]


async def test_conversation_continued_by_id(store, db):
    llm = ScriptedLLM([reply("Nice to meet you, Ada."), reply("Your name is Ada.")])
    agent = Agent(llm=llm, store=store)
    one = await agent.run("My name is Ada.", user_id="ada")
    two = await agent.run("What is my name?", user_id="ada", conversation_id=one.conversation_id)

    assert two.conversation_id == one.conversation_id and two.task_id != one.task_id
    assert two.response == "Your name is Ada."
    assert llm.calls[1][1:] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    rows = db.execute(
        "SELECT seq, role, content, task_id FROM conversation_messages ORDER BY seq"
    ).fetchall()
    assert rows == [
        (1, "user", "My name is Ada.", one.task_id),
        (2, "assistant", "Nice to meet you, Ada.", one.task_id),
        (3, "user", "What is my name?", two.task_id),
        (4, "assistant", "Your name is Ada.", two.task_id),
    ]
    assert db.execute("SELECT count(*) FROM conversations").fetchone() == (1,)
    assert workspace_rows(db) == []


async def test_conversation_of_another_user_is_not_found(store, db):
    from cogency.errors import NotFoundError

    llm = ScriptedLLM([reply("hi")])
    agent = Agent(llm=llm, store=store)
    one = await agent.run("hello", user_id="ada")
    with pytest.raises(NotFoundError):
        await agent.run("what did ada say?", user_id="eve", conversation_id=one.conversation_id)
    assert len(llm.calls) == 1
    assert db.execute("SELECT count(*) FROM conversation_messages").fetchone() == (2,)


async def test_secure_false_refuses_and_completes(store, db):
    llm = ScriptedLLM([
        reply("I won't help with breaking into accounts.", secure=False,
              understanding="asks to steal someone's password"),
    ])
    result = await Agent(llm=llm, tools=[weather], store=store).run(
        "Get me my neighbour's email password", user_id="mallory"
    )
    assert result.stop_reason == "security"
    assert result.response == "I won't help with breaking into accounts."
    assert result.security_assessment == "asks to steal someone's password"
    assert len(llm.calls) == 1
    assert messages(db, result.conversation_id) == [
        ("user", "Get me my neighbour's email password"),
        ("assistant", "I won't help with breaking into accounts."),
    ]
    assert workspace_rows(db) == []


async def test_secure_false_without_response_gets_the_default_refusal(store, db):
    llm = ScriptedLLM([reply(secure=False, actions=[call("weather", city="Paris")])])
    result = await Agent(llm=llm, tools=[weather], store=store).run("something bad")
    assert result.stop_reason == "security"
    assert result.response and "can't help" in result.response
    # A refused request runs no tool.
    assert [r for r, _ in messages(db, result.conversation_id)] == ["user", "assistant"]


async def test_malformed_output_then_valid(store, db):
    llm = ScriptedLLM(["Sure! Let me think about that.", reply("42")])
    events = []
    agent = Agent(llm=llm, store=store)
    async for event in agent.stream("meaning of life?"):
        events.append(event)
    assert events[-1].stop_reason == "completed"
    assert len(llm.calls) == 2
    retry = llm.calls[1]
    assert retry[-2] == {"role": "assistant", "content": "Sure! Let me think about that."}
    assert retry[-1]["role"] == "user"
    assert "no JSON object found" in retry[-1]["content"]
    assert "Reply with exactly one JSON object" in retry[-1]["content"]  # the schema reminder
    assert '"secure"' in retry[-1]["content"]  # still iteration 1
    errors = [e for e in events if e.type == "error"]
    assert len(errors) == 1 and not errors[0].fatal
    # The broken reply is not part of the stored conversation.
    assert messages(db, events[0].conversation_id) == [
        ("user", "meaning of life?"), ("assistant", "42"),
    ]


async def test_always_malformed_stops_with_invalid_response(store, db):
    llm = ScriptedLLM(["nope", "{broken", '{"response": 7}'])
    result = await Agent(llm=llm, store=store, invalid_retries=2).run("hello", user_id="u")
    assert result.stop_reason == "invalid_response"
    assert result.response is None and result.error
    assert len(llm.calls) == 3
    assert "no JSON object found" in llm.calls[2][-1]["content"]
    rows = workspace_rows(db)
    assert len(rows) == 1 and rows[0][0] == result.task_id and rows[0][2] is None
    assert messages(db, result.conversation_id) == [("user", "hello")]


async def test_unknown_tool_and_bad_arguments_are_sent_back(store, db):
    llm = ScriptedLLM([
        reply(actions=[call("forecast", city="Paris")]),
        reply(actions=[call("weather", town="Paris")]),
        reply(actions=[call("weather", city="Paris")]),
        reply("rain"),
    ])
    result = await Agent(llm=llm, tools=[weather], store=store).run("weather?")
    assert result.stop_reason == "completed" and result.iterations == 2
    first_fix = llm.calls[1][-1]["content"]
    assert "unknown tool 'forecast'" in first_fix and "weather" in first_fix
    second_fix = llm.calls[2][-1]["content"]
    assert "unknown argument 'town'" in second_fix or "missing the required argument" in second_fix
    tool_rows = [json.loads(c) for r, c in messages(db, result.conversation_id) if r == "tool"]
    assert [t["args"] for t in tool_rows] == [{"city": "Paris"}]  # only the valid call ran


async def test_tool_raising_is_a_result_the_model_sees(store, db):
    @tool
    def read_disk(path: str) -> str:
        """Read a file."""
        raise OSError(f"disk on fire while reading {path}")

    llm = ScriptedLLM([reply(actions=[call("read_disk", path="/x")]), reply("The disk failed.")])
    result = await Agent(llm=llm, tools=[read_disk], store=store).run("read /x")
    assert result.stop_reason == "completed"
    seen = llm.calls[1][-1]["content"]
    assert "[error]" in seen and "OSError: disk on fire while reading /x" in seen
    stored = [json.loads(c) for r, c in messages(db, result.conversation_id) if r == "tool"]
    assert stored == [{"name": "read_disk", "args": {"path": "/x"}, "ok": False,
                       "error": "OSError: disk on fire while reading /x"}]


async def test_tool_timing_out_is_a_result_the_model_sees(store, db):
    release = threading.Event()

    @tool(timeout=0.2)
    async def hang() -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "unreachable"

    @tool(timeout=0.2)
    def block() -> str:
        """A sync tool stuck in its thread."""
        release.wait(10)
        return "late"

    llm = ScriptedLLM([reply(actions=[call("hang"), call("block")]), reply("Both timed out.")])
    try:
        result = await Agent(llm=llm, tools=[hang, block], store=store).run("go")
    finally:
        release.set()
    assert result.stop_reason == "completed"
    seen = [m["content"] for m in llm.calls[1][-2:]]
    assert all("[error]" in s and "timed out after 0.2s" in s for s in seen)
    stored = [json.loads(c) for r, c in messages(db, result.conversation_id) if r == "tool"]
    assert [(s["name"], s["ok"]) for s in stored] == [("hang", False), ("block", False)]


async def test_max_iterations_keeps_the_workspace_and_resume_finishes(store, db):
    llm = ScriptedLLM([
        reply(actions=[call("weather", city="Paris")], understanding="need Paris"),
        reply(actions=[call("weather", city="Oslo")], understanding="need Oslo too"),
    ])
    agent = Agent(llm=llm, tools=[weather], store=store, max_iterations=2)
    result = await agent.run("Weather in Paris and Oslo?", user_id="u")
    assert result.stop_reason == "max_iterations" and result.iterations == 2
    assert result.response is None
    assert "this is the last iteration" in llm.calls[1][0]["content"]
    [(task_id, data, runner)] = workspace_rows(db)
    assert task_id == result.task_id and runner is None
    assert json.loads(data)["understanding"] == "need Oslo too"

    llm.extend([reply("Rain in Paris, snow in Oslo.")])
    done = await agent.resume(result.task_id, user_id="u")
    assert done.stop_reason == "completed" and done.task_id == result.task_id
    resumed_call = llm.calls[2]
    assert "understanding: need Oslo too" in resumed_call[0]["content"]
    assert "snow, -3C" in resumed_call[-1]["content"]
    assert workspace_rows(db) == []
    roles = [r for r, _ in messages(db, result.conversation_id)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


async def test_no_progress(store, db):
    llm = ScriptedLLM([reply(understanding=f"still thinking {i}") for i in range(5)])
    result = await Agent(llm=llm, store=store).run("hmm")
    assert result.stop_reason == "no_progress" and result.iterations == 3
    assert len(llm.calls) == 3
    [(task_id, data, runner)] = workspace_rows(db)
    assert json.loads(data)["understanding"] == "still thinking 2" and runner is None


async def test_result_fields_and_usage_summed(store):
    llm = ScriptedLLM(
        ["not json", reply(actions=[call("weather", city="Oslo")]), reply("snow")],
        count_usage=True,
    )
    result = await Agent(llm=llm, tools=[weather], store=store).run("Oslo?", user_id="u")
    assert result.stop_reason == "completed" and result.iterations == 2
    assert result.error is None and result.security_assessment is None
    assert result.usage.calls == 3
    expected_in = sum(count_tokens(m["content"]) for sent in llm.calls for m in sent)
    assert result.usage.input_tokens == expected_in
    replies = ["not json", json.dumps(reply(actions=[call("weather", city="Oslo")])),
               json.dumps(reply("snow"))]
    assert result.usage.output_tokens == sum(count_tokens(r) for r in replies)


def test_run_sync(tmp_path):
    db_file = tmp_path / "sync.db"
    agent = Agent(llm=ScriptedLLM([reply("sync answer")]), store=str(db_file))
    result = agent.run_sync("hello", user_id="u")
    assert result.response == "sync answer" and result.stop_reason == "completed"
    asyncio.run(agent.close())
    with sqlite3.connect(db_file) as connection:
        rows = connection.execute(
            "SELECT role, content FROM conversation_messages ORDER BY seq"
        ).fetchall()
    assert rows == [("user", "hello"), ("assistant", "sync answer")]


async def test_run_sync_inside_an_event_loop_is_a_usage_error(store):
    agent = Agent(llm=ScriptedLLM([reply("x")]), store=store)
    with pytest.raises(UsageError, match="await run"):
        agent.run_sync("hello")


async def test_async_with_closes_only_what_the_agent_opened(store, tmp_path):
    db_file = tmp_path / "owned.db"
    async with Agent(llm=ScriptedLLM([reply("a")]), store=str(db_file)) as owner:
        assert (await owner.run("q")).response == "a"
    assert owner.store._closed  # the agent opened it, so it closed it
    with pytest.raises(UsageError, match="closed"):
        await owner.run("again")

    async with Agent(llm=ScriptedLLM([reply("b")]), store=store) as borrower:
        await borrower.run("q", user_id="b")
    assert await store.load_profile("b") is not None  # a passed-in store stays usable


async def test_scripted_llm_reads_a_generator_lazily_and_says_when_it_runs_out(store):
    from cogency.errors import ScriptExhaustedError

    made = []

    def answers():
        for i in range(2):
            made.append(i)
            yield lambda sent, i=i: reply(f"answer {i} to {sent[-1]['content']}")

    llm = ScriptedLLM(answers())
    agent = Agent(llm=llm, store=store, llm_retries=0)
    assert made == [] and llm.remaining is None
    assert (await agent.run("a")).response == "answer 0 to a"
    assert made == [0]  # one reply drawn per call, never the whole script
    assert (await agent.run("b")).response == "answer 1 to b"
    result = await agent.run("c")
    assert result.stop_reason == "error"
    assert "called 3 times but has only 2 replies" in result.error
    llm.extend([reply("more")])
    assert llm.remaining == 1 and (await agent.run("d")).response == "more"
    with pytest.raises(ScriptExhaustedError):
        await llm.generate([{"role": "user", "content": "x"}])


async def test_raise_for_error_raises_the_original_error_by_type(store, db):
    from cogency.errors import AuthenticationError, InvalidResponseError, LLMError

    refused = AuthenticationError("the provider rejected the key: set OPENAI_API_KEY")
    agent = Agent(llm=ScriptedLLM([refused, reply("fine"), "x", "y", "z"]), store=store,
                  invalid_retries=2)
    result = await agent.run("hello", user_id="u")
    # The result is as it always was: a stop reason and a message, the task kept to resume.
    assert result.stop_reason == "error" and result.error == str(refused)
    assert [row[0] for row in workspace_rows(db)] == [result.task_id]
    with pytest.raises(AuthenticationError) as caught:
        result.raise_for_error()
    assert caught.value is refused and isinstance(caught.value, LLMError)
    done = await agent.resume(result.task_id, user_id="u")
    assert done.raise_for_error() is done and done.response == "fine"
    invalid = await agent.run("again", user_id="u")
    assert invalid.stop_reason == "invalid_response"
    with pytest.raises(InvalidResponseError, match="did not follow the JSON contract"):
        invalid.raise_for_error()


async def test_a_repeated_call_is_pointed_out_then_stops_the_run(store, db):
    from cogency.agent import REPEAT_LIMIT, STOP_REASONS

    ticks = iter(range(100))

    @tool
    def clock() -> int:
        """A reading that changes at every call."""
        return next(ticks)

    same = reply(actions=[call("weather", city="Paris")])
    llm = ScriptedLLM([reply(actions=[call("clock")]), reply(actions=[call("clock")]),
                       same, same, same, reply("never asked")])
    agent = Agent(llm=llm, tools=[weather, clock], store=store)
    events = [event async for event in agent.stream("weather?", user_id="u")]
    end = events[-1]
    assert "repeated_calls" in STOP_REASONS and REPEAT_LIMIT == 3
    assert end.stop_reason == "repeated_calls" and end.iterations == 5 and len(llm.calls) == 5
    # A call whose result changed is not a repeat; the second identical result says so.
    assert "NOTE" not in llm.calls[2][-1]["content"]  # clock's second reading
    assert "NOTE" not in llm.calls[3][-1]["content"]  # the first weather call
    assert ("NOTE: you made this exact call 2 times in this task and got this same result"
            in llm.calls[4][-1]["content"])
    [warning] = [event for event in events if event.type == "error"]
    assert not warning.fatal and warning.message.startswith(
        'the model called weather({"city": "Paris"}) 3 times and got the same result')
    stored = [json.loads(c) for r, c in messages(db, events[0].conversation_id) if r == "tool"]
    assert [s.get("repeated") for s in stored] == [None, None, None, 2, 3]
    [(task_id, _, runner)] = workspace_rows(db)  # kept, to resume
    assert task_id == end.task_id and runner is None
