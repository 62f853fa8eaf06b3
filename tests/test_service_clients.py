"""The popular OpenAI clients against a real `cogency serve`, each used the way its own docs
show: the official `openai` SDK (streaming as the model writes), Pydantic AI (chat and
responses models, `instructions`, multi-turn with `message_history`), the OpenAI Agents SDK
(Responses and Chat Completions models, `instructions`, a `function_tool` the model calls and
the SDK runs), LangChain's `ChatOpenAI` (a SystemMessage, `temperature`, `.stream()`,
`bind_tools`), and Open WebUI 0.12's own requests, recorded from its source (its default chat
with its built-in tools, a built-in tool's follow-up, a title request with `store: false`).
Each test asserts the answers and the database: one conversation per chat, one task per
logical request (a function call and its results are one)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from serverutil import Server, create_key, rows

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")
openai = pytest.importorskip("openai")

RECORDED = Path(__file__).parent / "recorded"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server whose model streams its replies in pieces (answers arrive as deltas)."""
    tmp = tmp_path_factory.mktemp("clients")
    db = str(tmp / "clients.db")
    server = Server(db, tmp, "--llm", "server_models:streaming")
    yield server, db, tmp
    server.stop()


def key_for(db, user):
    return create_key(db, user)


def conversations(db, user):
    return [c for (c,) in rows(db, "SELECT conversation_id FROM conversations WHERE user_id = ? "
                                   "ORDER BY updated_at", user)]


def turns(db, conversation):
    """The conversation's (task, role, content), oldest first."""
    return rows(db, "SELECT task_id, role, content FROM conversation_messages "
                    "WHERE conversation_id = ? ORDER BY seq", conversation)


def tasks_of(stored):
    return list(dict.fromkeys(task for task, _, _ in stored if task is not None))


def chat_of(stored):
    """What a chat shows of a stored conversation: the queries and the answers."""
    return [(role, content) for _, role, content in stored
            if role == "user" or (role == "assistant" and not content.startswith('{"actions"'))]


# -- the official SDK ---------------------------------------------------------------------------


def test_the_official_client_gets_the_answer_as_it_is_written(served):
    server, db, _ = served
    ai = openai.OpenAI(base_url=server.url + "/v1", api_key=key_for(db, "olga"), max_retries=0)
    chunks = list(ai.chat.completions.create(
        model="cogency", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "tell me about the northern lights"}]))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "echo: tell me about the northern lights"
    assert len(pieces) > 3  # in pieces as the model wrote them, not one delta at the end
    assert chunks[-1].usage.total_tokens > 0
    with ai.responses.stream(model="cogency", input="and about auroras") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: and about auroras" and len(deltas) > 3
    [first, second] = conversations(db, "olga")
    assert chat_of(turns(db, first))[-1] == ("assistant", "echo: tell me about the northern lights")
    assert chat_of(turns(db, second))[-1] == ("assistant", "echo: and about auroras")


def test_an_answer_started_again_follows_what_was_sent_and_is_stored_alone(served):
    """An SSE client cannot take text back: the model's first reply streamed "a first try"
    and turned out invalid, its next one answers differently; the stream goes on after a
    blank line, the stored answer (and the final Response) is the second answer alone."""
    server, db, _ = served
    ai = openai.OpenAI(base_url=server.url + "/v1", api_key=key_for(db, "rita"), max_retries=0)
    chunks = list(ai.chat.completions.create(
        model="cogency", stream=True, messages=[{"role": "user", "content": "restart"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a first try\n\nsecond answer"
    with ai.responses.stream(model="cogency", input="restart") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "a first try\n\nsecond answer"
    assert final.output_text == "second answer"
    assert ai.responses.retrieve(final.id).output_text == "second answer"
    for conversation in conversations(db, "rita"):
        assert chat_of(turns(db, conversation)) == [("user", "restart"),
                                                    ("assistant", "second answer")]


def test_store_false_runs_answer_keep_nothing_and_teach_nothing(tmp_path):
    """OpenAI's `store: false` (what Open WebUI's title requests send with TASK_MODEL_PARAMS):
    the run happens, nothing of it stays in the database, and nothing is learned from it;
    the same requests with `store` left out are stored and learned from."""
    db = str(tmp_path / "store.db")
    server = Server(db, tmp_path)  # learns each user's profile, as `cogency serve` does
    try:
        ai = openai.OpenAI(base_url=server.url + "/v1", api_key=key_for(db, "erin"))
        title = ai.chat.completions.create(model="cogency", store=False, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "echo: hi"},
            {"role": "user", "content": "### Task:\nGenerate a concise title\n<chat_history>"}])
        assert title.choices[0].message.content == '{ "title": "Weather Talk" }'
        gone = ai.responses.create(model="cogency", input="a one-off", store=False)
        assert gone.output_text == "echo: a one-off" and gone.store is False
        with pytest.raises(openai.NotFoundError):
            ai.responses.retrieve(gone.id)  # not stored, as OpenAI does with store=false
        paused = ai.chat.completions.create(
            model="cogency", store=False, tools=[WEATHER],
            messages=[{"role": "user", "content": "weather Oslo"}])
        [call] = paused.choices[0].message.tool_calls
        assert len(conversations(db, "erin")) == 1  # kept while it waits for the result
        done = ai.chat.completions.create(model="cogency", store=False, tools=[WEATHER],
                                          messages=[{"role": "user", "content": "weather Oslo"},
                                                    paused.choices[0].message.model_dump(),
                                                    {"role": "tool", "tool_call_id": call.id,
                                                     "content": "-2 °C"}])
        assert done.choices[0].message.content == "the weather in Oslo: -2 °C"
        kept = openai.OpenAI(base_url=server.url + "/v1", api_key=key_for(db, "finn"))
        kept.chat.completions.create(model="cogency",
                                     messages=[{"role": "user", "content": "hi"}])
    finally:
        server.stop()  # waits for learning in flight
    for table in ("conversations", "task_workspaces", "task_approvals", "idempotency_keys"):
        assert rows(db, f"SELECT COUNT(*) FROM {table} WHERE user_id = 'erin'") == [(0,)], table
    assert rows(db, "SELECT COUNT(*) FROM conversation_messages") == rows(
        db, "SELECT COUNT(*) FROM conversation_messages m JOIN conversations c "
            "USING (conversation_id) WHERE c.user_id = 'finn'")
    profiles = {user: json.loads(data) for user, data in
                rows(db, "SELECT user_id, profile_data FROM user_profiles")}
    assert profiles["erin"]["interaction_count"] == 0  # taught nothing
    assert profiles["erin"]["communication_style"] == ""
    assert profiles["finn"]["communication_style"] == "brief answers"  # a kept run teaches
    assert len(conversations(db, "finn")) == 1


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


# -- Pydantic AI ----------------------------------------------------------------------------------


def test_pydantic_ai_chat_and_responses_models(served):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    server, db, _ = served
    provider = OpenAIProvider(base_url=server.url + "/v1", api_key=key_for(db, "pia"))
    for model in (OpenAIChatModel("cogency", provider=provider),
                  OpenAIResponsesModel("cogency", provider=provider)):
        agent = Agent(model, instructions="Be terse.")
        first = agent.run_sync("my name is Ada")
        assert first.output == "echo: my name is Ada"
        second = agent.run_sync("recall", message_history=first.new_messages())
        assert second.output == "you said: my name is Ada"  # the same conversation
        third = agent.run_sync("instructions", message_history=second.all_messages())
        assert third.output == "instructions: Be terse."
    chats = conversations(db, "pia")
    assert len(chats) == 2  # one conversation per chat, for each model
    for conversation in chats:
        stored = turns(db, conversation)
        assert chat_of(stored) == [
            ("user", "my name is Ada"), ("assistant", "echo: my name is Ada"),
            ("user", "recall"), ("assistant", "you said: my name is Ada"),
            ("user", "instructions"), ("assistant", "instructions: Be terse.")]
        assert len(tasks_of(stored)) == 3  # one task per run


# -- the OpenAI Agents SDK -------------------------------------------------------------------------


def test_openai_agents_sdk_runs_its_function_tool_when_the_model_calls_it(served):
    pytest.importorskip("agents")
    from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    server, db, _ = served
    key = key_for(db, "otto")
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        ran.append(city)
        return f"14 °C in {city}"

    for kind in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        sdk_client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key)
        agent = Agent(name="Assistant", instructions="Be terse.", tools=[get_weather],
                      model=kind(model="cogency", openai_client=sdk_client))
        result = Runner.run_sync(agent, "weather Oslo")
        assert result.final_output == "the weather in Oslo: 14 °C in Oslo"
        again = Runner.run_sync(agent, [*result.to_input_list(),
                                        {"role": "user", "content": "instructions"}])
        assert again.final_output == "instructions: Be terse."
    assert ran == ["Oslo", "Oslo"]  # the SDK ran its tool, once per run
    chats = conversations(db, "otto")
    assert len(chats) == 2
    for conversation in chats:
        stored = turns(db, conversation)
        assert [role for _, role, _ in stored] == [
            "user", "assistant", "tool", "assistant", "user", "assistant"]
        assert json.loads(stored[2][2])["output"] == "14 °C in Oslo"
        assert len(tasks_of(stored)) == 2  # the call and its result: one task
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces WHERE user_id = 'otto'") == [(0,)]


# -- LangChain ------------------------------------------------------------------------------------


def test_langchain_chat_openai(served):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    server, db, _ = served
    llm = ChatOpenAI(model="cogency", base_url=server.url + "/v1", api_key=key_for(db, "lena"),
                     temperature=0.2)
    told = llm.invoke([SystemMessage("Be terse."), HumanMessage("instructions")])
    assert told.content == "instructions: Be terse."
    assert llm.invoke("options").content == '{"temperature": 0.2}'  # reached the model
    chunks = list(llm.stream("tell me about the sea"))
    assert "".join(c.content for c in chunks) == "echo: tell me about the sea"
    assert len([c for c in chunks if c.content]) > 3

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return f"9 °C in {city}"

    bound = llm.bind_tools([get_weather])
    ask = HumanMessage("weather Paris")
    called = bound.invoke([ask])
    [call] = called.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    answer = bound.invoke([ask, called, get_weather.invoke(call)])
    assert answer.content == "the weather in Paris: 9 °C in Paris"
    chats = conversations(db, "lena")
    assert len(chats) == 4  # each invoke without history is a chat of its own
    stored = turns(db, chats[-1])
    assert chat_of(stored) == [("user", "weather Paris"),
                               ("assistant", "the weather in Paris: 9 °C in Paris")]
    assert len(tasks_of(stored)) == 1


# -- Open WebUI (recorded requests) ---------------------------------------------------------------


def sse_chunks(response: httpx.Response) -> list[dict]:
    lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def streamed_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_open_webui_default_chat_with_its_built_in_tools(served):
    """Open WebUI 0.12's request as it sends it (tests/recorded/): streamed, with
    stream_options, max_tokens, a system prompt and its 28 built-in tools; a built-in tool the
    model calls, and Open WebUI's follow-up with its result; the next message with the whole
    history; and a title request with `store: false` (TASK_MODEL_PARAMS)."""
    server, db, _ = served
    recorded = json.loads((RECORDED / "open_webui_0_12_chat.json").read_text())["request"]
    assert len(recorded["tools"]) == 28
    key = key_for(db, "webui")
    with server.client(key) as http:
        def send(body: dict) -> list[dict]:
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200, response.read()
                return sse_chunks(response)

        hello = send(recorded)
        assert streamed_text(hello) == "echo: hello"
        assert hello[-2]["choices"][0]["finish_reason"] == "stop"
        assert hello[-1]["usage"]["total_tokens"] > 0  # stream_options.include_usage
        [conversation] = conversations(db, "webui")

        history = [*recorded["messages"], {"role": "assistant", "content": "echo: hello"},
                   {"role": "user", "content": "clock"}]
        paused = send({**recorded, "messages": history})
        deltas = [d for c in paused if c["choices"]
                  for d in c["choices"][0]["delta"].get("tool_calls") or ()]
        assert [d["function"]["name"] for d in deltas] == ["get_current_timestamp"]
        assert paused[-2]["choices"][0]["finish_reason"] == "tool_calls"
        # Open WebUI runs its tool and sends the follow-up (utils/middleware.py)
        call = deltas[0]
        follow_up = [*history,
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": call["id"], "type": "function", "function": call["function"]}]},
                     {"role": "tool", "tool_call_id": call["id"],
                      "content": '{"current_timestamp": 1700000000}'}]
        answered = send({**recorded, "messages": follow_up})
        assert streamed_text(answered) == 'the time is {"current_timestamp": 1700000000}'

        # the next message resends everything: the same conversation goes on
        after = [*follow_up, {"role": "assistant",
                              "content": 'the time is {"current_timestamp": 1700000000}'},
                 {"role": "user", "content": "recall"}]
        assert streamed_text(send({**recorded, "messages": after})) == "you said: hello"
        assert conversations(db, "webui") == [conversation]
        stored = turns(db, conversation)
        assert len(tasks_of(stored)) == 3  # hello; clock (with its tool); recall
        assert chat_of(stored)[-2:] == [("user", "recall"), ("assistant", "you said: hello")]

        # its title request, with TASK_MODEL_PARAMS='{"store": false}' (routers/tasks.py)
        title = http.post("/v1/chat/completions", json={
            "model": "cogency", "stream": False, "store": False, "messages": [{
                "role": "user", "content": "### Task:\nGenerate a concise title summarizing "
                "the chat history.\n<chat_history>\nUSER: hello\n</chat_history>"}]})
        assert title.status_code == 200, title.text
        assert json.loads(title.json()["choices"][0]["message"]["content"]) == {
            "title": "Weather Talk"}
        assert conversations(db, "webui") == [conversation]  # the title request kept nothing
