"""OpenTelemetry through the public API: Agent.run/resume traced into the SDK's in-memory
exporters, as an application that set its own providers would see them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the test extra is not installed")

from cli_run import TESTS, step  # noqa: E402
from fakeserver import FakeServer, Reply  # noqa: E402
from otelutil import all_metric_attributes, points, providers, values  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from cogency import Agent, Memory, tool  # noqa: E402
from cogency.errors import AuthenticationError, RateLimitError  # noqa: E402
from cogency.memory.memory import interaction_of  # noqa: E402
from cogency.storage import SQLiteStore  # noqa: E402
from cogency.testing import ScriptedLLM  # noqa: E402

QUERY = "What is the weather in Paris? marker-q-3f9a"
ANSWER = "Sunny, marker-a-8c2e."
SECRET = "sk-proj-Zx81bQ4mN7pLw2Rt9YvK3sHd"


@pytest.fixture
def spans():
    exporter, _, processor = providers()
    exporter.clear()
    processor.recording = True
    yield exporter
    processor.recording = False
    exporter.clear()


@pytest.fixture
def reader():
    return providers()[1]


def named(spans, name):
    return [span for span in spans if span.name == name]


def delta(before, after):
    """What each data point gained between two :func:`points` readings."""
    gained = {}
    for key, value in after.items():
        old = before.get(key, (0, 0) if isinstance(value, tuple) else 0)
        change = tuple(a - b for a, b in zip(value, old)) if isinstance(value, tuple) \
            else value - old
        if change not in (0, (0, 0)):
            gained[dict(key).get("gen_ai.token.type") or key] = change
    return gained


def test_cogency_imports_no_opentelemetry_and_runs_without_a_provider_at_no_cost(tmp_path):
    code = """
import asyncio, sys
import cogency
from cogency import Agent
from cogency.testing import ScriptedLLM

def loaded():
    return sorted(m for m in sys.modules if m.startswith("opentelemetry"))

async def main():
    assert loaded() == [], loaded()
    async with Agent(llm=ScriptedLLM([{"response": "one"}, {"response": "two"}]),
                     store=sys.argv[1]) as agent:
        print((await agent.run("hello")).response, loaded())
        from opentelemetry import trace  # loaded by someone, with no provider set
        print((await agent.run("again")).response)
    from cogency import _telemetry
    print(_telemetry._tracer is None and _telemetry._metrics is None)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.db")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["one []", "two", "True"]


@tool
def lookup(city: str) -> str:
    """Look the weather of a city up."""
    return f"{city}: sunny, marker-t-51d0"


async def test_a_run_is_one_invoke_agent_span_over_its_chat_and_tool_spans(
        spans, reader, db_path, db):
    runs, tools, tokens = (points(reader, "cogency.runs"), points(reader, "cogency.tool.calls"),
                           points(reader, "gen_ai.client.token.usage"))
    llm = ScriptedLLM([step(actions=[{"name": "lookup", "args": {"city": "Paris"}}]),
                       step(response=ANSWER)], count_usage=True, chunk=7)
    async with Agent(llm=llm, tools=[lookup], store=str(db_path)) as agent:
        result = await agent.run(QUERY, user_id="alice")
    assert result.response == ANSWER
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent cogency")
    chats = named(finished, "chat scripted")
    [call] = named(finished, "execute_tool lookup")
    assert len(finished) == 4 and len(chats) == 2
    # The tree: the run is a root; each model call and the tool call are its children, in order.
    assert run.parent is None and run.kind == SpanKind.INTERNAL
    for child in (*chats, call):
        assert child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    assert chats[0].end_time <= call.start_time <= call.end_time <= chats[1].start_time
    # The run: its ids (the user only as a pseudonym), why it stopped, what it cost.
    [(conversation,)] = db.execute("SELECT conversation_id FROM conversations").fetchall()
    assert conversation == result.conversation_id
    attributes = dict(run.attributes)
    assert attributes == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "cogency",
        "gen_ai.provider.name": "scripted", "gen_ai.request.model": "scripted",
        "gen_ai.conversation.id": conversation, "cogency.task.id": result.task_id,
        "cogency.resumed": False,
        "enduser.pseudo.id": hashlib.sha256(b"alice").hexdigest()[:32],
        "cogency.stop_reason": "completed", "cogency.iterations": 2,
        "gen_ai.usage.input_tokens": result.usage.input_tokens,
        "gen_ai.usage.output_tokens": result.usage.output_tokens,
    }
    assert result.usage.input_tokens > 0
    # The store's round trips, as events of the run with their time.
    stored = [(event.name, event.attributes["db.operation.name"],
               event.attributes["db.system.name"]) for event in run.events]
    assert stored == [("cogency.store", "begin_task", "sqlite"),
                      ("cogency.store", "save", "sqlite"),
                      ("cogency.store", "complete_task", "sqlite")]
    assert all(event.attributes["cogency.store.duration"] > 0 for event in run.events)
    # Each model call: CLIENT, its own usage (summing to the run's), time to the first piece.
    for chat in chats:
        assert chat.kind == SpanKind.CLIENT
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.conversation.id"] == conversation
        assert chat.attributes["gen_ai.output.type"] == "json"
        assert chat.attributes["gen_ai.request.stream"] is True
        assert 0 < chat.attributes["gen_ai.response.time_to_first_chunk"] < 5
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == \
        result.usage.input_tokens
    assert dict(call.attributes) == {"gen_ai.operation.name": "execute_tool",
                                     "gen_ai.tool.name": "lookup", "cogency.tool.status": "ok"}
    assert call.status.status_code == StatusCode.UNSET
    # No content by default: neither the query, the answer, the arguments nor the tool output.
    recorded = " ".join(values(finished))
    for marker in ("marker-q", "marker-a", "marker-t", "Paris", "alice"):
        assert marker not in recorded
    # Metrics: by stop reason, tool and status, tokens by type; never a user or task id.
    assert delta(runs, points(reader, "cogency.runs")) == {
        frozenset({("cogency.stop_reason", "completed"), ("gen_ai.agent.name", "cogency")}): 1}
    assert delta(tools, points(reader, "cogency.tool.calls")) == {
        frozenset({("gen_ai.tool.name", "lookup"), ("cogency.tool.status", "ok")}): 1}
    gained = delta(tokens, points(reader, "gen_ai.client.token.usage"))
    assert gained["input"] == (2, result.usage.input_tokens)
    assert gained["output"] == (2, result.usage.output_tokens)
    labels = json.dumps(all_metric_attributes(reader))
    for private in ("alice", result.task_id, conversation, attributes["enduser.pseudo.id"]):
        assert private not in labels


async def test_content_is_recorded_only_when_asked_and_then_redacted(
        spans, db_path, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    llm = ScriptedLLM([step(actions=[{"name": "lookup", "args": {"city": f"Paris {SECRET}"}}]),
                       step(response=ANSWER)])
    async with Agent(llm=llm, tools=[lookup], store=str(db_path)) as agent:
        await agent.run(f"{QUERY} my key is {SECRET}", user_id="alice")
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent cogency")
    [call] = named(finished, "execute_tool lookup")
    first = named(finished, "chat scripted")[0]
    [asked] = json.loads(run.attributes["gen_ai.input.messages"])
    assert asked["role"] == "user" and "marker-q" in asked["parts"][0]["content"]
    [answered] = json.loads(run.attributes["gen_ai.output.messages"])
    assert answered == {"role": "assistant", "finish_reason": "stop",
                        "parts": [{"type": "text", "content": ANSWER}]}
    sent = json.loads(first.attributes["gen_ai.input.messages"])
    assert any("marker-q" in m["parts"][0]["content"] for m in sent)
    [system] = json.loads(first.attributes["gen_ai.system_instructions"])
    assert system["type"] == "text" and "Reply with exactly one JSON object" in system["content"]
    assert "Paris" in call.attributes["gen_ai.tool.call.arguments"]
    assert "marker-t" in call.attributes["gen_ai.tool.call.result"]
    recorded = " ".join(values(finished))
    assert SECRET not in recorded and "[REDACTED]" in call.attributes["gen_ai.tool.call.arguments"]
    assert "[REDACTED]" in asked["parts"][0]["content"]
    # The user id stays a pseudonym, or is left out when asked.
    monkeypatch.setenv("COGENCY_OTEL_USER_ID", "omit")
    spans.clear()
    async with Agent(llm=ScriptedLLM([step(response="hi")]), store=str(db_path)) as agent:
        await agent.run("hello", user_id="alice")
    [run] = named(spans.get_finished_spans(), "invoke_agent cogency")
    assert "enduser.pseudo.id" not in run.attributes


@tool(needs_approval=True)
def forecast(city: str) -> str:
    """Forecast a city's weather (needs approval)."""
    return f"{city}: rain tomorrow"


async def test_approval_waits_are_events_and_the_resume_is_its_own_run(spans, reader, db_path):
    pending = points(reader, "cogency.approvals.pending")
    llm = ScriptedLLM([
        step(actions=[{"name": "forecast", "args": {"city": "Oslo"}},
                      {"name": "forecast", "args": {"city": "Rome"}}]),
        step(response="Rain in Oslo."),
    ])
    async with Agent(llm=llm, tools=[forecast], store=str(db_path)) as agent:
        paused = await agent.run("Forecast Oslo and Rome", user_id="bob")
        assert paused.stop_reason == "awaiting_approval"
        oslo, rome = paused.pending_approvals
        assert delta(pending, points(reader, "cogency.approvals.pending")) == {frozenset(): 2}
        [first] = named(spans.get_finished_spans(), "invoke_agent cogency")
        assert first.attributes["cogency.stop_reason"] == "awaiting_approval"
        assert [(e.name, dict(e.attributes)) for e in first.events
                if e.name.startswith("cogency.approval")] == [
            ("cogency.approval.requested", {"gen_ai.tool.name": "forecast",
                                            "gen_ai.tool.call.id": oslo["id"]}),
            ("cogency.approval.requested", {"gen_ai.tool.name": "forecast",
                                            "gen_ai.tool.call.id": rome["id"]})]
        assert not named(spans.get_finished_spans(), "execute_tool forecast")
        spans.clear()
        done = await agent.resume(paused.task_id, user_id="bob",
                                  approvals={oslo["id"]: True, rome["id"]: False})
    assert done.stop_reason == "completed"
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent cogency")
    assert run.parent is None and run.context.trace_id != first.context.trace_id
    assert run.attributes["cogency.resumed"] is True
    assert run.attributes["cogency.task.id"] == paused.task_id
    [call] = named(finished, "execute_tool forecast")
    assert call.parent.span_id == run.context.span_id
    assert call.attributes["gen_ai.tool.call.id"] == oslo["id"]
    [(name, approval)] = [(e.name, dict(e.attributes)) for e in call.events]
    assert name == "cogency.approval" and approval["cogency.approval.decision"] == "approved"
    assert 0 <= approval["cogency.approval.wait"] < 60
    [denied] = [dict(e.attributes) for e in run.events if e.name == "cogency.tool.not_run"]
    assert denied == {"gen_ai.tool.name": "forecast", "cogency.tool.status": "denied",
                      "gen_ai.tool.call.id": rome["id"]}
    # Both decided calls settled: the pending count is back where it was.
    assert delta(pending, points(reader, "cogency.approvals.pending")) == {}


async def test_model_failures_retries_and_tool_errors_are_statuses_and_events(
        spans, reader, db_path):
    @tool
    def broken(city: str) -> str:
        """Always fails."""
        raise RuntimeError("the weather service is down")

    llm = ScriptedLLM([RateLimitError("HTTP 429: slow down"),
                       step(actions=[{"name": "broken", "args": {"city": "Oslo"}}]),
                       step(response="It failed.")])
    errors = points(reader, "gen_ai.client.operation.duration")
    async with Agent(llm=llm, tools=[broken], store=str(db_path), retry_delay=0) as agent:
        result = await agent.run("weather?", user_id="carol")
    assert result.stop_reason == "completed"
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent cogency")
    failed, *fine = named(finished, "chat scripted")
    assert failed.status.status_code == StatusCode.ERROR and len(fine) == 2
    assert failed.attributes["error.type"] == "RateLimitError"
    assert [e.name for e in failed.events] == ["exception"]
    # The agent asked again: a retry event on the run, between the two calls.
    [retry] = [e for e in run.events if e.name == "cogency.retry"]
    assert retry.attributes["cogency.retry.attempt"] == 1
    assert "RateLimitError" in retry.attributes["exception.message"]
    assert failed.end_time <= retry.timestamp <= fine[0].start_time
    [call] = named(finished, "execute_tool broken")
    assert call.status.status_code == StatusCode.ERROR
    assert call.attributes["error.type"] == "tool_error"
    assert call.attributes["cogency.tool.status"] == "error"
    gained = delta(errors, points(reader, "gen_ai.client.operation.duration"))
    assert [count for key, (count, _) in gained.items()
            if ("error.type", "RateLimitError") in key] == [1]
    # A failure the run cannot get past: the run's span says so.
    spans.clear()
    async with Agent(llm=ScriptedLLM([AuthenticationError("bad key")]), store=str(db_path),
                     retry_delay=0) as agent:
        result = await agent.run("weather?", user_id="carol")
    assert result.stop_reason == "error"
    [run] = named(spans.get_finished_spans(), "invoke_agent cogency")
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes["cogency.stop_reason"] == "error"
    assert run.attributes["error.type"] == "error"


LEARNED = {"preferences": [], "goals": ["learn rust"], "expertise": [],
           "communication_style": "", "project_context": [], "interests": [],
           "constraints": [], "success_pattern": "", "failure_pattern": ""}
CONSOLIDATED = {"preferences": [], "goals": ["learn rust"], "expertise_areas": [],
                "communication_style": "", "projects": [], "interests": [], "constraints": [],
                "success_patterns": [], "failure_patterns": []}


async def test_learning_is_a_new_trace_linked_to_the_run_even_from_stored_json(
        spans, reader, db_path, db):
    learned, release = LEARNED, asyncio.Event()

    async def extraction(messages):
        await release.wait()  # held: the learning is pending meanwhile
        return learned

    pending = points(reader, "cogency.memory.pending")
    learner = ScriptedLLM([extraction, CONSOLIDATED], count_usage=True)
    async with Agent(llm=ScriptedLLM([step(response="ok")]), store=str(db_path),
                     memory=Memory(llm=learner, synthesis_threshold=1)) as agent:
        result = await agent.run("I want to learn Rust", user_id="dana")
        assert delta(pending, points(reader, "cogency.memory.pending")) == {frozenset(): 1}
        release.set()
        await agent.memory.settle()
        assert delta(pending, points(reader, "cogency.memory.pending")) == {}
    [(stored,)] = db.execute("SELECT profile_data FROM user_profiles WHERE user_id = 'dana'")
    assert json.loads(stored)["synthesis_version"] == 2  # learned, then consolidated
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent cogency")
    # Extraction, then consolidation: each a trace of its own, linked to the run, each with
    # its model call (and that call's usage) inside.
    for operation, phase in (("upsert_memory", "extraction"), ("update_memory", "consolidation")):
        [memory] = named(finished, operation)
        [chat] = [s for s in named(finished, "chat scripted") if s.parent and
                  s.parent.span_id == memory.context.span_id]
        assert memory.parent is None and memory.context.trace_id != run.context.trace_id
        [link] = memory.links
        assert (link.context.trace_id, link.context.span_id) == (
            run.context.trace_id, run.context.span_id)
        assert memory.attributes["gen_ai.operation.name"] == operation
        assert memory.attributes["cogency.memory.phase"] == phase
        assert memory.attributes["cogency.task.id"] == result.task_id
        assert memory.attributes["gen_ai.usage.input_tokens"] == \
            chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.request.stream"] is False

    # Learned later, in another process: the task queued at completion keeps the run's link
    # as JSON in the store, and learning it there (a fresh Memory on its own store, later,
    # after this process gave up) links to that run.
    gate = asyncio.Event()

    async def stuck(messages):
        await gate.wait()  # never answers: this process ends before it learns

    spans.clear()
    async with Agent(llm=ScriptedLLM([step(response="ok")]), store=str(db_path),
                     memory=Memory(llm=ScriptedLLM([stuck]), settle_timeout=0)) as agent:
        result = await agent.run("remember me", user_id="erin")
    [run] = named(spans.get_finished_spans(), "invoke_agent cogency")
    # Queued, or claimed by the learning this process cancelled (then free to take).
    [(tasks, claimed)] = db.execute(
        "SELECT tasks, claimed FROM learning_queue WHERE user_id = 'erin'")
    [queued] = json.loads(tasks) + json.loads(claimed)
    assert queued["task_id"] == result.task_id and set(queued["trace"]) == {"traceparent"}
    assert queued["trace"]["traceparent"] == (
        f"00-{run.context.trace_id:032x}-{run.context.span_id:016x}-"
        f"{run.context.trace_flags:02x}")

    async def later():
        store = SQLiteStore(db_path)
        memory = Memory(store=store, llm=ScriptedLLM([LEARNED, CONSOLIDATED]))
        try:
            assert await memory.catch_up() == 1
            assert await memory.settle()
        finally:
            await memory.close()
            await store.close()

    spans.clear()
    await asyncio.create_task(later())
    [memory] = named(spans.get_finished_spans(), "upsert_memory")
    assert [(link.context.trace_id, link.context.span_id) for link in memory.links] == [
        (run.context.trace_id, run.context.span_id)]
    assert memory.attributes["cogency.task.id"] == result.task_id
    assert db.execute("SELECT COUNT(*) FROM learning_queue").fetchone() == (0,)
    # A stored value is not trusted: anything but a valid traceparent links nowhere.
    for hostile in ({"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"},
                    {"traceparent": "x" * 100_000}, {"traceparent": 7}, "00-abc", None):
        stamp = "2000-01-01T00:00:00+00:00"
        db.execute("INSERT INTO learning_queue (user_id, tasks, next_attempt_at, created_at, "
                   "updated_at) VALUES ('erin', ?, ?, ?, ?)",
                   (json.dumps([{**queued, "trace": hostile}]), stamp, stamp, stamp))
        db.commit()
        spans.clear()
        await later()
        [memory] = named(spans.get_finished_spans(), "upsert_memory")
        assert memory.links == ()


async def test_tasks_learned_together_link_to_each_of_their_runs(spans, db_path):
    gate = asyncio.Event()

    async def stuck(messages):
        await gate.wait()  # this process ends before it learns: both tasks stay queued

    async with Agent(llm=ScriptedLLM([step(response="a"), step(response="b")]),
                     store=str(db_path),
                     memory=Memory(llm=ScriptedLLM([stuck]), settle_timeout=0)) as agent:
        await agent.run("I like tea", user_id="fay")
        await agent.run("I like maps", user_id="fay")
    runs = named(spans.get_finished_spans(), "invoke_agent cogency")
    assert len(runs) == 2
    spans.clear()
    store = SQLiteStore(db_path)
    memory = Memory(store=store, llm=ScriptedLLM([LEARNED, CONSOLIDATED]))
    try:
        assert await memory.catch_up() == 1 and await memory.settle()
    finally:
        await memory.close()
        await store.close()
    [learned] = named(spans.get_finished_spans(), "upsert_memory")
    assert sorted((link.context.trace_id, link.context.span_id) for link in learned.links) \
        == sorted((run.context.trace_id, run.context.span_id) for run in runs)
    assert "cogency.task.id" not in learned.attributes  # two tasks: the links name the runs


def test_interaction_of_adds_nothing_when_nothing_is_traced():
    class State:  # the fields interaction_of reads
        task_id, query = "t", "q"

        class conversation:  # noqa: N801
            conversation_id = "c"

        class execution:  # noqa: N801
            messages, response, stop_reason = [], "r", "completed"

    assert "trace" not in interaction_of(State())  # type: ignore[arg-type]


async def test_a_provider_call_records_response_model_usage_server_and_its_retries(
        spans, db_path):
    pytest.importorskip("openai")
    from cogency.llm import OpenAILLM

    answer = json.dumps({"secure": True, "objective": "o", "understanding": "", "approach": "",
                         "discoveries": "", "response": "fine", "actions": []})

    def chunk(data):
        return f"data: {json.dumps(data)}\n\n"

    body = {"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "test-model-2026-01-01"}
    events = [chunk({**body, "choices": [{"index": 0, "delta": {"content": answer[i:i + 9]},
                                          "finish_reason": None}]})
              for i in range(0, len(answer), 9)]
    events += [chunk({**body, "choices": [], "usage": {"prompt_tokens": 40,
                                                       "completion_tokens": 12,
                                                       "total_tokens": 52}}), "data: [DONE]\n\n"]
    with FakeServer() as server:
        server.script(Reply(429, {"error": {"message": "slow down"}}), Reply(events=events))
        llm = OpenAILLM("test-model", base_url=server.url + "/v1", api_key="sk-test",
                        retry_delay=0.01, context_window=128_000)
        async with Agent(llm=llm, store=str(db_path)) as agent:
            result = await agent.run("hi", user_id="eve")
        await llm.close()
        port = int(server.url.rsplit(":", 1)[1])
    assert result.response == "fine"
    [run] = named(spans.get_finished_spans(), "invoke_agent cogency")
    [chat] = named(spans.get_finished_spans(), "chat test-model")
    assert chat.parent.span_id == run.context.span_id
    assert {key: chat.attributes[key] for key in (
        "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "server.address",
        "server.port")} == {
        "gen_ai.provider.name": "openai", "gen_ai.request.model": "test-model",
        "gen_ai.response.model": "test-model-2026-01-01", "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 12, "server.address": "127.0.0.1", "server.port": port}
    # The adapter's retry happened inside the one logical call: an event of its span.
    [retry] = chat.events
    assert retry.name == "cogency.retry" and "429" in retry.attributes["exception.message"]
    assert chat.status.status_code == StatusCode.UNSET
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] > 0


async def test_mcp_tool_calls_carry_the_mcp_attributes(spans, db_path):
    pytest.importorskip("mcp")
    from cogency.tools import MCPServer

    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], name="stub", trusted=True,
                     start_timeout=20)
    llm = ScriptedLLM([step(actions=[{"name": "say", "args": {"text": "hello"}}]),
                       step(response="said")])
    async with Agent(llm=llm, tools=[stub], store=str(db_path)) as agent:
        result = await agent.run("say hello", user_id="fay")
    assert result.stop_reason == "completed"
    finished = spans.get_finished_spans()
    [call] = named(finished, "execute_tool say")
    assert {key: call.attributes[key] for key in (
        "gen_ai.tool.name", "mcp.method.name", "network.transport", "cogency.mcp.server",
        "cogency.tool.status")} == {
        "gen_ai.tool.name": "say", "mcp.method.name": "tools/call", "network.transport": "pipe",
        "cogency.mcp.server": "stub", "cogency.tool.status": "ok"}
    # What the MCP SDK traces of the call itself happens inside it.
    inside = [s for s in finished if s.parent and s.parent.span_id == call.context.span_id]
    assert all(s.context.trace_id == call.context.trace_id for s in inside)
