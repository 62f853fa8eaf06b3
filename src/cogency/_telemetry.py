"""OpenTelemetry: every span, event, metric and attribute Cogency emits, and the hooks for them.

Only the OpenTelemetry *API* is used, and only once something made it worth it: ``import
cogency`` imports no OpenTelemetry module, and until an SDK tracer or meter provider is set
(``trace.set_tracer_provider``, ``metrics.set_meter_provider``, or ``cogency serve`` / the CLI
from ``OTEL_*`` variables) every hook hands back what it was given, at the cost of a dictionary
lookup or two. The providers are OpenTelemetry's own global ones (that is how an application
chooses its exporter); nothing here is configured apart from them.

Names follow the OpenTelemetry GenAI semantic conventions (development status): spans
``invoke_agent {agent}`` per run or resume, ``chat {model}`` per model call, ``execute_tool
{tool}`` per tool call (MCP ones too, with the MCP attributes), ``upsert_memory`` and
``update_memory`` per learning extraction and consolidation (new traces, *linked* to the runs
they learned from, in whatever process they run). Store round trips are events
(``cogency.store``) on the span they happen in. FastAPI traces ``cogency serve``'s requests
itself; a run is inside the span of the request that started it. Metrics:
``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``,
``gen_ai.client.operation.time_to_first_chunk``, and Cogency's ``cogency.runs``,
``cogency.tool.calls``, ``cogency.memory.pending``, ``cogency.approvals.pending``; none
carries a user, conversation or task id.

Message content (queries, answers, prompts, tool arguments and results) is recorded only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, and then redacted and cut as tool
output is. The user id is recorded as a SHA-256 pseudonym (``enduser.pseudo.id``), or not at
all with ``COGENCY_OTEL_USER_ID=omit``.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ._redact import redact_cut

T = TypeVar("T")

AGENT_NAME = "cogency"
SCOPE = "cogency"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
USER_ID_ENV = "COGENCY_OTEL_USER_ID"
"""``hash`` (the default: ``enduser.pseudo.id``, a SHA-256 pseudonym) or ``omit``."""
MAX_CONTENT_CHARS = 20_000
"""Each recorded message or tool result is cut to this (after redaction), as tool output is."""

# -- attribute names (GenAI, MCP, DB semantic conventions; ``cogency.*`` our own) -------------

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
REQUEST_STREAM = "gen_ai.request.stream"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
OUTPUT_TYPE = "gen_ai.output.type"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
TOKEN_TYPE = "gen_ai.token.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
USER_PSEUDO_ID = "enduser.pseudo.id"
MCP_METHOD = "mcp.method.name"
NETWORK_TRANSPORT = "network.transport"
DB_SYSTEM = "db.system.name"
DB_OPERATION = "db.operation.name"
TASK_ID = "cogency.task.id"
RESUMED = "cogency.resumed"
STOP_REASON = "cogency.stop_reason"
ITERATIONS = "cogency.iterations"
TOOL_STATUS = "cogency.tool.status"
MCP_SERVER = "cogency.mcp.server"
MEMORY_PHASE = "cogency.memory.phase"
RETRY_ATTEMPT = "cogency.retry.attempt"
RETRY_DELAY = "cogency.retry.delay"
STORE_DURATION = "cogency.store.duration"
APPROVAL_DECISION = "cogency.approval.decision"
APPROVAL_WAIT = "cogency.approval.wait"

# -- event names ----------------------------------------------------------------------------

RETRY_EVENT = "cogency.retry"
"""On a ``chat`` span before the provider adapter retries (on ``invoke_agent`` when the agent
asks the model again after a failed call): attempt, delay in seconds, why."""
STORE_EVENT = "cogency.store"
"""A store round trip (``begin_task``, ``save``, ``complete_task``): its duration in seconds."""
APPROVAL_REQUESTED = "cogency.approval.requested"
"""On ``invoke_agent``: a tool call now waits for a person (the run stops here)."""
APPROVAL_EVENT = "cogency.approval"
"""On ``execute_tool`` of a call that waited: approved, and how long it waited (seconds)."""
TOOL_NOT_RUN = "cogency.tool.not_run"
"""On the current span: a call that waited was denied, or was interrupted by a crash."""

# -- metric names -------------------------------------------------------------------------------

TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"
FIRST_CHUNK_DURATION = "gen_ai.client.operation.time_to_first_chunk"
RUNS = "cogency.runs"
TOOL_CALLS = "cogency.tool.calls"
MEMORY_PENDING = "cogency.memory.pending"
APPROVALS_PENDING = "cogency.approvals.pending"

_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                  16777216, 67108864)
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92)

_PROVIDERS = {"gemini": "gcp.gemini", "google": "gcp.gemini"}
"""Cogency's provider names where the conventions have another (the rest are used as they are)."""
_MEMORY_OPERATIONS = {"extraction": "upsert_memory", "consolidation": "update_memory"}

# -- whether anything is on -----------------------------------------------------------------

_tracer: Any = None
"""The tracer, once an SDK tracer provider is set (OpenTelemetry's global one)."""
_metrics: _Metrics | None = None
"""The instruments, once an SDK meter provider is set."""
_api: Any = None
"""The ``opentelemetry`` API modules, imported once something else imported OpenTelemetry."""
_named: bool | None = None
"""Whether ``OTEL_PYTHON_*_PROVIDER`` names a provider for the API to load (read once)."""


def _active() -> bool:
    """Whether a tracer or a meter provider is set; cheap when neither is.

    Nothing can have set a provider before some code imported OpenTelemetry (the SDK is set
    through the API), so while no ``opentelemetry`` module is loaded the answer is no at once;
    the ``OTEL_PYTHON_*_PROVIDER`` variables name a provider the API would load on first use.
    """
    global _named
    if _tracer is not None and _metrics is not None:
        return True
    modules = sys.modules
    if "opentelemetry.trace" not in modules and "opentelemetry.metrics" not in modules:
        if _named is None:  # read once: reading the environment costs microseconds
            _named = any(name in os.environ for name in (
                "OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"))
        if not _named:
            return _tracer is not None or _metrics is not None
    _probe()
    return _tracer is not None or _metrics is not None


def _probe() -> None:
    global _tracer, _metrics, _api
    if _api is None:
        from opentelemetry import context, metrics, trace

        _api = _Api(context, metrics, trace)
    api = _api
    # The API's own getters read the environment on every call (microseconds each, per hook);
    # its module globals say at once whether a provider was set. Where they are missing (a
    # future API), the getters decide.
    if _tracer is None and getattr(api.trace, "_TRACER_PROVIDER", api) is not None:
        tracers = api.trace.get_tracer_provider()
        if not isinstance(tracers, api.unset_tracers):
            _tracer = tracers.get_tracer(SCOPE, _version())
    if _metrics is None and getattr(api.metrics_state, "_METER_PROVIDER", api) is not None:
        meters = api.metrics.get_meter_provider()
        if type(meters).__name__ not in _UNSET_METERS:
            _metrics = _Metrics(meters.get_meter(SCOPE, _version()))


_UNSET_METERS = ("_ProxyMeterProvider", "NoOpMeterProvider")
"""The API's stand-ins until a meter provider is set (the first is private: known by name)."""


class _Api:
    """The API's modules and names, looked up once."""

    def __init__(self, context: Any, metrics: Any, trace: Any) -> None:
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode

        self.context, self.metrics, self.trace = context, metrics, trace
        self.Link, self.SpanKind, self.Status, self.StatusCode = Link, SpanKind, Status, StatusCode
        self.INVALID_SPAN = trace.INVALID_SPAN
        self.unset_tracers = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self.metrics_state = sys.modules.get("opentelemetry.metrics._internal", metrics)
        # A provider named by OTEL_PYTHON_*_PROVIDER is loaded by the API's first getter call.
        trace.get_tracer_provider()
        metrics.get_meter_provider()


class _Metrics:
    """The instruments, made once per meter provider."""

    def __init__(self, meter: Any) -> None:
        self.tokens = meter.create_histogram(
            TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self.duration = meter.create_histogram(
            OPERATION_DURATION, unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.first_chunk = meter.create_histogram(
            FIRST_CHUNK_DURATION, unit="s",
            description="Time to receive the first chunk of a streamed reply.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self.runs = meter.create_counter(
            RUNS, unit="{run}", description="Runs and resumes ended, by stop reason.")
        self.tool_calls = meter.create_counter(
            TOOL_CALLS, unit="{call}", description="Tool calls, by tool and status.")
        self.memory_pending = meter.create_up_down_counter(
            MEMORY_PENDING, unit="{task}",
            description="Background learning scheduled in this process and not finished.")
        self.approvals_pending = meter.create_up_down_counter(
            APPROVALS_PENDING, unit="{call}",
            description="Tool calls that began waiting for a person, less those settled "
                        "(+1 and -1 may come from different processes: sum over them).")


def _version() -> str:
    from . import __version__

    return __version__


_now = time.perf_counter


def _span(name: str, kind: str, attributes: dict[str, Any], **options: Any) -> Any:
    """A started span (not current), or the invalid span when only metrics are on."""
    if _tracer is None:
        return _api.INVALID_SPAN
    return _tracer.start_span(name, kind=getattr(_api.SpanKind, kind), attributes=attributes,
                              **options)


class _current:
    """``span`` is the current span within (a class: cheaper than a generator's context)."""

    __slots__ = ("context", "token")

    def __init__(self, span: Any) -> None:
        self.context = _api.trace.set_span_in_context(span)

    def __enter__(self) -> None:
        self.token = _api.context.attach(self.context)

    def __exit__(self, *exc: object) -> None:
        _api.context.detach(self.token)


def _failed(span: Any, exc: BaseException) -> str:
    """Mark ``span`` as failed by ``exc`` (without a stack trace); returns its ``error.type``."""
    kind = type(exc).__qualname__
    if span.is_recording():
        span.set_attributes({ERROR_TYPE: kind})
        span.add_event("exception", {"exception.type": kind,
                                     "exception.message": str(exc)[:1000]})
        span.set_status(_api.Status(_api.StatusCode.ERROR, f"{kind}: {str(exc)[:200]}"))
    return kind


def _capturing() -> bool:
    return os.environ.get(CONTENT_ENV, "").strip().lower() == "true"


def _text(value: Any) -> str:
    """Content as it may be recorded: redacted, and cut as tool output is."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    kept, left_out = redact_cut(text, MAX_CONTENT_CHARS)
    return kept + (f"\n…[cut: {left_out} more characters]" if left_out else "")


def _messages(role: str, text: Any, finish: str | None = None) -> str:
    message: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": _text(text)}]}
    if finish:
        message["finish_reason"] = finish
    return json.dumps([message], ensure_ascii=False)


# -- the run ------------------------------------------------------------------------------------


class _Run:
    """The run in progress (a context variable): its span, and the settings read once for it."""

    __slots__ = ("span", "conversation", "capture")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.conversation: str | None = None
        self.capture = _capturing()


def _capture() -> bool:
    """Whether content is recorded: as the run in progress read it, else as set now."""
    run = _RUN.get()
    return run.capture if run is not None else _capturing()


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("cogency_run", default=None)


def invoke_agent(llm: Any, work: Awaitable[T]) -> Awaitable[T]:
    """The run (``Agent._execute``), traced as one ``invoke_agent`` span and counted."""
    if not _active():
        return work
    return _invoke(llm, work)


async def _invoke(llm: Any, work: Awaitable[Any]) -> Any:
    provider, model = _provider(llm), _model(llm)
    attributes = {OPERATION: "invoke_agent", PROVIDER: provider, AGENT: AGENT_NAME}
    if model:
        attributes[REQUEST_MODEL] = model
    span = _span(f"invoke_agent {AGENT_NAME}", "INTERNAL", attributes)
    run = _Run(span)
    token = _RUN.set(run)
    began = _now()
    labels = {OPERATION: "invoke_agent", PROVIDER: provider}
    if model:
        labels[REQUEST_MODEL] = model
    try:
        with _current(span):
            result = await work
    except BaseException as exc:
        cancelled = isinstance(exc, asyncio.CancelledError)
        stop = "cancelled" if cancelled else "error"
        span.set_attributes({STOP_REASON: stop})
        if not cancelled:
            labels[ERROR_TYPE] = _failed(span, exc)
        span.end()
        _count_run(stop, labels, began)
        raise
    finally:
        _RUN.reset(token)
    _finish_run(span, result, labels, began, opened=run.conversation is not None)
    span.end()
    return result


def _finish_run(span: Any, result: Any, labels: dict[str, Any], began: float,
                opened: bool) -> None:
    stop = result.stop_reason
    if span.is_recording():
        ended: dict[str, Any] = {STOP_REASON: stop, ITERATIONS: result.iterations}
        if not opened:  # task_opened did not say (a stand-in agent): the result does
            ended[CONVERSATION], ended[TASK_ID] = result.conversation_id, result.task_id
        if result.usage.input_tokens or result.usage.output_tokens:
            ended[INPUT_TOKENS] = result.usage.input_tokens
            ended[OUTPUT_TOKENS] = result.usage.output_tokens
        if result.response is not None and _capture():
            ended[OUTPUT_MESSAGES] = _messages("assistant", result.response, "stop")
        for call in result.pending_approvals:
            span.add_event(APPROVAL_REQUESTED, {TOOL_NAME: call["name"],
                                                TOOL_CALL_ID: call["id"]})
        if stop in ("error", "invalid_response"):
            ended[ERROR_TYPE] = stop
            span.set_status(_api.Status(_api.StatusCode.ERROR, (result.error or stop)[:200]))
        span.set_attributes(ended)
    if stop in ("error", "invalid_response"):
        labels[ERROR_TYPE] = stop
    _count_run(stop, labels, began)
    if _metrics is not None and result.pending_approvals:
        _metrics.approvals_pending.add(len(result.pending_approvals))
        for call in result.pending_approvals:
            _metrics.tool_calls.add(1, {TOOL_NAME: call["name"],
                                        TOOL_STATUS: "awaiting_approval"})


def _count_run(stop: str, labels: dict[str, Any], began: float) -> None:
    if _metrics is not None:
        _metrics.runs.add(1, {STOP_REASON: stop, AGENT: AGENT_NAME})
        _metrics.duration.record(_now() - began, labels)


def task_opened(state: Any, resumed: bool) -> None:
    """The run's task is open: its ids (the user's as a pseudonym) and, when content is
    captured, the query."""
    run = _RUN.get()
    if run is None:
        return
    run.conversation = state.conversation.conversation_id
    span = run.span
    if not span.is_recording():
        return
    opened: dict[str, Any] = {CONVERSATION: run.conversation, TASK_ID: state.task_id,
                              RESUMED: resumed}
    if os.environ.get(USER_ID_ENV, "hash").strip().lower() != "omit":
        opened[USER_PSEUDO_ID] = pseudonym(state.user_id)
    if run.capture:
        opened[INPUT_MESSAGES] = _messages("user", state.query)
    span.set_attributes(opened)


def pseudonym(user_id: str) -> str:
    """What spans record of a user id: the first 32 hex digits of its SHA-256."""
    return hashlib.sha256(user_id.encode()).hexdigest()[:32]


# -- model calls --------------------------------------------------------------------------------


def chat(llm: Any, messages: list[dict[str, Any]], schema: dict[str, Any] | None
         ) -> AsyncIterator[Any]:
    """``llm.stream(messages, schema=schema)``, traced as one ``chat`` span."""
    if not _active():
        return llm.stream(messages, schema=schema)
    return _chat_stream(llm, messages, schema)


async def generate(llm: Any, messages: list[dict[str, Any]], schema: dict[str, Any] | None
                   ) -> Any:
    """``await llm.generate(messages, schema=schema)``, traced as one ``chat`` span."""
    if not _active():
        return await llm.generate(messages, schema=schema)
    call = _Chat(llm, messages, schema, stream=False)
    try:
        with _current(call.span):
            completion = await llm.generate(messages, schema=schema)
        call.done(completion)
        return completion
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        call.end()


async def _chat_stream(llm: Any, messages: list[dict[str, Any]], schema: dict[str, Any] | None
                       ) -> AsyncIterator[Any]:
    call = _Chat(llm, messages, schema, stream=True)
    pieces = llm.stream(messages, schema=schema).__aiter__()
    current = _current(call.span)
    try:
        while True:
            # Current only while the model works (its retries land on this span): never
            # across a yield, where the caller's code runs.
            with current:
                try:
                    piece = await pieces.__anext__()
                except StopAsyncIteration:
                    break
            if isinstance(piece, str):
                if piece:
                    call.chunk()
            else:
                call.done(piece)
            yield piece
    except GeneratorExit:  # the caller stopped reading: not the model's failure
        raise
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        call.end()
        close = getattr(pieces, "aclose", None)
        if close is not None:
            await close()


class _Chat:
    """One traced model call: its span, timing and the metrics it records when it ends."""

    __slots__ = ("span", "began", "first", "labels", "completion", "error", "capture")

    def __init__(self, llm: Any, messages: list[dict[str, Any]], schema: Any,
                 stream: bool) -> None:
        provider, model = _provider(llm), _model(llm)
        attributes: dict[str, Any] = {OPERATION: "chat", PROVIDER: provider,
                                      REQUEST_STREAM: stream}
        labels: dict[str, Any] = {OPERATION: "chat", PROVIDER: provider}
        if model:
            attributes[REQUEST_MODEL] = labels[REQUEST_MODEL] = model
        if schema is not None:
            attributes[OUTPUT_TYPE] = "json"
        for name, key in ((REQUEST_MAX_TOKENS, "max_tokens"), (REQUEST_TEMPERATURE,
                                                               "temperature")):
            value = getattr(llm, key, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attributes[name] = value
        server = _server(getattr(llm, "base_url", None))
        if server:
            attributes.update(server)
            labels.update(server)
        run = _RUN.get()
        if run is not None and run.conversation:
            attributes[CONVERSATION] = run.conversation
        self.capture = _tracer is not None and (run.capture if run is not None else _capturing())
        if self.capture:
            system = [m["content"] for m in messages if m.get("role") == "system"]
            if system:
                attributes[SYSTEM_INSTRUCTIONS] = json.dumps(
                    [{"type": "text", "content": _text(text)} for text in system],
                    ensure_ascii=False)
            attributes[INPUT_MESSAGES] = json.dumps(
                [{"role": m.get("role", "user"),
                  "parts": [{"type": "text", "content": _text(m.get("content", ""))}]}
                 for m in messages if m.get("role") != "system"], ensure_ascii=False)
        self.span = _span(f"chat {model}" if model else "chat", "CLIENT", attributes)
        self.began = _now()
        self.first: float | None = None
        self.labels = labels
        self.completion: Any = None
        self.error: str | None = None

    def chunk(self) -> None:
        if self.first is None:
            self.first = _now() - self.began

    def done(self, completion: Any) -> None:
        self.completion = completion
        model = getattr(completion, "model", None)
        if model:
            self.labels[RESPONSE_MODEL] = model
        if not self.span.is_recording():
            return
        ended: dict[str, Any] = {}
        if model:
            ended[RESPONSE_MODEL] = model
        if self.first is not None:
            ended[FIRST_CHUNK] = self.first
        usage = getattr(completion, "usage", None)
        if usage is not None and (usage.input_tokens or usage.output_tokens):
            ended[INPUT_TOKENS] = usage.input_tokens
            ended[OUTPUT_TOKENS] = usage.output_tokens
        finish = "length" if getattr(completion, "truncated", False) else "stop"
        if finish == "length":  # otherwise unknown: the adapters keep only whether it was cut
            ended[FINISH_REASONS] = (finish,)
        if self.capture:
            ended[OUTPUT_MESSAGES] = _messages("assistant", getattr(completion, "text", ""),
                                               finish)
        if ended:
            self.span.set_attributes(ended)

    def fail(self, exc: BaseException) -> None:
        self.error = _failed(self.span, exc)

    def end(self) -> None:
        self.span.end()
        if _metrics is None:
            return
        labels = self.labels
        if self.error is not None:
            labels = {**labels, ERROR_TYPE: self.error}
        _metrics.duration.record(_now() - self.began, labels)
        if self.first is not None:
            _metrics.first_chunk.record(self.first, self.labels)
        usage = getattr(self.completion, "usage", None)
        if usage is not None and (usage.input_tokens or usage.output_tokens):
            _metrics.tokens.record(usage.input_tokens, {**self.labels, TOKEN_TYPE: "input"})
            _metrics.tokens.record(usage.output_tokens, {**self.labels, TOKEN_TYPE: "output"})


def retry(attempt: int, delay: float, reason: str) -> None:
    """A model call is about to be retried: an event on the span it happens in."""
    if not _active():
        return
    span = _api.trace.get_current_span()
    if span.is_recording():
        span.add_event(RETRY_EVENT, {RETRY_ATTEMPT: attempt, RETRY_DELAY: float(delay),
                                     "exception.message": str(reason)[:1000]})


def _provider(llm: Any) -> str:
    name = getattr(llm, "provider", None)
    if not isinstance(name, str) or not name:
        name = str(getattr(llm, "name", "") or "unknown").partition(":")[0]
    name = name.lower()
    return _PROVIDERS.get(name, name)


def _model(llm: Any) -> str:
    model = getattr(llm, "model", None)
    if isinstance(model, str) and model:
        return model
    name = str(getattr(llm, "name", "") or "")
    return name.partition(":")[2] or name


_SERVERS: dict[str, dict[str, Any]] = {}


def _server(url: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a base URL (parsed once per URL)."""
    if not isinstance(url, str) or not url:
        return {}
    found = _SERVERS.get(url)
    if found is None:
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            found = {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port} if parts.hostname else {}
        except ValueError:
            found = {}
        if len(_SERVERS) < 64:
            _SERVERS[url] = found
    return found


# -- tools --------------------------------------------------------------------------------------


def execute_tool(tool: Any, call: Mapping[str, Any], work: Awaitable[T]) -> Awaitable[T]:
    """One tool call (``run_tool``'s coroutine), traced as an ``execute_tool`` span."""
    if not _active():
        return work
    return _execute(tool, call, work)


async def _execute(tool: Any, call: Mapping[str, Any], work: Awaitable[Any]) -> Any:
    name = call["name"]
    attributes: dict[str, Any] = {OPERATION: "execute_tool", TOOL_NAME: name}
    if call.get("id"):
        attributes[TOOL_CALL_ID] = str(call["id"])
    server = getattr(tool, "server", None)
    if server is not None and hasattr(server, "command"):  # an MCP server's tool
        url = getattr(server, "url", None)
        attributes[MCP_METHOD] = "tools/call"
        attributes[NETWORK_TRANSPORT] = "tcp" if url else "pipe"
        attributes[MCP_SERVER] = str(getattr(server, "name", ""))
        attributes.update(_server(url))
    capturing = _tracer is not None and _capture()
    if capturing:
        attributes[TOOL_ARGUMENTS] = _text(call.get("args") or {})
    span = _span(f"execute_tool {name}", "INTERNAL", attributes)
    stored = "status" in call  # a call that waited for a person, as the store returns it
    if stored and span.is_recording():
        waited = _seconds_between(call.get("created_at"), call.get("decided_at"))
        event: dict[str, Any] = {APPROVAL_DECISION: "approved"}
        if waited is not None:
            event[APPROVAL_WAIT] = waited
        span.add_event(APPROVAL_EVENT, event)
    began = _now()
    status, error = "error", None
    ended: dict[str, Any] = {}
    try:
        with _current(span):
            result = await work
        if result.get("ok"):
            status = "ok"
            if capturing:
                ended[TOOL_RESULT] = _text(result.get("output", ""))
        else:
            message = str(result.get("error", ""))
            status = "timeout" if message.startswith("timed out") else "error"
            error = ended[ERROR_TYPE] = "timeout" if status == "timeout" else "tool_error"
            span.set_status(_api.Status(_api.StatusCode.ERROR, message[:200]))
        return result
    except BaseException as exc:
        status = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
        error = _failed(span, exc)
        raise
    finally:
        ended[TOOL_STATUS] = status
        span.set_attributes(ended)
        span.end()
        if _metrics is not None:
            _metrics.tool_calls.add(1, {TOOL_NAME: name, TOOL_STATUS: status})
            labels = {OPERATION: "execute_tool"}
            if error:
                labels[ERROR_TYPE] = error
            _metrics.duration.record(_now() - began, labels)
            if stored:
                _metrics.approvals_pending.add(-1)


def tool_not_run(call: Mapping[str, Any], why: str) -> None:
    """A call that did not run: ``denied`` by a person or the approve policy, or
    ``interrupted`` (it was running when its process stopped)."""
    if not _active():
        return
    span = _api.trace.get_current_span()
    if span.is_recording():
        event = {TOOL_NAME: call["name"], TOOL_STATUS: why}
        if call.get("id"):
            event[TOOL_CALL_ID] = str(call["id"])
        span.add_event(TOOL_NOT_RUN, event)
    if _metrics is not None:
        _metrics.tool_calls.add(1, {TOOL_NAME: call["name"], TOOL_STATUS: why})
        if "status" in call:  # it waited for a person: settled now
            _metrics.approvals_pending.add(-1)


def _seconds_between(start: Any, end: Any) -> float | None:
    def moment(value: Any) -> datetime | None:
        if isinstance(value, datetime):
            return value
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                return None
        return None

    first, last = moment(start), moment(end)
    if first is None or last is None or (first.tzinfo is None) != (last.tzinfo is None):
        return None
    return max(0.0, (last - first).total_seconds())


# -- the store ----------------------------------------------------------------------------------


def store(operation: str, target: Any, work: Awaitable[T]) -> Awaitable[T]:
    """A store round trip (``begin_task``, ``save``, ``complete_task``): an event with its
    duration on the current span (events, not spans: a turn makes two or three)."""
    if not _active():
        return work
    return _store(operation, target, work)


async def _store(operation: str, target: Any, work: Awaitable[Any]) -> Any:
    if _tracer is None:
        return await work  # events only: nothing to record without spans
    began_ns = time.time_ns()
    began = _now()
    error = None
    try:
        return await work
    except BaseException as exc:
        error = type(exc).__qualname__
        raise
    finally:
        took = _now() - began
        system = "postgresql" if getattr(target, "dsn", None) else (
            "sqlite" if getattr(target, "path", None) is not None else "other_sql")
        labels = {DB_SYSTEM: system, DB_OPERATION: operation}
        if error:
            labels[ERROR_TYPE] = error
        span = _api.trace.get_current_span()
        if span.is_recording():
            span.add_event(STORE_EVENT, {**labels, STORE_DURATION: took}, timestamp=began_ns)


# -- learning -------------------------------------------------------------------------------


def trace_field() -> dict[str, Any]:
    """``{"trace": link}`` for what is stored to learn from this run (see :func:`trace_link`),
    or ``{}`` when nothing is traced."""
    if not _active():
        return {}
    link = trace_link()
    return {"trace": link} if link else {}


def trace_link() -> dict[str, str] | None:
    """The current run's span context as a small JSON object (W3C ``traceparent``, and
    ``tracestate`` when there is one), to link later work to it; ``None`` if none is traced.

    Store it with what is kept for later; :func:`parse_link` reads it back, in any process.
    """
    if not _active() or _tracer is None:
        return None
    run = _RUN.get()
    span = run.span if run is not None else _api.trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, _api.trace.set_span_in_context(span))
    return carrier or None


def parse_link(value: Any) -> Any:
    """The ``opentelemetry.trace.Link`` a :func:`trace_link` value stands for, or ``None``
    for anything else (a stored value is not trusted: it is checked as a header would be)."""
    if not isinstance(value, dict) or not isinstance(value.get("traceparent"), str):
        return None
    if not _active():
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {key: value[key][:512] for key in ("traceparent", "tracestate")
               if isinstance(value.get(key), str)}
    context = TraceContextTextMapPropagator().extract(carrier)
    span_context = _api.trace.get_current_span(context).get_span_context()
    return _api.Link(span_context) if span_context.is_valid else None


_LEARNING: contextvars.ContextVar[Sequence[Mapping[str, Any]]] = contextvars.ContextVar(
    "cogency_learning", default=())


@contextmanager
def learning(interactions: Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """Learning from ``interactions`` (learned together; each marked by :func:`trace_field`,
    or queued with its run's :func:`trace_link`) happens within: its spans link to each run."""
    token = _LEARNING.set(tuple(interactions))
    run = _RUN.set(None)  # learning started by a run is not part of it (it is linked)
    try:
        yield
    finally:
        _RUN.reset(run)
        _LEARNING.reset(token)


def learning_pending(task: asyncio.Task[Any] | None) -> None:
    """Background learning was scheduled: counted until it ends."""
    if task is None or not _active() or _metrics is None:
        return
    gauge = _metrics.memory_pending
    gauge.add(1)
    task.add_done_callback(lambda _: gauge.add(-1))


async def learn(llm: Any, messages: list[dict[str, Any]], schema: dict[str, Any] | None,
                phase: str) -> Any:
    """One learning model call (``phase``: ``extraction`` or ``consolidation``): a memory span,
    a new trace linked to the runs learned from, around the ``chat`` span of the call."""
    if not _active():
        return await llm.generate(messages, schema=schema)
    operation = _MEMORY_OPERATIONS[phase]
    interactions = _LEARNING.get()
    links = [link for item in interactions if (link := parse_link(item.get("trace")))]
    attributes: dict[str, Any] = {OPERATION: operation, MEMORY_PHASE: phase}
    tasks = [item["task_id"] for item in interactions if isinstance(item.get("task_id"), str)]
    if len(tasks) == 1:
        attributes[TASK_ID] = tasks[0]
    options: dict[str, Any] = {}
    if links:
        # A trace of its own (the runs may have ended long ago, in another process), linked.
        options = {"context": _api.context.Context(), "links": links}
    span = _span(operation, "INTERNAL", attributes, **options)
    began = _now()
    labels: dict[str, Any] = {OPERATION: operation}
    completion = None
    try:
        with _current(span):
            completion = await generate(llm, messages, schema)
        return completion
    except BaseException as exc:
        labels[ERROR_TYPE] = _failed(span, exc)
        raise
    finally:
        usage = getattr(completion, "usage", None)
        if usage is not None and (usage.input_tokens or usage.output_tokens):
            span.set_attributes({INPUT_TOKENS: usage.input_tokens,
                                 OUTPUT_TOKENS: usage.output_tokens})
        span.end()
        if _metrics is not None:
            _metrics.duration.record(_now() - began, labels)


__all__: Sequence[str] = (
    "chat", "execute_tool", "generate", "invoke_agent", "learn", "learning", "learning_pending",
    "parse_link", "pseudonym", "retry", "store", "task_opened", "tool_not_run", "trace_field",
    "trace_link",
)
