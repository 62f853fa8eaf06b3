"""OpenAILLM against a local server speaking the chat-completions wire format."""

from __future__ import annotations

import json
import time

import pytest
from fakeserver import FakeServer, Reply, sse

from cogency import Agent
from cogency.errors import (
    AuthenticationError,
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
