"""OpenTelemetry from the real processes: `cogency serve` and the `cogency` command export over
OTLP/HTTP to a receiver in the test, which decodes what arrives (opentelemetry-proto)."""

from __future__ import annotations

import os
import re
import secrets
import signal

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the test extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

from cli_run import Cli, learned, step  # noqa: E402
from otelutil import Receiver, values  # noqa: E402
from serverutil import Server, create_key, wait_for  # noqa: E402

SERVER, CLIENT, INTERNAL = 2, 3, 1  # OTLP span kinds
SECRET_QUERY = "tool the-secret-query-e41d"


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def children(spans, parent):
    return [span for span in spans if span.parent_id == parent.span_id]


def ancestors(spans, span):
    by_id = {s.span_id: s for s in spans}
    found = []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        found.append(span)
    return found


def test_serve_continues_the_callers_trace_into_the_run_and_serves_metrics(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    db = str(tmp_path / "service.db")
    key = create_key(db, "alice")
    header, trace_id, caller_span = traceparent()
    with Receiver() as otlp:
        server = Server(db, tmp_path, "--tools", "files", "--metrics", extra_env=otlp.env())
        try:
            with server.client(key) as client:
                response = client.post("/api/runs", json={"query": SECRET_QUERY},
                                       headers={"traceparent": header})
                assert response.status_code == 200, response.text
                result = response.json()
                assert result["stop_reason"] == "completed"
                # Learning is in the background: wait until it has been exported.
                wait_for(lambda: any(s.name == "upsert_memory" for s in otlp.spans()), 20)
                scraped = client.get("/metrics")
            # No key needed for /metrics, and no label in it names a user or their data.
            with server.client() as anonymous:
                assert anonymous.get("/metrics").status_code == 200
        finally:
            assert server.stop(signal.SIGTERM) == 0  # flushes what is left
        spans = otlp.spans()
        raw = otlp.raw()
        metric_names = otlp.metric_names()
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text
    assert re.search(r'cogency_runs_total\{[^}]*cogency_stop_reason="completed"[^}]*\} 1', text)
    assert re.search(r'cogency_tool_calls_total\{[^}]*gen_ai_tool_name="file_list"', text)
    assert "gen_ai_client_operation_duration_seconds_bucket" in text
    for private in ("alice", result["task_id"], result["conversation_id"], "the-secret"):
        assert private not in text

    # The caller's trace goes on: its span parents the request's SERVER span (FastAPI's), in
    # which the run (in its own asyncio task) is, which parents its model and tool calls.
    [request] = [s for s in spans if s.kind == SERVER and s.name == "POST /api/runs"]
    assert (request.trace_id, request.parent_id) == (trace_id, caller_span)
    assert request.attributes["http.route"] == "/api/runs"
    assert request.attributes["http.response.status_code"] == 200
    assert request.service == "cogency-test"
    [run] = [s for s in spans if s.name == "invoke_agent cogency"]
    assert run.trace_id == trace_id and request in ancestors(spans, run)
    assert run.attributes["cogency.task.id"] == result["task_id"]
    assert run.attributes["gen_ai.conversation.id"] == result["conversation_id"]
    assert run.attributes["cogency.stop_reason"] == "completed"
    names = sorted(s.name for s in children(spans, run))
    assert names == ["chat scripted", "chat scripted", "execute_tool file_list"]
    assert {e[1]["db.operation.name"] for e in run.events if e[0] == "cogency.store"} == {
        "begin_task", "save", "complete_task"}
    # Learning: a trace of its own, linked to the run.
    [memory] = [s for s in spans if s.name == "upsert_memory"]
    assert memory.parent_id == "" and memory.trace_id != trace_id
    assert memory.links == [(trace_id, run.span_id)]
    # Nothing a user said or got is in what was exported (no content by default).
    assert b"the-secret-query" not in raw and b"alice" not in raw
    assert "the-secret" not in " ".join(values(spans))
    assert {"gen_ai.client.operation.duration", "cogency.runs",
            "cogency.tool.calls"} <= metric_names


def test_the_cogency_command_exports_its_runs_under_traceparent(tmp_path, db_path):
    header, trace_id, caller_span = traceparent()
    cli = Cli(tmp_path, db_path)
    with Receiver() as otlp:
        done = cli("run", "learn about me", "--user", "gus", memory=True,
                   script=[step(response="noted"), learned(goals=["tracing"])],
                   TRACEPARENT=header, **otlp.env())
        spans = otlp.spans()
    assert done.returncode == 0, done.stderr
    assert "noted" in done.stdout
    [run] = [s for s in spans if s.name == "invoke_agent cogency"]
    assert (run.trace_id, run.parent_id) == (trace_id, caller_span)
    assert run.attributes["cogency.stop_reason"] == "completed"
    [chat] = children(spans, run)
    assert chat.name == "chat scripted" and chat.kind == CLIENT
    # The command waited for learning before it exited, and exported that too.
    [memory] = [s for s in spans if s.name == "upsert_memory"]
    assert memory.links == [(trace_id, run.span_id)] and memory.kind == INTERNAL
    assert "learn about me" not in " ".join(values(spans))


def test_without_the_variables_or_with_the_sdk_disabled_the_command_exports_nothing(
        tmp_path, db_path):
    with Receiver() as otlp:
        unset = {name: "" for name in os.environ if name.startswith("OTEL_")}
        cli = Cli(tmp_path, db_path)
        done = cli("run", "hi", script=[step(response="hello")], **unset)
        assert done.returncode == 0, done.stderr
        done = cli("run", "hi", script=[step(response="hello")], **otlp.env(),
                   OTEL_SDK_DISABLED="true")
        assert done.returncode == 0, done.stderr
        # Against the same receiver, the same command with export asked does export.
        done = cli("run", "hi", script=[step(response="hello")], **otlp.env())
        assert done.returncode == 0, done.stderr
        assert [s.name for s in otlp.spans()] == ["chat scripted", "invoke_agent cogency"]


def test_a_protocol_cogency_cannot_speak_is_a_clear_error(tmp_path, db_path):
    done = Cli(tmp_path, db_path)("run", "hi", script=[step(response="hello")],
                                  OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                                  OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert done.returncode == 1
    assert done.stderr.startswith("error: OTLP protocol 'grpc': Cogency exports OTLP over HTTP")
