"""What OpenTelemetry costs a turn: no provider set, and the SDK with in-memory exporters.

The same durable turns (a ScriptedLLM that answers at once, SQLite, the conversation carried
from turn to turn) are timed in three modes, side by side in one run:

- ``bare``: the telemetry hooks replaced by pass-throughs (the code as if uninstrumented);
- ``no provider``: the real hooks, OpenTelemetry imported (as FastAPI, the Anthropic SDK or
  MCP import it) but no provider set: every hook finds nothing to do;
- ``in-memory``: the OpenTelemetry SDK set up as a test or an application would, spans into
  an ``InMemorySpanExporter`` (``SimpleSpanProcessor``: exported as each span ends) and
  metrics into an ``InMemoryMetricReader``.

Providers are global and set once per process, so each comparison runs in its own worker
process against ``bare`` in that same process: turns alternate between the two modes one by
one (each mode its own agent, database file and conversation), so a burst of load on the
machine hits both alike, and the ratio of the medians is reported, in wall time and in the
process's CPU time (all threads), for a one-step turn (one model call), a tool-call turn
(two model calls and a tool) and a one-step turn whose model takes 20 ms. Goals: ``no
provider`` <= 1.02, ``in-memory`` <= 1.10.

``SDK floor``: the CPU time of the OpenTelemetry SDK operations such a turn records (its spans,
events and metric points, with the same attributes), made directly in the same process between
the turns: what any instrumentation recording as much pays, whoever wrote it. ``+CPU/turn``
less the floor is what Cogency's hooks add on top. ``calls``: Python function calls per turn
(cProfile, bare > mode), deterministic where time is not on a busy machine (the C work of
SQLite and tiktoken is not counted), and the floor's.

    python -m bench.bench_otel            # 600 turns per mode and kind
    python -m bench.bench_otel --quick    # 160
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ANSWER = {
    "secure": True, "objective": "answer the question", "understanding": "a simple question",
    "approach": "answer directly", "discoveries": "", "response": "Here is the answer.",
    "actions": [],
}
TOOL_STEP = {**ANSWER, "response": None, "actions": [{"name": "echo", "args": {"text": "hi"}}]}
QUESTION = "What is the capital of France, and why is it the capital? Answer briefly."
KINDS = ("one-step", "tool-call", "20ms-model")
"""A turn of one model call, of two calls and a tool, and of one call to a model that takes
20 ms (still faster than any hosted model) to show the overhead against a model's time."""


def bare_hooks() -> Callable[[bool], None]:
    """A switch between the real telemetry hooks and pass-throughs."""
    from cogency import _telemetry

    real = {name: getattr(_telemetry, name) for name in (
        "invoke_agent", "task_opened", "chat", "execute_tool", "store", "retry", "trace_field")}
    passes: dict[str, Any] = {
        "invoke_agent": lambda llm, work: work,
        "task_opened": lambda state, resumed: None,
        "chat": lambda llm, messages, schema: llm.stream(messages, schema=schema),
        "execute_tool": lambda tool, call, work: work,
        "store": lambda operation, target, work: work,
        "retry": lambda attempt, delay, reason: None,
        "trace_field": lambda: {},
    }

    def use(bare: bool) -> None:
        for name, hook in (passes if bare else real).items():
            setattr(_telemetry, name, hook)

    return use


def sdk_floor() -> Callable[[str], None]:
    """The OpenTelemetry SDK operations a traced turn of each kind makes, done directly: the
    least any instrumentation recording the same spans, events and metrics pays."""
    from opentelemetry import context, metrics, trace

    tracer = trace.get_tracer("bench-floor")
    meter = metrics.get_meter("bench-floor")
    duration = meter.create_histogram("floor.duration", unit="s")
    counter = meter.create_counter("floor.count")
    run_attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "x",
                      "gen_ai.agent.name": "cogency", "gen_ai.request.model": "x"}
    chat_attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "x",
                       "gen_ai.request.stream": True, "gen_ai.request.model": "x",
                       "gen_ai.output.type": "json", "gen_ai.conversation.id": "c"}
    labels = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "x",
              "gen_ai.request.model": "x"}

    def turn(kind: str) -> None:
        run = tracer.start_span("invoke_agent cogency", attributes=run_attributes)
        token = context.attach(trace.set_span_in_context(run))
        run.set_attributes({"gen_ai.conversation.id": "c", "cogency.task.id": "t",
                            "cogency.resumed": False, "enduser.pseudo.id": "p"})
        for operation in ("begin_task", *(("save",) if kind == "tool-call" else ()),
                          "complete_task"):
            run.add_event("cogency.store", {"db.system.name": "sqlite",
                                            "db.operation.name": operation,
                                            "cogency.store.duration": 0.001})
        for call in range(2 if kind == "tool-call" else 1):  # (the 20 ms model: one call)
            chat = tracer.start_span("chat x", attributes=chat_attributes)
            chat.end()
            duration.record(0.001, labels)
            if kind == "tool-call" and call == 0:
                tool = tracer.start_span("execute_tool echo", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "echo"})
                tool.set_attributes({"cogency.tool.status": "ok"})
                tool.end()
                counter.add(1, {"gen_ai.tool.name": "echo", "cogency.tool.status": "ok"})
                duration.record(0.001, {"gen_ai.operation.name": "execute_tool"})
        run.set_attributes({"cogency.stop_reason": "completed", "cogency.iterations": 1,
                            "gen_ai.conversation.id": "c", "cogency.task.id": "t"})
        context.detach(token)
        run.end()
        counter.add(1, {"cogency.stop_reason": "completed", "gen_ai.agent.name": "cogency"})
        duration.record(0.001, run_attributes)

    return turn


def set_in_memory_providers() -> Callable[[], None]:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return exporter.clear


async def worker(mode: str, batches: int, per_batch: int, tmp: Path) -> dict[str, Any]:
    """Alternate batches of turns between ``bare`` and ``mode``; per-turn wall and CPU times."""
    import opentelemetry.trace  # noqa: F401 - loaded, as in a process that serves HTTP

    from cogency import Agent, tool
    from cogency.storage import SQLiteStore
    from cogency.testing import ScriptedLLM

    clear = set_in_memory_providers() if mode == "in-memory" else (lambda: None)
    use = bare_hooks()

    @tool
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    agents: dict[tuple[str, str], Any] = {}
    conversations: dict[tuple[str, str], str | None] = {}
    for variant, kind in itertools.product(("bare", mode), KINDS):
        script = itertools.cycle([TOOL_STEP, ANSWER] if kind == "tool-call" else [ANSWER])
        store = SQLiteStore(tmp / f"{mode}-{variant}-{kind}.db")
        llm = ScriptedLLM(script, delay=0.02 if kind == "20ms-model" else 0.0)
        agents[variant, kind] = Agent(llm=llm, tools=[echo], store=store)
        conversations[variant, kind] = None
    times: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        key: ([], []) for key in [*agents, *(("floor", kind) for kind in KINDS)]}
    floor = sdk_floor() if mode == "in-memory" else None

    async def turn(variant: str, kind: str, record: bool) -> None:
        use(variant == "bare")
        agent = agents[variant, kind]
        wall, cpu = time.perf_counter(), time.process_time()
        result = await agent.run(QUESTION, conversation_id=conversations[variant, kind])
        if record:
            times[variant, kind][0].append(time.perf_counter() - wall)
            times[variant, kind][1].append(time.process_time() - cpu)
        conversations[variant, kind] = result.conversation_id
        agent.llm.calls.clear()

    for variant, kind in agents:  # warm up: imports, files, the history window filling
        for _ in range(30):
            await turn(variant, kind, record=False)
    for batch in range(batches):
        for kind in KINDS:
            for step in range(per_batch):
                # Turn by turn, the order flipping each pair: a burst of load on the machine
                # hits both modes alike.
                order = ("bare", mode) if (batch + step) % 2 == 0 else (mode, "bare")
                for variant in order:
                    await turn(variant, kind, record=True)
                if floor is not None:
                    wall, cpu = time.perf_counter(), time.process_time()
                    floor(kind)
                    times["floor", kind][0].append(time.perf_counter() - wall)
                    times["floor", kind][1].append(time.process_time() - cpu)
        clear()
    # Python function calls per turn: what time measures, but deterministic, so it is the
    # same on a busy machine (C work, SQLite's and tiktoken's, is not counted).
    calls: dict[tuple[str, str], float] = {}
    for variant, kind in agents:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            await turn(variant, kind, record=False)
        profile.disable()
        calls[variant, kind] = pstats.Stats(profile).total_calls / 20  # type: ignore[attr-defined]
        clear()
    if floor is not None:
        for kind in KINDS:
            profile = cProfile.Profile()
            profile.enable()
            floor(kind)
            profile.disable()
            calls["floor", kind] = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
        clear()
    for agent in agents.values():
        await agent.close()
        await agent.store.close()
    report: dict[str, Any] = {"mode": mode}
    for kind in KINDS:
        base, measured = times["bare", kind], times[mode, kind]
        report[kind] = {
            "bare_ms": statistics.median(base[0]) * 1000,
            "mode_ms": statistics.median(measured[0]) * 1000,
            "wall_ratio": statistics.median(measured[0]) / statistics.median(base[0]),
            "cpu_ratio": statistics.median(measured[1]) / statistics.median(base[1]),
            "added_cpu_us": (statistics.median(measured[1]) - statistics.median(base[1])) * 1e6,
            "turns": len(measured[0]),
            "bare_calls": calls["bare", kind],
            "mode_calls": calls[mode, kind],
        }
        if floor is not None:
            report[kind]["floor_cpu_us"] = statistics.median(times["floor", kind][1]) * 1e6
            report[kind]["floor_calls"] = calls["floor", kind]
    return report


GOALS = {"no provider": 1.02, "in-memory": 1.10}


def main(quick: bool) -> None:
    batches, per_batch = (8, 20) if quick else (30, 20)
    print(f"per-turn time over {batches * per_batch} turns of each mode and kind, alternating "
          "turn by turn with `bare` (medians; each mode in its own process)")
    print(f"{'mode':<12} {'turn':<10} {'bare':>9} {'mode':>9} {'wall ×':>8} {'CPU ×':>8} "
          f"{'+CPU/turn':>10} {'SDK floor':>10} {'calls':>11} {'×':>6} {'floor':>6}  "
          "goal (wall)")
    for mode in ("no provider", "in-memory"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.bench_otel", "--worker", mode,
             "--batches", str(batches), "--per-batch", str(per_batch)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the {mode} worker failed:\n{done.stderr}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        for kind in KINDS:
            row = report[kind]
            met = "met" if row["wall_ratio"] <= GOALS[mode] else "NOT met"
            floor_us = f"{row['floor_cpu_us']:>7.0f} us" if "floor_cpu_us" in row else f"{'':>10}"
            floor_calls = f"{row['floor_calls']:>6.0f}" if "floor_calls" in row else f"{'':>6}"
            print(f"{mode:<12} {kind:<10} {row['bare_ms']:>6.3f} ms {row['mode_ms']:>6.3f} ms "
                  f"{row['wall_ratio']:>8.3f} {row['cpu_ratio']:>8.3f} "
                  f"{row['added_cpu_us']:>7.0f} us {floor_us} "
                  f"{row['bare_calls']:>5.0f}>{row['mode_calls']:<5.0f} "
                  f"{row['mode_calls'] / row['bare_calls']:>6.3f} {floor_calls}  "
                  f"<= {GOALS[mode]:.2f} {met}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    parser.add_argument("--worker", choices=tuple(GOALS), help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=30, help=argparse.SUPPRESS)
    parser.add_argument("--per-batch", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with tempfile.TemporaryDirectory() as tmp:
            work: Awaitable[dict[str, Any]] = worker(args.worker, args.batches, args.per_batch,
                                                     Path(tmp))
            print(json.dumps(asyncio.run(work)))  # type: ignore[arg-type]
        return
    main(args.quick)


if __name__ == "__main__":
    cli()
