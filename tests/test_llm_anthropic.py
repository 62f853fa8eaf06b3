"""AnthropicLLM against a local server speaking the Messages API wire format."""

from __future__ import annotations

import json
import time

import pytest
from fakeserver import FakeServer, Reply, sse, stream_hi

from cogency import Agent, tool
from cogency.errors import (
    AuthenticationError,
    LLMTimeoutError,
    ModelNotFoundError,
    RefusalError,
    UsageError,
)
from cogency.llm import AnthropicLLM
from cogency.reason import step_schema

pytest.importorskip("anthropic")


def message(text: str, stop: str = "end_turn", prompt: int = 10, output: int = 5) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": text}], "stop_reason": stop,
            "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": output}}


def streamed(text: str, size: int = 6, prompt: int = 30, output: int = 12,
             stop: str = "end_turn") -> Reply:
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1}}}
    events = [sse(start, "message_start"),
              sse({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    for i in range(0, len(text), size):
        events.append(sse({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": text[i:i + size]}},
                          "content_block_delta"))
    events += [
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": output}}, "message_delta"),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    return Reply(events=events)


def error(status: int, kind: str, text: str, **headers: str) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": text}},
                 headers=headers)


@pytest.fixture
def server():
    with FakeServer() as fake:
        yield fake


def make(server: FakeServer, **options) -> AnthropicLLM:
    options.setdefault("retry_delay", 0.01)
    return AnthropicLLM("claude-test", api_key="sk-ant-test", base_url=server.url, **options)


MESSAGES = [
    {"role": "system", "content": "context"},
    {"role": "user", "content": "question"},
    {"role": "assistant", "content": '{"actions": []}'},
    {"role": "user", "content": "tool result 1"},
    {"role": "user", "content": "tool result 2"},
]


async def test_generate_puts_system_apart_and_merges_same_role_messages(server):
    server.script(Reply(body=message('{"response": "ok"}')))
    llm = make(server)
    reply = await llm.generate(MESSAGES, schema=step_schema([], True))
    await llm.close()
    assert reply.text == '{"response": "ok"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (10, 5)
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert "sk-ant-test" in (sent.headers.get("x-api-key", "") + sent.headers.get(
        "authorization", ""))
    assert "anthropic-version" in sent.headers
    assert sent.body["system"] == "context"
    assert sent.body["messages"] == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": '{"actions": []}'},
        {"role": "user", "content": "tool result 1\n\ntool result 2"},
    ]
    assert sent.body["max_tokens"] == 4096
    # structured output as a forced call of the step tool (what Anthropic reliably honours)
    assert sent.body["tool_choice"] == {"type": "tool", "name": "step"}
    [step] = sent.body["tools"]
    schema = step["input_schema"]
    assert step["name"] == "step" and "maxLength" not in json.dumps(schema)
    # no tools: "actions" is not there at all (an array without items would allow anything)
    assert "actions" not in schema["properties"] and "actions" not in schema["required"]
    assert schema["additionalProperties"] is False


async def test_stream_yields_text_deltas_and_usage(server):
    server.script(streamed('{"response": "streamed"}', size=5, prompt=44, output=17))
    llm = make(server)
    pieces = [piece async for piece in llm.stream(MESSAGES)]
    await llm.close()
    assert "".join(pieces[:-1]) == pieces[-1].text == '{"response": "streamed"}'
    assert len(pieces) > 3
    assert (pieces[-1].usage.input_tokens, pieces[-1].usage.output_tokens) == (44, 17)
    assert server.requests[0].body["stream"] is True


async def test_the_step_schema_fits_what_the_sdk_documents(server):
    @tool
    def store_map(values: dict[str, int], day: str, tags: list[str]) -> str:
        """Store a mapping."""
        return "ok"

    schema = step_schema([store_map], True)
    args = schema["properties"]["actions"]["items"]["anyOf"][0]["properties"]["args"]
    args["properties"]["day"]["format"] = "date"
    args["properties"]["tags"].update(minItems=2, format="x")
    args["properties"]["tags"]["items"]["format"] = "not-a-format"
    server.script(Reply(body=message("{}")))
    llm = make(server)
    await llm.generate(MESSAGES, schema=schema)
    await llm.close()
    sent = server.requests[0].body["tools"][0]["input_schema"]
    action = sent["properties"]["actions"]["items"]["anyOf"][0]
    assert action["properties"]["name"] == {"enum": ["store_map"]}  # no type beside enum
    sent_args = action["properties"]["args"]["properties"]
    assert sent_args["day"]["format"] == "date"  # in the SDK's list: kept
    assert "minItems" not in sent_args["tags"] and "format" not in sent_args["tags"]["items"]
    # an open mapping stays open: a forced tool call takes any JSON schema
    assert sent_args["values"]["additionalProperties"] == {"type": "integer"}


def tool_reply(data: dict, stop: str = "tool_use") -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "tool_use", "id": "t1", "name": "step", "input": data}],
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 9, "output_tokens": 4}}


def tool_streamed(data: dict, size: int = 7, stop: str = "tool_use") -> Reply:
    text = json.dumps(data)
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 1}}}
    events = [sse(start, "message_start"),
              sse({"type": "content_block_start", "index": 0, "content_block": {
                  "type": "tool_use", "id": "t1", "name": "step", "input": {}}},
                  "content_block_start")]
    for i in range(0, len(text), size):
        events.append(sse({"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": text[i:i + size]}},
            "content_block_delta"))
    events += [
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": 12}}, "message_delta"),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    return Reply(events=events)


async def test_the_forced_step_call_is_the_reply_streamed_or_not(server):
    data = {"secure": True, "response": "from the tool", "actions": []}
    server.script(Reply(body=tool_reply(data)), tool_streamed(data))
    llm = make(server)
    whole = await llm.generate(MESSAGES, schema=step_schema([], True))
    pieces = [p async for p in llm.stream(MESSAGES, schema=step_schema([], True))]
    await llm.close()
    assert json.loads(whole.text) == data and not whole.truncated
    assert len(pieces) > 3 and json.loads("".join(pieces[:-1])) == data
    assert json.loads(pieces[-1].text) == data


async def test_401_and_404_are_clear_and_not_retried(server):
    server.script(error(401, "authentication_error", "invalid x-api-key"),
                  error(404, "not_found_error", "model: claude-test"))
    llm = make(server)
    with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY"):
        await llm.generate(MESSAGES)
    with pytest.raises(ModelNotFoundError, match="claude-test"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 2


async def test_429_with_retry_after_and_529_overloaded_are_retried(server):
    server.script(
        error(429, "rate_limit_error", "slow down", **{"retry-after": "1"}),
        error(529, "overloaded_error", "Overloaded"),
        streamed("done"),
    )
    llm = make(server)
    started = time.monotonic()
    pieces = [piece async for piece in llm.stream(MESSAGES)]
    await llm.close()
    assert pieces[-1].text == "done"
    assert len(server.requests) == 3
    assert time.monotonic() - started >= 0.95


async def test_500_after_the_retries_is_reported(server):
    server.script(*[error(500, "api_error", "Internal server error")] * 3)
    llm = make(server, max_retries=2)
    with pytest.raises(Exception, match="HTTP 500.*after 3 attempts"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 3


async def test_slow_reply_times_out(server):
    server.script(Reply(body=message("late"), delay=5))
    llm = make(server, timeout=0.3, max_retries=0)
    with pytest.raises(LLMTimeoutError):
        await llm.generate(MESSAGES)
    await llm.close()


async def test_refusal_stop_reason(server):
    server.script(streamed("", stop="refusal"))
    llm = make(server)
    with pytest.raises(RefusalError):
        async for _ in llm.stream(MESSAGES):
            pass
    await llm.close()
    assert len(server.requests) == 1


async def test_agent_run_with_a_tool_end_to_end(server, store, db):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    first = {"secure": True, "objective": "add", "understanding": "", "approach": "use add",
             "discoveries": "", "response": None,
             "actions": [{"name": "add", "args": {"a": 2, "b": 3}}]}
    second = {"objective": "add", "understanding": "2 + 3 = 5", "approach": "done",
              "discoveries": "", "response": "2 + 3 = 5", "actions": []}
    server.script(streamed(json.dumps(first), prompt=100, output=20),
                  streamed(json.dumps(second), prompt=150, output=25))
    llm = make(server)
    async with Agent(llm=llm, tools=[add], store=store) as agent:
        result = await agent.run("what is 2 + 3?", user_id="dana")
    await llm.close()
    assert result.stop_reason == "completed" and result.response == "2 + 3 = 5"
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.calls) == (
        250, 45, 2)
    roles = [r for (r,) in db.execute(
        "SELECT role FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (result.conversation_id,))]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)
    # second call: the tool result arrives as a user turn after the assistant's actions
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert "TOOL RESULT add" in sent[-1]["content"] and "5" in sent[-1]["content"]


async def test_an_overloaded_error_event_inside_a_stream_is_retried(server, store):
    answer = {"secure": True, "objective": "o", "understanding": "", "approach": "",
              "discoveries": "", "response": "fine"}
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1}}}
    overloaded = Reply(events=[sse(start, "message_start"), sse(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        "error")])
    server.script(overloaded, tool_streamed(answer))
    llm = make(server)
    result, events = await stream_hi(llm, store)
    assert result.stop_reason == "completed" and result.response == "fine"
    [retry] = [event for event in events if event.type == "retry"]
    assert "Overloaded" in retry.reason and "HTTP 529" in retry.reason
    assert len(server.requests) == 2


async def test_options_reach_the_wire_and_a_max_tokens_stop_is_reasked_higher(server, store):
    answer = {"secure": True, "objective": "o", "understanding": "", "approach": "",
              "discoveries": "", "response": "fine"}
    server.script(streamed('{"secure": true, "objec', stop="max_tokens"),
                  tool_streamed(answer))
    llm = make(server, temperature=0, max_tokens=64, extra_body={"top_k": 5})
    result, events = await stream_hi(llm, store)
    assert result.stop_reason == "completed"
    [invalid] = [event for event in events if event.type == "error"]
    assert "cut off at the output token limit (64 tokens)" in invalid.message
    bodies = [request.body for request in server.requests]
    assert [body["max_tokens"] for body in bodies] == [64, 128]
    assert all(body["temperature"] == 0 and body["top_k"] == 5 for body in bodies)


async def test_a_server_that_refuses_the_step_tool_gets_the_prompt_alone(server):
    server.script(error(400, "invalid_request_error", "tool_choice is not supported"),
                  Reply(body=message('{"response": "ok"}')))
    llm = make(server)
    reply = await llm.generate(MESSAGES, schema=step_schema([], True))
    await llm.close()
    assert reply.text == '{"response": "ok"}'
    assert "tools" in server.requests[0].body and "tools" not in server.requests[1].body


async def test_options_go_on_the_wire_and_what_it_cannot_honour_is_refused(server):
    server.script(Reply(body=message('{"response": "ok"}')))
    llm = make(server).with_options(temperature=0.3, top_p=0.8, reasoning_effort="high")
    await llm.generate(MESSAGES)
    await llm.close()
    body = server.requests[0].body
    assert (body["temperature"], body["top_p"], body["output_config"]) == (
        0.3, 0.8, {"effort": "high"})
    plain = make(server)
    with pytest.raises(UsageError, match="seed=1: the Messages API has no seed"):
        plain.with_options(seed=1)
    with pytest.raises(UsageError, match="reasoning_effort='minimal': Anthropic's effort is"):
        plain.with_options(reasoning_effort="minimal")
    assert plain.options == {} and plain.temperature is None  # with_options made copies
    await plain.close()
