"""OpenTelemetry test support: the SDK's in-memory exporters, and an OTLP/HTTP receiver.

OpenTelemetry's providers are global and set once per process, as an application sets them:
:func:`providers` sets an SDK tracer provider (spans into an ``InMemorySpanExporter``, while a
test records) and meter provider (an ``InMemoryMetricReader``) the first time it is called.

:class:`Receiver` is a collector stand-in on 127.0.0.1 for processes that export over
OTLP/HTTP (``cogency serve``, the CLI): it decodes what it receives with opentelemetry-proto.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Recording(SimpleSpanProcessor):
    """Exports only while a test records: other tests of the session pay no memory for it."""

    recording = False

    def on_end(self, span: Any) -> None:
        if self.recording:
            super().on_end(span)


_SET: tuple[InMemorySpanExporter, InMemoryMetricReader, _Recording] | None = None


def providers() -> tuple[InMemorySpanExporter, InMemoryMetricReader, _Recording]:
    global _SET
    if _SET is None:
        exporter = InMemorySpanExporter()
        processor = _Recording(exporter)
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _SET = (exporter, reader, processor)
    return _SET


def points(reader: InMemoryMetricReader, name: str) -> dict[frozenset[Any], Any]:
    """The data points of metric ``name`` by attribute set: a sum's value, a histogram's
    (count, sum) (cumulative since the process began)."""
    found: dict[frozenset[Any], Any] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    key = frozenset(point.attributes.items())
                    found[key] = (point.count, point.sum) if hasattr(point, "count") else \
                        point.value
    return found


def all_metric_attributes(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    return [dict(point.attributes)
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points]


# -- a collector on loopback ---------------------------------------------------------------------


@dataclass
class Span:
    """A span as OTLP carries it, decoded (ids as hex, attributes as Python values)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    status: int
    scope: str
    service: str


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class Receiver:
    """``with Receiver() as otlp: … otlp.url …; otlp.spans()``: an OTLP/HTTP endpoint."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {"/v1/traces": [], "/v1/metrics": [],
                                               "/v1/logs": []}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.bodies.setdefault(self.path, []).append(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The variables that make a ``cogency`` process export here, quickly."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
                "OTEL_METRIC_EXPORT_INTERVAL": "200", "OTEL_SERVICE_NAME": "cogency-test"}

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def raw(self) -> bytes:
        with self._lock:
            return b"".join(b for bodies in self.bodies.values() for b in bodies)

    def spans(self) -> list[Span]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        with self._lock:
            bodies = list(self.bodies["/v1/traces"])
        found = []
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                service = str(_attributes(resource.resource.attributes).get("service.name"))
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found.append(Span(
                            name=span.name, trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                            kind=span.kind, attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            links=[(link.trace_id.hex(), link.span_id.hex())
                                   for link in span.links],
                            status=span.status.code, scope=scope.scope.name, service=service,
                        ))
        return found

    def metric_names(self) -> set[str]:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        with self._lock:
            bodies = list(self.bodies["/v1/metrics"])
        names = set()
        for body in bodies:
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    names.update(metric.name for metric in scope.metrics)
        return names


def values(spans: Any) -> Iterator[str]:
    """Every attribute and event value of ``spans`` (SDK or decoded), as text."""
    for span in spans:
        attributes = dict(span.attributes or {})
        events = [(name, dict(attrs)) for name, attrs in span.events] if isinstance(
            span, Span) else [(event.name, dict(event.attributes or {})) for event in span.events]
        for value in attributes.values():
            yield json.dumps(value, default=str)
        for _, event in events:
            for value in event.values():
                yield json.dumps(value, default=str)
