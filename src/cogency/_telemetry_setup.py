"""The OpenTelemetry SDK for Cogency's own programs (the CLI, ``cogency serve``) from ``OTEL_*``.

A library never configures the SDK: code that uses ``Agent`` sets its own providers. The
``cogency`` command is an application, so it does, when asked by the standard variables and
only with the ``otel`` extra installed:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
  ``…_METRICS_ENDPOINT``, or ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``) set turns
  export on: traces and metrics over OTLP/HTTP (``otlp``, the default), ``console``, or
  ``none`` per signal (``console`` writes to standard error). ``OTEL_SDK_DISABLED=true``
  turns it all off.
- Everything else is the SDK's own reading of the environment: ``OTEL_SERVICE_NAME`` (default
  ``cogency``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
  ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_PROPAGATORS``…
- ``TRACEPARENT`` (and ``TRACESTATE``) in the environment make the command's spans children
  of that span: a script or CI job that traces itself sees the runs it started.
- ``cogency serve --metrics`` adds a Prometheus reader whose text ``/metrics`` serves.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError

log = logging.getLogger("cogency.telemetry")

ASKING = (
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
)
"""Variables whose presence asks the command to export telemetry."""
EXPORTERS = ("otlp", "console", "none")


@dataclass
class Telemetry:
    """What :func:`configure` set up: ``registry`` is the Prometheus registry ``/metrics``
    renders (with ``metrics=True``); :meth:`close` flushes and stops the exporters."""

    registry: Any = None
    _providers: list[Any] = field(default_factory=list)
    _context: Any = None

    def close(self) -> None:
        """Export what is pending and stop; never raises (a collector that is down is logged)."""
        if self._context is not None:
            from opentelemetry import context

            context.detach(self._context)
            self._context = None
        for provider in self._providers:
            try:
                provider.shutdown()
            except Exception as exc:  # noqa: BLE001 - exporting is best effort at exit
                log.warning("could not flush telemetry: %s: %s", type(exc).__name__, exc)
        self._providers.clear()


def configure(*, metrics: bool = False, service: str = "cogency") -> Telemetry:
    """Set the global tracer and meter providers from the ``OTEL_*`` variables (see the module
    docstring); ``metrics`` adds the Prometheus reader. Raises
    :class:`~cogency.errors.ConfigurationError` when ``metrics`` is asked without the extra, or
    for an exporter or protocol Cogency does not ship; without the extra, variables that ask
    for export get one warning and nothing else."""
    telemetry = Telemetry()
    telemetry._context = _parent_from_environment()
    environ = os.environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" and not metrics:
        return telemetry
    asked = any(environ.get(name) for name in ASKING)
    if not asked and not metrics:
        return telemetry
    try:
        from opentelemetry import metrics as metrics_api
        from opentelemetry import trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        if metrics:
            raise ConfigurationError(
                "--metrics needs the OpenTelemetry SDK: pip install 'cogency[otel]'"
            ) from exc
        log.warning("OTEL_* variables ask for telemetry, but the OpenTelemetry SDK is not "
                    "installed: pip install 'cogency[otel]' (nothing is exported)")
        return telemetry
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": service})
    traces = [] if disabled else _exporters("traces", asked)
    if traces:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        for name in traces:
            tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
        trace.set_tracer_provider(tracer_provider)
        telemetry._providers.append(tracer_provider)
    readers: list[Any] = []
    for name in [] if disabled else _exporters("metrics", asked):
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(_metric_exporter(name)))
    if metrics:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry
        except ImportError as exc:
            raise ConfigurationError(
                "--metrics needs the Prometheus exporter: pip install 'cogency[otel]'"
            ) from exc
        telemetry.registry = CollectorRegistry()
        readers.append(PrometheusMetricReader(registry=telemetry.registry))
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics_api.set_meter_provider(meter_provider)
        telemetry._providers.append(meter_provider)
    return telemetry


def _exporters(signal: str, asked: bool) -> list[str]:
    """The exporters ``OTEL_{signal}_EXPORTER`` names (``otlp`` when export was asked)."""
    value = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "").strip().lower()
    names = [part.strip() for part in value.split(",") if part.strip()] or (
        ["otlp"] if asked else [])
    for name in names:
        if name not in EXPORTERS:
            raise ConfigurationError(
                f"OTEL_{signal.upper()}_EXPORTER={name!r}: Cogency exports {signal} with "
                f"{', '.join(EXPORTERS)} (for Prometheus, `cogency serve --metrics`)"
            )
    if "otlp" in names:
        protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        if protocol.strip().lower() != "http/protobuf":
            raise ConfigurationError(
                f"OTLP protocol {protocol!r}: Cogency exports OTLP over HTTP only; set "
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (port 4318 of a collector)"
            )
    return [name for name in names if name != "none"]


def _span_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout is the command's (or MCP's)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            "OTLP export needs its exporter: pip install 'cogency[otel]'") from exc
    return OTLPSpanExporter()


def _metric_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter(out=sys.stderr)
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as exc:
        raise ConfigurationError(
            "OTLP export needs its exporter: pip install 'cogency[otel]'") from exc
    return OTLPMetricExporter()


def _parent_from_environment() -> Any:
    """Attach the span context ``TRACEPARENT`` names (if any): the token to detach, or None."""
    parent = os.environ.get("TRACEPARENT")
    if not parent:
        return None
    try:
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    carrier = {"traceparent": parent[:512]}
    if os.environ.get("TRACESTATE"):
        carrier["tracestate"] = os.environ["TRACESTATE"][:512]
    return context.attach(TraceContextTextMapPropagator().extract(carrier))
