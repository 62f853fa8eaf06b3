"""The provider adapters against real servers, through Agent.run/stream (docs/providers.md).

llama.cpp's server (SmolLM2-135M, 4,096 tokens of context) speaks OpenAI's chat completions
and Anthropic's Messages API; LiteLLM's proxy in front of it speaks Gemini's API. One of each
serves the whole session (tests/realservers.py). Replies are kept short (small ``max_tokens``)
and greedy (``temperature=0``), so each test takes seconds. What a real server cannot be made
to do (429s, errors inside a stream, hangs) is tested against fakes in test_llm_<name>.py.
"""

from __future__ import annotations

import json

import pytest
from realservers import LITELLM_KEY, LLAMA_CONTEXT, MODEL

from cogency import Agent, tool
from cogency.agent import REFUSAL
from cogency.errors import ContextLengthError
from cogency.llm import AnthropicLLM, GeminiLLM, OpenAILLM
from cogency.reason import step_schema
from cogency.testing import ScriptedLLM

QUESTION = "What is 2 + 2?"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run(agent: Agent, query: str, **options):
    """The events of one run and its result."""
    stream = agent.stream(query, **options)
    events = [event async for event in stream]
    return events, stream.result


def assert_ended_by(step: dict, result) -> None:
    """The run ended as the model's step said: its answer, or its refusal (a 135M model's
    security verdict is noise; what is tested here is that the step was carried out)."""
    if step["secure"]:
        assert result.stop_reason == "completed", result.error
        assert result.response == step["response"]
    else:
        assert result.stop_reason == "security"
        assert result.response == (step["response"] or REFUSAL)
    assert step["actions"] == []


def of(events, kind: str) -> list:
    return [event for event in events if event.type == kind]


def streamed_text(events) -> str:
    return "".join(event.text for event in of(events, "token"))


async def long_history(store, user: str, tokens: int = 5_000) -> str:
    """A conversation whose history alone overflows the server's 4,096 tokens."""
    text = " ".join(f"fact {i} is noted." for i in range(tokens // 6))
    async with Agent(llm=ScriptedLLM([{"response": "noted"}]), store=store) as agent:
        result = await agent.run(text, user_id=user)
    return result.conversation_id


# -- OpenAI's chat completions on llama.cpp -----------------------------------------------------


def openai(llama_server: str, **options) -> OpenAILLM:
    options.setdefault("max_tokens", 200)
    options.setdefault("temperature", 0)
    return OpenAILLM(MODEL, base_url=f"{llama_server}/v1", **options)


async def test_openai_on_llama_cpp_run_stream_schema_usage(llama_server, store, db):
    llm = openai(llama_server)  # no context_window: the server is asked
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=0) as agent:
        events, result = await run(agent, QUESTION, user_id="oa")
    await llm.close()
    assert llm.context_window == LLAMA_CONTEXT  # learned from the server, not 128,000
    assert of(events, "error") == []  # no invalid reply: the grammar held it to the schema
    step = json.loads(streamed_text(events))  # the streamed tokens are the whole JSON step
    assert set(step) == set(step_schema([], True)["properties"])
    assert_ended_by(step, result)
    assert len(of(events, "token")) > 10
    assert result.usage.calls == 1 and result.usage.input_tokens > 300
    assert 10 < result.usage.output_tokens <= 200
    stored = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert stored == [("user", QUESTION), ("assistant", result.response)]


async def assert_calls_the_add_tool(llm, store, user_id: str) -> None:
    """One step through ``Agent.run``: the model calls ``add`` and gets the right sum."""
    async with Agent(llm=llm, tools=[add], store=store, max_iterations=1) as agent:
        events, result = await run(agent, "Use the add tool to add 2 and 3.", user_id=user_id)
    await llm.close()
    [action] = of(events, "action")
    [done] = of(events, "result")
    assert action.name == "add" and set(action.args) == {"a", "b"}
    assert done.ok and done.output == str(action.args["a"] + action.args["b"])
    assert result.stop_reason == "max_iterations"


async def test_openai_on_llama_cpp_calls_a_tool(llama_server, store, db):
    await assert_calls_the_add_tool(openai(llama_server), store, "ot")
    roles = [role for (role,) in db.execute("SELECT role FROM conversation_messages ORDER BY seq")]
    assert roles == ["user", "assistant", "tool"]


async def test_openai_on_llama_cpp_a_cut_off_reply_is_reasked_with_a_higher_cap(
    llama_server, store
):
    llm = openai(llama_server, max_tokens=8)
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=1) as agent:
        events, result = await run(agent, QUESTION, user_id="ol")
    await llm.close()
    errors = [event.message for event in of(events, "error")]
    caps = [8, 16]
    assert [f"cut off at the output token limit ({cap} tokens)" in message
            for message, cap in zip(errors, caps)] == [True, True], errors
    assert all("no JSON object" not in message.split("(", 2)[0] for message in errors)
    assert result.stop_reason == "invalid_response"
    assert result.usage.output_tokens == sum(caps)  # the server used each raised cap
    assert llm.max_tokens == 8  # raised for the re-asks only


async def test_openai_on_llama_cpp_a_context_400_is_mapped_then_trimmed(llama_server, store):
    conversation = await long_history(store, "oc")
    llm = openai(llama_server, context_window=100_000)  # wrong on purpose: no trim before
    with pytest.raises(ContextLengthError) as caught:
        await llm.generate([{"role": "user", "content": "word " * 6_000}])
    assert caught.value.window == LLAMA_CONTEXT  # the window the server states
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=0) as agent:
        events, result = await run(agent, QUESTION, user_id="oc",
                                   conversation_id=conversation)
    await llm.close()
    [retry] = of(events, "retry")
    assert "context window" in retry.reason and "trimming the prompt to 3,481 tokens" in \
        retry.reason
    assert result.stop_reason in ("completed", "security"), result.error
    assert result.usage.calls == 1  # the rejected call cost nothing


async def test_the_local_model_recognises_a_cut_off_reply_too(llama_server, store):
    from cogency.llm import LocalLLM
    from cogency.llm._local import default_model_path

    llm = LocalLLM(default_model_path(), n_ctx=2048, threads=1, max_tokens=8)
    # With a tool the reply is a JSON step (without one the local model answers in plain text).
    async with Agent(llm=llm, tools=[add], store=store, max_iterations=1,
                     invalid_retries=1) as agent:
        events, result = await run(agent, QUESTION, user_id="lo")
    await llm.close()
    errors = [event.message for event in of(events, "error")]
    assert "cut off at the output token limit (8 tokens)" in errors[0], errors
    assert "cut off at the output token limit (16 tokens)" in errors[1], errors
    assert result.stop_reason == "invalid_response" and result.usage.output_tokens == 24


# -- Anthropic's Messages API on llama.cpp -----------------------------------------------------


def anthropic(url: str, **options) -> AnthropicLLM:
    options.setdefault("max_tokens", 60)
    return AnthropicLLM(MODEL, base_url=url, api_key="not-needed", **options)


async def test_anthropic_on_llama_cpp_streams_text_the_schema_is_not_enforced(
    llama_server, store, caplog
):
    llm = anthropic(llama_server, temperature=0)  # temperature reaches the wire (it was a
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=0) as agent:
        events, result = await run(agent, QUESTION, user_id="an")  # TypeError before)
    await llm.close()
    text = streamed_text(events)
    assert len(of(events, "token")) > 5 and text.strip()
    # llama.cpp ignores tool_choice on /v1/messages: prose comes back, not the step tool's
    # input, and the agent says so instead of taking it for an answer
    [invalid] = of(events, "error")[:1]
    assert invalid.message.startswith("invalid reply:")
    assert result.stop_reason == "invalid_response"
    assert "ignores tool_choice, so structured output is not enforced" in caplog.text
    assert result.usage.calls == 1 and result.usage.input_tokens > 300
    assert 0 < result.usage.output_tokens <= 60


async def test_anthropic_on_llama_cpp_errors_are_mapped(llama_server, store):
    conversation = await long_history(store, "ae")
    llm = anthropic(llama_server, context_window=100_000, max_tokens=30)
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=0) as agent:
        events, result = await run(agent, QUESTION, user_id="ae",
                                   conversation_id=conversation)
    await llm.close()
    [retry] = of(events, "retry")
    assert "trimming the prompt" in retry.reason
    assert result.usage.calls == 1  # trimmed, then answered (whatever the prose)
    # a local base_url that does not answer is named, not "Anthropic"
    gone = anthropic("http://127.0.0.1:9", max_retries=0)
    async with Agent(llm=gone, store=store, llm_retries=0) as agent:
        result = await agent.run(QUESTION, user_id="ae")
    await gone.close()
    assert result.stop_reason == "error" and "http://127.0.0.1:9" in result.error


# -- Gemini's API through LiteLLM's proxy, in front of llama.cpp --------------------------------


def gemini(url: str, model: str = MODEL, **options) -> GeminiLLM:
    options.setdefault("max_tokens", 200)
    options.setdefault("temperature", 0)
    return GeminiLLM(model, base_url=url, api_key=LITELLM_KEY, **options)


async def test_gemini_through_litellm_run_stream_schema(litellm_proxy, store, db):
    llm = gemini(litellm_proxy)
    async with Agent(llm=llm, store=store, max_iterations=1, invalid_retries=0) as agent:
        events, result = await run(agent, QUESTION, user_id="ga")
    await llm.close()
    assert of(events, "error") == []
    step = json.loads(streamed_text(events))  # response_json_schema reached the grammar
    assert set(step) == set(step_schema([], True)["properties"])
    assert_ended_by(step, result)
    assert len(of(events, "token")) > 5
    assert result.usage.calls == 1
    # LiteLLM 1.106.2's Gemini stream sends usageMetadata of zeros: nothing to sum (the
    # adapter reads it: see generate() below, and test_llm_gemini.py's fake stream)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 0)
    stored = db.execute("SELECT role FROM conversation_messages ORDER BY seq").fetchall()
    assert stored == [("user",), ("assistant",)]


async def test_gemini_through_litellm_calls_a_tool(litellm_proxy, store):
    await assert_calls_the_add_tool(gemini(litellm_proxy), store, "gt")


async def test_gemini_through_litellm_usage_and_errors(litellm_proxy, store):
    llm = gemini(litellm_proxy, max_tokens=16)
    reply = await llm.generate([{"role": "user", "content": QUESTION}],
                               schema=step_schema([], True))
    assert reply.truncated  # MAX_TOKENS is recognised
    assert reply.usage.input_tokens > 5 and reply.usage.output_tokens == 16
    await llm.close()
    missing = gemini(litellm_proxy, model="no-such-model")
    async with Agent(llm=missing, store=store) as agent:
        result = await agent.run(QUESTION, user_id="ge")
    await missing.close()
    # LiteLLM answers 400 "Invalid model name": mapped to ModelNotFoundError, not retried
    assert result.stop_reason == "error"
    assert "no model 'no-such-model'" in result.error and "attempts" not in result.error
