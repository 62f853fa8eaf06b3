"""GeminiLLM against a local server speaking the Gemini API wire format."""

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
    RefusalError,
    UsageError,
)
from cogency.llm import GeminiLLM
from cogency.reason import step_schema

pytest.importorskip("google.genai")

MESSAGES = [
    {"role": "system", "content": "context"},
    {"role": "user", "content": "question"},
    {"role": "assistant", "content": "thinking"},
    {"role": "user", "content": "result A"},
    {"role": "user", "content": "result B"},
]


def reply_body(text: str, finish: str = "STOP", prompt: int = 12, output: int = 6,
               thoughts: int = 0) -> dict:
    usage = {"promptTokenCount": prompt, "candidatesTokenCount": output,
             "totalTokenCount": prompt + output + thoughts}
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                            "finishReason": finish, "index": 0}],
            "usageMetadata": usage, "modelVersion": "gemini-test"}


def streamed(text: str, size: int = 6, prompt: int = 40, output: int = 10) -> Reply:
    events = []
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        body = {"candidates": [{"content": {"role": "model", "parts": [{"text": piece}]},
                                "index": 0, **({"finishReason": "STOP"} if last else {})}]}
        if last:
            body["usageMetadata"] = {"promptTokenCount": prompt, "candidatesTokenCount": output,
                                     "totalTokenCount": prompt + output}
        events.append(sse(body))
    return Reply(events=events)


def error(status: int, kind: str, text: str, **headers: str) -> Reply:
    return Reply(status, {"error": {"code": status, "message": text, "status": kind}},
                 headers=headers)


@pytest.fixture
def server():
    with FakeServer() as fake:
        yield fake


def make(server: FakeServer, **options) -> GeminiLLM:
    options.setdefault("retry_delay", 0.01)
    return GeminiLLM("gemini-test", api_key="g-key", base_url=server.url, **options)


async def test_generate_sends_system_instruction_schema_and_merged_contents(server):
    server.script(Reply(body=reply_body('{"response": "hi"}', thoughts=4)))
    llm = make(server)
    reply = await llm.generate(MESSAGES, schema=step_schema([], True))
    await llm.close()
    assert reply.text == '{"response": "hi"}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (12, 10)  # thoughts count
    sent = server.requests[0]
    assert sent.path == "/v1beta/models/gemini-test:generateContent"  # response_json_schema
    assert sent.headers["x-goog-api-key"] == "g-key"
    body = sent.body
    assert body["systemInstruction"]["parts"][0]["text"] == "context"
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert [p["text"] for p in body["contents"][2]["parts"]] == ["result A", "result B"]
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    schema = config["responseJsonSchema"]
    assert schema["required"][0] == "secure" and "maxLength" not in json.dumps(schema)


async def test_stream_over_sse(server):
    server.script(streamed('{"response": "streamed"}', size=4, prompt=41, output=11))
    llm = make(server)
    pieces = [piece async for piece in llm.stream(MESSAGES)]
    await llm.close()
    assert "".join(pieces[:-1]) == pieces[-1].text == '{"response": "streamed"}'
    assert len(pieces) > 3
    assert (pieces[-1].usage.input_tokens, pieces[-1].usage.output_tokens) == (41, 11)
    assert ":streamGenerateContent" in server.requests[0].path
    assert "alt=sse" in server.requests[0].path


async def test_bad_key_and_unknown_model(server):
    server.script(error(401, "UNAUTHENTICATED", "API key not valid"),
                  error(404, "NOT_FOUND", "models/gemini-test is not found"))
    llm = make(server)
    with pytest.raises(AuthenticationError, match="GEMINI_API_KEY"):
        await llm.generate(MESSAGES)
    with pytest.raises(ModelNotFoundError):
        await llm.generate(MESSAGES)
    await llm.close()
    assert len(server.requests) == 2


async def test_429_retry_after_and_500_are_retried(server):
    server.script(error(429, "RESOURCE_EXHAUSTED", "quota", **{"Retry-After": "1"}),
                  error(500, "INTERNAL", "boom"),
                  Reply(body=reply_body("ok")))
    llm = make(server)
    started = time.monotonic()
    reply = await llm.generate(MESSAGES)
    await llm.close()
    assert reply.text == "ok"
    assert len(server.requests) == 3
    assert time.monotonic() - started >= 0.95


async def test_slow_reply_times_out(server):
    server.script(Reply(body=reply_body("late"), delay=5))
    llm = make(server, timeout=0.4, max_retries=0)
    with pytest.raises(LLMTimeoutError):
        await llm.generate(MESSAGES)
    await llm.close()


async def test_safety_block_is_a_refusal(server):
    server.script(Reply(body=reply_body("", finish="SAFETY")))
    llm = make(server)
    with pytest.raises(RefusalError, match="SAFETY"):
        await llm.generate(MESSAGES)
    await llm.close()


async def test_agent_run_end_to_end(server, store, db):
    answer = {"secure": True, "objective": "o", "understanding": "u", "approach": "a",
              "discoveries": "d", "response": "Gemini says hi", "actions": []}
    server.script(streamed(json.dumps(answer), prompt=90, output=22))
    llm = make(server)
    async with Agent(llm=llm, store=store) as agent:
        result = await agent.run("hello?", user_id="erin")
    await llm.close()
    assert result.stop_reason == "completed" and result.response == "Gemini says hi"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (90, 22)
    rows = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert rows == [("user", "hello?"), ("assistant", "Gemini says hi")]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)


async def test_api_version_is_chosen_by_option_or_environment(server, monkeypatch):
    server.script(Reply(body=reply_body("{}")), Reply(body=reply_body("{}")))
    llm = make(server, api_version="v1")
    await llm.generate([{"role": "user", "content": "hi"}])
    await llm.close()
    monkeypatch.setenv("GOOGLE_GENAI_API_VERSION", "v1alpha")
    llm = make(server)
    await llm.generate([{"role": "user", "content": "hi"}])
    await llm.close()
    assert [r.path.split("/")[1] for r in server.requests] == ["v1", "v1alpha"]


async def test_options_go_on_the_wire_and_what_it_cannot_honour_is_refused(server):
    server.script(Reply(body=reply_body('{"response": "a"}')),
                  Reply(body=reply_body('{"response": "b"}')))
    llm = make(server).with_options(temperature=0.4, top_p=0.7, seed=9, reasoning_effort="low")
    await llm.generate(MESSAGES)
    await llm.with_options(reasoning_effort="none").generate(MESSAGES)
    await llm.close()
    config = server.requests[0].body["generationConfig"]
    assert (config["temperature"], config["topP"], config["seed"]) == (0.4, 0.7, 9)
    # the SDK sends this object by its proto field names (the API's JSON takes both forms)
    assert config["thinkingConfig"] == {"thinking_level": "LOW"}
    assert server.requests[1].body["generationConfig"]["thinkingConfig"] == {
        "thinking_budget": 0}
    with pytest.raises(UsageError, match="Gemini's thinking levels go up to xhigh"):
        llm.with_options(reasoning_effort="max")
