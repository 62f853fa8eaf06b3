"""OpenAILLM against a local server speaking the chat-completions wire format."""

from __future__ import annotations

import email.utils
import json
import time

import pytest
from fakeserver import FakeServer, Reply, sse, stream_hi

from cogency import Agent
from cogency.errors import (
    AuthenticationError,
    ContextLengthError,
    LLMError,
    LLMTimeoutError,
    ModelNotFoundError,
    RateLimitError,
    RefusalError,
)
from cogency.llm import OpenAILLM
from cogency.reason import step_schema

pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def completion(text: str, prompt: int = 11, output: int = 7, **message: object) -> dict:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text, **message}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": output,
                  "total_tokens": prompt + output},
    }


def chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None):
    choices = [] if content is None and finish is None else [
        {"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}
    ]
    data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices}
    if usage:
        data["usage"] = usage
    return sse(data)


def streamed(text: str, size: int = 5, prompt: int = 20, output: int = 9) -> Reply:
    pieces = [chunk(text[i:i + size]) for i in range(0, len(text), size)]
    usage = {"prompt_tokens": prompt, "completion_tokens": output,
             "total_tokens": prompt + output}
    return Reply(events=[*pieces, chunk(finish="stop"), chunk(usage=usage), sse("[DONE]")])


@pytest.fixture
def server():
    with FakeServer() as fake:
        yield fake


def make(server: FakeServer, **options) -> OpenAILLM:
    options.setdefault("retry_delay", 0.01)
    options.setdefault("context_window", 128_000)  # given: the fake is not asked for it
    return OpenAILLM("test-model", base_url=server.url + "/v1", api_key="sk-test", **options)


async def test_generate_sends_messages_and_schema_and_reads_usage(server):
    server.script(Reply(body=completion('{"response": "hello"}')))
    llm = make(server)
    schema = step_schema([], True)
    reply = await llm.generate(MESSAGES, schema=schema)
    await llm.close()
    assert reply.text == '{"response": "hello"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.calls) == (11, 7, 1)
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "test-model"
    assert sent.body["messages"] == MESSAGES
    # a compatible server gets the full schema, length bounds included (llama.cpp, vLLM)
    assert sent.body["response_format"]["json_schema"]["schema"] == schema
    assert "stream" not in sent.body


async def test_stream_yields_pieces_then_the_completion(server):
    server.script(streamed('{"response": "streamed answer"}', size=4))
    llm = make(server)
    pieces = [piece async for piece in llm.stream(MESSAGES)]
    await llm.close()
    texts, final = pieces[:-1], pieces[-1]
    assert len(texts) > 3 and all(isinstance(t, str) for t in texts)
    assert "".join(texts) == final.text == '{"response": "streamed answer"}'
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 9)
    assert server.requests[0].body["stream"] is True
    assert server.requests[0].body["stream_options"] == {"include_usage": True}


async def test_401_is_an_authentication_error_and_is_not_retried(server):
    server.script(Reply(401, {"error": {"message": "Incorrect API key provided"}}))
    llm = make(server)
    with pytest.raises(AuthenticationError, match="Incorrect API key.*OPENAI_API_KEY"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 1


async def test_404_is_model_not_found(server):
    server.script(Reply(404, {"error": {"message": "The model does not exist"}}))
    llm = make(server)
    with pytest.raises(ModelNotFoundError, match="test-model"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 1


async def test_429_honours_retry_after_then_succeeds(server):
    server.script(
        Reply(429, {"error": {"message": "Rate limit reached"}}, headers={"Retry-After": "1"}),
        Reply(body=completion("ok")),
    )
    llm = make(server)
    started = time.monotonic()
    reply = await llm.generate(MESSAGES)
    elapsed = time.monotonic() - started
    await llm.close()
    assert reply.text == "ok"
    assert len(server.requests) == 2
    assert elapsed >= 0.95  # waited as told, not the 10 ms backoff


async def test_429_that_persists_raises_rate_limit_after_the_retries(server):
    limited = Reply(429, {"error": {"message": "slow down"}}, headers={"retry-after-ms": "10"})
    server.script(limited, limited, limited)
    llm = make(server, max_retries=2)
    with pytest.raises(RateLimitError, match="after 3 attempts") as caught:
        await llm.generate(MESSAGES)
    await llm.close()
    assert caught.value.retried is True
    assert len(server.requests) == 3


async def test_retry_after_beyond_the_cap_fails_at_once(server):
    server.script(Reply(429, {"error": {"message": "quota"}}, headers={"Retry-After": "3600"}))
    llm = make(server, max_retry_delay=5)
    with pytest.raises(RateLimitError, match="wait 3600 s"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 1


async def test_500_is_retried_with_backoff(server):
    server.script(Reply(500, {"error": {"message": "boom"}}), Reply(503, "unavailable"),
                  streamed("fine"))
    llm = make(server)
    pieces = [piece async for piece in llm.stream(MESSAGES)]
    await llm.close()
    assert pieces[-1].text == "fine"
    assert len(server.requests) == 3


async def test_a_slow_reply_hits_the_time_limit(server):
    server.script(Reply(body=completion("late"), delay=5), Reply(body=completion("late"), delay=5))
    llm = make(server, timeout=0.3, max_retries=1)
    started = time.monotonic()
    with pytest.raises(LLMTimeoutError, match="0.3 s"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert time.monotonic() - started < 3
    assert len(server.requests) == 2  # a timeout is retried once, then reported


async def test_a_stream_that_stalls_hits_the_time_limit(server):
    server.script(Reply(events=[chunk("par")], hang=5))
    llm = make(server, timeout=0.5, max_retries=2)
    pieces = []
    with pytest.raises(LLMTimeoutError):
        async for piece in llm.stream(MESSAGES):
            pieces.append(piece)
    await llm.close()
    assert pieces == ["par"]
    assert len(server.requests) == 1  # text was already shown: not retried


async def test_refusal_raises_refusal_error(server):
    server.script(Reply(body=completion(None, refusal="I can't help with that.")))
    llm = make(server)
    with pytest.raises(RefusalError, match="can't help"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 1


async def test_a_rejected_schema_is_dropped_and_the_call_repeated(server):
    server.script(
        Reply(400, {"error": {"message": "response_format json_schema is not supported"}}),
        Reply(body=completion('{"response": "plain"}')),
        Reply(body=completion('{"response": "again"}')),
    )
    llm = make(server)
    schema = step_schema([], True)
    assert (await llm.generate(MESSAGES, schema=schema)).text == '{"response": "plain"}'
    assert (await llm.generate(MESSAGES, schema=schema)).text == '{"response": "again"}'
    await llm.close()
    assert "response_format" in server.requests[0].body
    assert "response_format" not in server.requests[1].body
    assert "response_format" not in server.requests[2].body  # remembered


async def test_official_api_gets_the_strict_subset(monkeypatch):
    llm = OpenAILLM("gpt-4o-mini", api_key="sk-test")
    request = llm._request(MESSAGES, step_schema([], True))
    await llm.close()
    sent = request["response_format"]["json_schema"]
    assert sent["strict"] is True
    assert "maxLength" not in json.dumps(sent["schema"])  # strict mode rejects it


def test_missing_key_for_the_official_api_says_what_to_set(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(Exception, match="OPENAI_API_KEY"):
        OpenAILLM("gpt-4o-mini")


async def test_agent_run_end_to_end(server, store, db):
    answer = {"secure": True, "objective": "greet", "understanding": "", "approach": "",
              "discoveries": "", "response": "Hello from the fake OpenAI!", "actions": []}
    server.script(streamed(json.dumps(answer), prompt=120, output=30))
    llm = make(server)
    async with Agent(llm=llm, store=store) as agent:
        result = await agent.run("say hello", user_id="alice")
    await llm.close()
    assert result.stop_reason == "completed"
    assert result.response == "Hello from the fake OpenAI!"
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.calls) == (
        120, 30, 1)
    rows = db.execute(
        "SELECT role, content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (result.conversation_id,),
    ).fetchall()
    assert rows == [("user", "say hello"), ("assistant", "Hello from the fake OpenAI!")]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)
    sent = server.requests[0].body
    assert sent["messages"][0]["role"] == "system"
    assert sent["messages"][-1] == {"role": "user", "content": "say hello"}
    assert sent["response_format"]["type"] == "json_schema"


async def test_agent_does_not_retry_what_the_adapter_gave_up_on(server, store, db):
    server.script(Reply(401, {"error": {"message": "bad key"}}))
    llm = make(server)
    async with Agent(llm=llm, store=store, retry_delay=0.01) as agent:
        result = await agent.run("hi", user_id="bob")
    await llm.close()
    assert result.stop_reason == "error"
    assert "bad key" in result.error
    assert len(server.requests) == 1
    # the task stays resumable
    assert db.execute("SELECT task_id FROM task_workspaces").fetchall() == [(result.task_id,)]


async def test_agent_rate_limit_retries_stay_bounded(server, store):
    limited = Reply(429, {"error": {"message": "slow"}}, headers={"retry-after-ms": "5"})
    server.script(*[limited] * 10)
    llm = make(server, max_retries=2)
    async with Agent(llm=llm, store=store, retry_delay=0.01) as agent:
        result = await agent.run("hi", user_id="carol")
    await llm.close()
    assert result.stop_reason == "error"
    assert len(server.requests) == 3  # the adapter's 3 attempts, not 3 × the agent's 3


# -- what a real server cannot be made to do: errors mid-stream, dates, hangs ------------------

ANSWER = {"secure": True, "objective": "o", "understanding": "", "approach": "",
          "discoveries": "", "response": "fine", "actions": []}


async def test_an_error_inside_a_stream_is_mapped_retried_and_reported(server, store):
    # 200 OK, then `data: {"error": …}` before any text: retried like an HTTP 500
    server.script(Reply(events=[sse({"error": {"message": "model overloaded",
                                                "type": "server_error"}})]),
                  streamed(json.dumps(ANSWER)))
    llm = make(server)
    result, events = await stream_hi(llm, store)
    assert result.stop_reason == "completed"
    [retry] = [event for event in events if event.type == "retry"]
    assert retry.attempt == 1 and 0 < retry.delay <= 0.01
    assert "model overloaded" in retry.reason and "HTTP 500" in retry.reason
    assert len(server.requests) == 2


async def test_an_error_after_text_was_shown_is_mapped_not_retried(server):
    server.script(Reply(events=[chunk('{"resp'), sse({"error": {"message": "boom"}})]))
    llm = make(server)
    with pytest.raises(LLMError, match="boom.*after part of the reply was shown") as caught:
        async for _ in llm.stream(MESSAGES):
            pass
    await llm.close()
    assert type(caught.value) is LLMError  # ours, not a raw openai.APIError
    assert len(server.requests) == 1


async def test_retry_after_as_an_http_date_is_honoured(server, store):
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    server.script(Reply(429, {"error": {"message": "slow"}}, headers={"retry-after": when}),
                  streamed(json.dumps(ANSWER)))
    llm = make(server)
    result, events = await stream_hi(llm, store)
    assert result.stop_reason == "completed"
    [retry] = [event for event in events if event.type == "retry"]
    assert 0.5 < retry.delay <= 2.0 and "HTTP 429" in retry.reason


async def test_a_hanging_server_costs_at_most_total_timeout(server):
    server.script(*[Reply(body=completion("late"), delay=5)] * 10)
    llm = make(server, timeout=0.4, total_timeout=1.0, max_retries=10, retry_delay=0.01)
    started = time.monotonic()
    with pytest.raises(LLMTimeoutError, match="total_timeout=1"):
        await llm.generate(MESSAGES)
    await llm.close()
    assert time.monotonic() - started < 1.5
    assert 2 <= len(server.requests) <= 3  # attempts cut to what was left, not 10 × 0.4 s


async def test_a_reply_cut_off_at_max_tokens_is_reasked_with_twice_the_cap(server, store):
    cut = json.dumps(ANSWER)[:30]
    server.script(Reply(events=[chunk(cut), chunk(finish="length"), sse("[DONE]")]),
                  streamed(json.dumps(ANSWER)))
    llm = make(server, max_tokens=50)
    result, events = await stream_hi(llm, store)
    assert result.stop_reason == "completed"
    [invalid] = [event for event in events if event.type == "error"]
    assert "cut off at the output token limit (50 tokens)" in invalid.message
    assert [r.body["max_tokens"] for r in server.requests] == [50, 100]
    assert llm.max_tokens == 50


def models(*entries: dict) -> Reply:
    return Reply(body={"object": "list", "data": list(entries)})


async def test_the_context_window_is_asked_from_vllm_and_ollama(server):
    # vLLM: /v1/models carries max_model_len
    server.script(models({"id": "other", "max_model_len": 1}, {"id": "m", "max_model_len": 32768}))
    vllm = OpenAILLM("m", base_url=server.url + "/v1")
    await vllm.start()
    await vllm.close()
    assert vllm.context_window == 32768
    # Ollama: /v1/models says nothing, /props is not there, /api/show has the model's info
    server.script(models({"id": "llama3.2", "object": "model"}),
                  Reply(404, {"error": "not found"}),
                  Reply(body={"parameters": "stop \"<|eot_id|>\"\nnum_ctx 16384",
                              "model_info": {"llama.context_length": 131072}}))
    ollama = OpenAILLM("llama3.2", base_url=server.url + "/v1")
    await ollama.start()
    await ollama.close()
    assert ollama.context_window == 16384  # what Ollama serves with, not the model's maximum
    paths = [(r.method, r.path) for r in server.requests]
    assert paths == [("GET", "/v1/models"), ("GET", "/v1/models"), ("GET", "/props"),
                     ("POST", "/api/show")]
    assert server.requests[-1].body == {"model": "llama3.2"}
    # no num_ctx: Ollama serves its default (and cuts longer prompts silently)
    server.script(models({"id": "llama3.2"}, {"id": "qwen"}), Reply(404, {"error": "no"}),
                  Reply(body={"model_info": {"llama.context_length": 131072}}))
    plain = OpenAILLM("llama3.2", base_url=server.url + "/v1")
    await plain.start()
    await plain.close()
    assert plain.context_window == 4096
    # given explicitly: nothing is asked
    given = OpenAILLM("m", base_url=server.url + "/v1", context_window=2048)
    await given.start()
    await given.close()
    assert given.context_window == 2048 and len(server.requests) == 7


async def test_vllm_s_context_400_is_a_context_length_error(server):
    text = ("This model's maximum context length is 2048 tokens. However, you requested "
            "5000 tokens (4000 in the messages, 1000 in the completion).")
    server.script(Reply(400, {"object": "error", "message": text, "type": "BadRequestError"}))
    llm = make(server)
    with pytest.raises(ContextLengthError) as caught:
        await llm.generate(MESSAGES)
    await llm.close()
    assert caught.value.window == 2048 and len(server.requests) == 1


async def test_options_go_on_the_wire_with_every_call_of_a_task(server, store):
    """Agent.run(options=...) reaches the request body of each call (the answer's and the
    step's before it); the answer schema rides in the structured-output schema."""
    step = {"secure": True, "objective": "", "understanding": "", "approach": "",
            "discoveries": "", "actions": [{"name": "get_weather", "args": {"city": "Oslo"}}],
            "response": None}
    server.script(streamed(json.dumps(step)))
    llm = make(server)
    weather = {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    options = {"temperature": 0.25, "top_p": 0.5, "seed": 42, "reasoning_effort": "low",
               "max_tokens": 20}
    async with Agent(llm=llm, store=store) as agent:
        paused = await agent.run("weather?", "ada", options=options, client_tools=[weather])
        server.script(streamed(json.dumps({**step, "actions": [], "response": "12 °C"})))
        done = await agent.resume(paused.task_id, "ada",
                                  results={paused.tool_calls[0]["id"]: "12"})
    await llm.close()
    assert (paused.stop_reason, done.stop_reason) == ("awaiting_tool_results", "completed")
    for sent in server.requests:
        body = sent.body
        assert (body["temperature"], body["top_p"], body["seed"], body["reasoning_effort"]) == (
            0.25, 0.5, 42, "low")
        assert "max_tokens" not in body  # the answer's bound, never a step's
    action = server.requests[0].body["response_format"]["json_schema"]["schema"]
    variants = action["properties"]["actions"]["items"]["anyOf"]
    assert [v["properties"]["name"]["enum"] for v in variants] == [["get_weather"]]
    assert list(action["properties"])[-2:] == ["actions", "response"]  # acts, then answers


async def test_an_answer_schema_is_sent_as_the_response_property(server, store):
    person = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"], "additionalProperties": False}
    answer = {"secure": True, "objective": "", "understanding": "", "approach": "",
              "discoveries": "", "actions": [], "response": {"name": "Ada"}}
    server.script(streamed(json.dumps(answer)))
    llm = make(server)
    async with Agent(llm=llm, store=store) as agent:
        result = await agent.run("who?", "ada", output_schema=person)
    await llm.close()
    assert json.loads(result.response) == {"name": "Ada"}
    schema = server.requests[0].body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["response"] == {"anyOf": [person, {"type": "null"}]}
