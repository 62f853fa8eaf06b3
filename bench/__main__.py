"""``python -m bench``: Cogency side by side with LangGraph, Agno and the OpenAI Agents SDK.

Every case runs in a fresh process (``python -m bench.peers.<framework> CASE ...``) with
telemetry off, the same scripted replies and the same message texts; this runner collects the
JSON lines they print and writes a Markdown table with ratios to Cogency
(``docs/benchmarks.md``) and a plot of per-turn time against turn number
(``docs/benchmarks-per-turn.png``). It installs nothing: a framework that is not installed is
skipped with the command that installs it. ``--quick`` runs every case briefly (under a
minute) and writes files only when ``--output``/``--plot`` are given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers._harness import RESULT_PREFIX, TELEMETRY_OFF, percentile

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("cogency", "langgraph", "agno", "openai_agents")
LABELS = {
    "cogency": "Cogency", "langgraph": "LangGraph", "agno": "Agno",
    "openai_agents": "OpenAI Agents SDK",
}
CHECKPOINTS = (10, 100, 1000)
INSTALL = (
    "python -m venv ~/.cache/cogency-bench-peers && ~/.cache/cogency-bench-peers/bin/pip "
    "install -r bench/requirements-peers.txt && ~/.cache/cogency-bench-peers/bin/pip install "
    "-e '.[serve]' ; then run ~/.cache/cogency-bench-peers/bin/python -m bench"
)


@dataclass(frozen=True)
class Plan:
    """How many times each case runs: ``(repeat, warmup)``; ``long`` is in turns."""

    imports: int
    construct: tuple[int, int]
    construct_mem: tuple[int, int]
    one_step: tuple[int, int]
    tool_call: tuple[int, int]
    durable: tuple[int, int]
    durable_turns: int
    long: int
    one_process: bool
    """Quick mode runs a framework's cases in one process to save start-up time."""
    first: int = 11
    """Fresh processes per framework and setting, each to its first durable answer."""
    fsync_turns: tuple[int, int] = (5, 305)
    """Two conversation lengths run under strace: fsyncs per turn is their difference's. The
    300 turns between them hold two of Cogency's checkpoints (one per ~150 turns, at 4 MiB of
    log), so their flushes count at their share; a span that held one or none, as it fell,
    would make the share look larger or smaller than it is."""
    replay_turns: int = 300
    """Turns of ``bench.replay`` per setting: enough that a slow second of the machine is a
    small share of them. (One full run's 60 turns gave 1.59× at FULL where separate runs
    minutes later gave 1.43–1.46× at 60 turns and 1.45–1.46× at 300.)"""
    service: tuple[int, int] = (10, 10)
    """HTTP service against Agent.run: rounds, and runs per client in each round."""
    flush: tuple[int, int, int] = (5, 300, 1000)
    """``bench.bench_flush``: rounds, operations per way in each, and the turns whose flushes
    it follows (where each ran)."""


FULL = Plan(11, (300, 30), (10, 2), (200, 20), (200, 20), (12, 2), 25, 1000, False)
QUICK = Plan(2, (50, 5), (3, 1), (20, 3), (20, 3), (3, 1), 25, 100, True, first=1,
             fsync_turns=(2, 6), replay_turns=12, service=(1, 3), flush=(1, 20, 50))
SETTINGS = ("full", "normal")
"""Every durable case runs at both, each framework's connections set alike (read back)."""


# -- running the cases ---------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {**os.environ, **TELEMETRY_OFF}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _adapter(name: str) -> Any:
    return importlib.import_module(f"bench.peers.{name}")


def missing(name: str) -> list[str]:
    """The distributions ``name`` needs that are not installed (nothing is imported)."""
    gone = []
    for dist in _adapter(name).DISTRIBUTIONS:
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            gone.append(dist)
    return gone


def versions(name: str) -> dict[str, str]:
    return {dist: importlib.metadata.version(dist) for dist in _adapter(name).DISTRIBUTIONS}


def run_cases(name: str, specs: list[str], turns: int, log: Any, synchronous: str = "normal"
              ) -> list[dict[str, Any]]:
    """Run ``specs`` in one fresh process of framework ``name``; its JSON results."""
    command = [sys.executable, "-m", f"bench.peers.{name}", *specs, "--turns", str(turns),
               "--synchronous", synchronous]
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    results = [
        json.loads(line[len(RESULT_PREFIX):])
        for line in done.stdout.splitlines()
        if line.startswith(RESULT_PREFIX)
    ]
    if done.returncode != 0 or len(results) != len(specs):
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise RuntimeError(
            f"{name} {' '.join(specs)} failed (exit {done.returncode}):\n" + "\n".join(tail)
        )
    log(f"  {name:<14} {' '.join(specs):<40} {synchronous:<7}"
        f"{time.perf_counter() - start:6.1f} s")
    return results


def measure_imports(
    names: list[str], repeat: int, log: Any, warm: bool = True
) -> dict[str, dict[str, Any]]:
    """Cold import of each framework's benchmark surface in a fresh interpreter, minus a bare
    interpreter's start-up; runs interleaved so load spikes hit every framework alike."""
    programs = {name: _adapter(name).IMPORTS for name in names}
    programs["python"] = "pass"
    samples: dict[str, list[float]] = {key: [] for key in programs}
    env = _env()
    first = 0 if warm else 1  # round 0 warms the file cache and bytecode
    for round_ in range(first, repeat + 1):
        for key, program in programs.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, check=True,
                           stdin=subprocess.DEVNULL)
            if round_:
                samples[key].append(time.perf_counter() - start)
    base = statistics.median(samples.pop("python"))
    log(f"  bare interpreter start-up: {base * 1000:.1f} ms (subtracted)")
    out = {}
    for key, values in samples.items():
        net = [v - base for v in values]
        out[key] = {"samples": net, "median": statistics.median(net), "p95": percentile(net, 95),
                    "unit": "s", "baseline": base}
    return out


def run_all(names: list[str], plan: Plan, log: Any) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {name: {} for name in names}
    log(f"cold import ({plan.imports} runs each, interleaved)")
    for name, value in measure_imports(names, plan.imports, log, not plan.one_process).items():
        results[name]["import"] = value
    specs = {
        "construct": "construct:%d:%d" % plan.construct,
        "construct_mem": "construct_mem:%d:%d" % plan.construct_mem,
        "one_step": "one_step:%d:%d" % plan.one_step,
        "tool_call": "tool_call:%d:%d" % plan.tool_call,
        "long": f"long:{plan.long}",  # at synchronous=NORMAL
    }
    durable = "durable:%d:%d" % plan.durable
    if plan.one_process:
        log("cases (one process per framework and setting)")
        for name in names:
            for setting in SETTINGS:
                wanted = [*specs.values(), durable] if setting == "normal" else [durable]
                for result in run_cases(name, wanted, plan.durable_turns, log, setting):
                    results[name][_key(result["case"], result.get("synchronous"))] = result
    else:
        for case, spec in specs.items():
            if case == "construct":
                continue  # below, in rounds
            log(f"case {case} (a fresh process per framework)")
            for name in names:
                (result,) = run_cases(name, [spec], plan.durable_turns, log)
                results[name][case] = result
        # Construction takes microseconds: a slow second of the machine would fall on one
        # framework's whole case. Rounds of a fresh process per framework, samples pooled.
        repeat, warmup = plan.construct
        log(f"case construct ({CONSTRUCT_ROUNDS} rounds, a fresh process per framework each)")
        spec = f"construct:{max(1, repeat // CONSTRUCT_ROUNDS)}:{warmup}"
        for _ in range(CONSTRUCT_ROUNDS):
            for name in names:
                (result,) = run_cases(name, [spec], plan.durable_turns, log)
                _merge(results[name], "construct", result)
        # Interleaved: rounds of a few conversations per framework and setting, each round
        # a fresh process, so a busy moment of the machine falls on every framework alike.
        repeat, warmup = plan.durable
        rounds = max(1, repeat // DURABLE_PER_PROCESS)
        log(f"case durable, FULL and NORMAL ({rounds} rounds of {DURABLE_PER_PROCESS} "
            "conversations, a fresh process per framework and setting each round)")
        spec = f"durable:{DURABLE_PER_PROCESS}:{max(1, warmup // 2)}"
        for _ in range(rounds):
            for setting in SETTINGS:
                for name in names:
                    (result,) = run_cases(name, [spec], plan.durable_turns, log, setting)
                    _merge(results[name], f"durable@{setting}", result)
    for name, value in measure_first_answers(names, plan.first, log).items():
        results[name].update(value)
    for name, value in measure_fsyncs(names, plan.fsync_turns, log).items():
        results[name].update(value)
    if "cogency" in names:
        for setting in SETTINGS:
            results["cogency"][f"replay@{setting}"] = run_json(
                ["-m", "bench.replay", "--synchronous", setting, "--turns",
                 str(plan.replay_turns)], log)
            results["cogency"][f"service@{setting}"] = run_json(
                ["-m", "bench.bench_service", "--clients-json", "1,10", "--rounds",
                 str(plan.service[0]), "--per-round", str(plan.service[1]), "--synchronous",
                 setting], log)
        results["cogency"]["flush"] = run_json(
            ["-m", "bench.bench_flush", "--rounds", str(plan.flush[0]), "--ops",
             str(plan.flush[1]), "--turns", str(plan.flush[2])], log)
    return results


DURABLE_PER_PROCESS = 3
CONSTRUCT_ROUNDS = 5


def _merge(cases: dict[str, Any], key: str, result: dict[str, Any]) -> None:
    """Pool the samples of ``result`` (one round) into ``cases[key]``; medians over all."""
    fields = [field for field in ("", "cpu_") if f"{field}samples" in result]
    pooled = cases.setdefault(key, {**result, **{f"{field}samples": [] for field in fields}})
    for field in fields:
        values = pooled[f"{field}samples"]
        values += result[f"{field}samples"]
        pooled[f"{field}median"] = statistics.median(values)
        pooled[f"{field}p95"] = percentile(values, 95)


def _key(case: str, synchronous: str | None) -> str:
    return f"{case}@{synchronous}" if case == "durable" else case


def run_json(args: list[str], log: Any) -> dict[str, Any]:
    """``python ARGS`` in a fresh process: the one JSON line it prints."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=3600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(args)} failed (exit {done.returncode}):\n" +
                           "\n".join(tail))
    log(f"  {' '.join(args[1:]):<62} {time.perf_counter() - start:6.1f} s")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_first_answers(names: list[str], rounds: int, log: Any
                          ) -> dict[str, dict[str, Any]]:
    """Fresh process to first durable answer: the time from starting ``python -m
    bench.peers.<framework> first_answer`` to reading its result line (printed once the
    answer is stored), interleaved round by round; with the process's CPU time and resident
    memory at that moment, which it reports."""
    log(f"fresh process to first durable answer ({rounds} runs each, interleaved)")
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    env = _env()
    for _ in range(rounds):
        for setting in SETTINGS:
            for name in names:
                command = [sys.executable, "-m", f"bench.peers.{name}", "first_answer",
                           "--synchronous", setting]
                start = time.perf_counter()
                process = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           stdin=subprocess.DEVNULL)
                assert process.stdout is not None
                line = process.stdout.readline()
                elapsed = time.perf_counter() - start
                _, errors = process.communicate(timeout=600)
                if process.returncode != 0 or not line.startswith(RESULT_PREFIX):
                    raise RuntimeError(f"{name} first_answer failed: {errors[-2000:]}")
                result = json.loads(line[len(RESULT_PREFIX):])
                samples.setdefault((name, setting), []).append({**result, "wall": elapsed})
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    for (name, setting), runs in samples.items():
        walls = [r["wall"] for r in runs]
        out[name][f"first@{setting}"] = {
            "samples": walls, "median": statistics.median(walls),
            "p95": percentile(walls, 95), "unit": "s",
            "cpu_median": statistics.median(r["cpu"] for r in runs),
            "rss_kib": statistics.median(r["rss_kib"] for r in runs),
            "peak_kib": statistics.median(r["peak_kib"] for r in runs),
        }
    return out


def measure_fsyncs(names: list[str], turns: tuple[int, int], log: Any
                   ) -> dict[str, dict[str, Any]]:
    """fsync and fdatasync calls per turn, every thread of a worker process (``strace -f
    -c``): two conversations of ``turns[0]`` and ``turns[1]`` turns on fresh files, so what
    opening and closing cost cancels out of their difference."""
    if shutil.which("strace") is None:
        log("fsyncs per turn: skipped, strace is not installed (apt-get install strace)")
        return {}
    log(f"fsyncs per turn (strace, {turns[0]} and {turns[1]} turns)")
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-strace-") as directory:
        for setting in SETTINGS:
            for name in names:
                counts = []
                for length in turns:
                    trace = Path(directory) / f"{name}-{setting}-{length}.txt"
                    command = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o",
                               str(trace), sys.executable, "-m", f"bench.peers.{name}",
                               f"turns:{length}", "--synchronous", setting]
                    done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True,
                                          text=True, timeout=1800, stdin=subprocess.DEVNULL)
                    if done.returncode != 0:
                        raise RuntimeError(f"{name} under strace failed: {done.stderr[-2000:]}")
                    counts.append(_syncs(trace.read_text()))
                per_turn = (counts[1] - counts[0]) / (turns[1] - turns[0])
                out[name][f"fsync@{setting}"] = {"per_turn": per_turn, "counts": counts,
                                                 "turns": list(turns)}
                log(f"  {name:<14} {setting:<7} {per_turn:.2f} per turn ({counts})")
    return out


def _syncs(summary: str) -> int:
    """Calls of fsync and fdatasync in a ``strace -c`` summary."""
    calls = 0
    for line in summary.splitlines():
        words = line.split()
        if words and words[-1] in ("fsync", "fdatasync") and len(words) >= 5:
            calls += int(words[3])
    return calls


# -- summarising ---------------------------------------------------------------------------


def window(per_turn: list[float], turn: int) -> list[float] | None:
    """The 10 turns around ``turn`` (turn-4 .. turn+5, kept inside the conversation)."""
    if turn > len(per_turn):
        return None
    high = min(len(per_turn), turn + 5)
    low = max(1, high - 9)
    return per_turn[low - 1:high]


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per framework: metric name -> (median, p95) in display units."""
    table: dict[str, dict[str, Any]] = {}
    for name, cases in results.items():
        row: dict[str, Any] = {}
        if "import" in cases:
            row["import_ms"] = _pair(cases["import"], 1e3)
        if "construct" in cases:
            row["construct_us"] = _pair(cases["construct"], 1e6)
        if "construct_mem" in cases:
            row["construct_kib"] = _pair(cases["construct_mem"], 1 / 1024)
        for case in ("one_step", "tool_call"):
            if case in cases:
                row[f"{case}_ms"] = _pair(cases[case], 1e3)
        for setting in SETTINGS:
            durable = cases.get(f"durable@{setting}")
            if durable:
                row[f"durable_{setting}_ms"] = _pair(durable, 1e3)
                row[f"durable_{setting}_cpu_ms"] = (durable["cpu_median"] * 1e3,
                                                    durable["cpu_p95"] * 1e3)
            fsync = cases.get(f"fsync@{setting}")
            if fsync:
                row[f"fsync_{setting}"] = (fsync["per_turn"], None)
            first = cases.get(f"first@{setting}")
            if first:
                row[f"first_{setting}_ms"] = _pair(first, 1e3)
                row[f"first_{setting}_rss_mib"] = (first["rss_kib"] / 1024, None)
        long = cases.get("long")
        if long:
            for turn in CHECKPOINTS:
                values = window(long["per_turn"], turn)
                if values:
                    row[f"turn{turn}_ms"] = (statistics.median(values) * 1e3,
                                             percentile(values, 95) * 1e3)
            if long.get("late") and long.get("turn10"):  # alternated (_harness.case_long)
                row["growth"] = (statistics.median(long["late"])
                                 / statistics.median(long["turn10"]), None)
            else:  # results of a run made before the alternation
                first_turn = row.get("turn10_ms")
                last = row.get(f"turn{_last_checkpoint(long)}_ms")
                if first_turn and last:
                    row["growth"] = (last[0] / first_turn[0], None)
            row["db_mib"] = (long["db_bytes"] / 2**20, None)
            row["db_ratio"] = (long["db_ratio"], None)
            row["long_turns"] = long["turns"]
        table[name] = row
    return table


def _pair(result: dict[str, Any], scale: float) -> tuple[float, float]:
    return result["median"] * scale, result["p95"] * scale


def _last_checkpoint(long: dict[str, Any]) -> int:
    return max(t for t in CHECKPOINTS if t <= long["turns"])


METRICS = (
    ("import_ms", "Cold import (ms, minus bare interpreter)"),
    ("construct_us", "Construct an agent with one tool (µs)"),
    ("construct_kib", "Peak memory to construct it (KiB, tracemalloc)"),
    ("one_step_ms", "One-step run (ms)"),
    ("tool_call_ms", "Tool-call run: tool runs, 2 model calls (ms)"),
    ("durable_full_ms", "**FULL**: durable 25-turn conversation, per turn (ms)"),
    ("durable_full_cpu_ms", "**FULL**: the same, CPU time of the process per turn (ms)"),
    ("fsync_full", "**FULL**: fsyncs per turn (strace)"),
    ("first_full_ms", "**FULL**: fresh process to first durable answer (ms)"),
    ("first_full_rss_mib", "**FULL**: resident memory after the first answer (MiB)"),
    ("durable_normal_ms", "NORMAL: durable 25-turn conversation, per turn (ms)"),
    ("durable_normal_cpu_ms", "NORMAL: the same, CPU time of the process per turn (ms)"),
    ("fsync_normal", "NORMAL: fsyncs per turn (strace)"),
    ("first_normal_ms", "NORMAL: fresh process to first durable answer (ms)"),
    ("first_normal_rss_mib", "NORMAL: resident memory after the first answer (MiB)"),
    ("turn10_ms", "NORMAL: per-turn time at turn 10 (ms)"),
    ("turn100_ms", "NORMAL: per-turn time at turn 100 (ms)"),
    ("turn1000_ms", "NORMAL: per-turn time at turn 1,000 (ms)"),
    ("growth", "NORMAL: per-turn growth, the last 10 turns ÷ turn 10 (alternated) (×)"),
    ("db_mib", "Database size after the long conversation (MiB)"),
    ("db_ratio", "Database size ÷ raw message text (×)"),
)


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def markdown_table(table: dict[str, dict[str, Any]]) -> str:
    names = list(table)
    lines = [
        "| case | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    base = table.get("cogency", {})
    for key, label in METRICS:
        if not any(key in table[n] for n in names):
            continue
        cells = []
        for name in names:
            cell = table[name].get(key)
            if cell is None:
                cells.append("–")
                continue
            median, p95 = cell
            text = _fmt(median) + (f" (p95 {_fmt(p95)})" if p95 is not None else "")
            if name != "cogency" and key in base and base[key][0] > 0:
                text += f" · **{median / base[key][0]:.2f}×**"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(table: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]] | None = None
          ) -> list[tuple[str, str, bool | None]]:
    """Each goal: (goal, where Cogency stands, met?). Every ratio is at one durability
    setting for every framework."""
    cog = table.get("cogency", {})
    peers = {n: r for n, r in table.items() if n != "cogency"}
    out: list[tuple[str, str, bool | None]] = []

    def fastest(key: str) -> tuple[str, float] | None:
        values = [(n, r[key][0]) for n, r in peers.items() if key in r]
        return min(values, key=lambda item: item[1]) if values else None

    for setting, factor in (("full", 4), ("normal", 3)):
        label = setting.upper()
        for key, what in ((f"durable_{setting}_ms", "wall"), (f"durable_{setting}_cpu_ms", "CPU")):
            best = fastest(key)
            if best and key in cog:
                mine = cog[key][0]
                out.append((
                    f"{label}: fastest peer's durable turn ≥ {factor}× Cogency's ({what})",
                    f"Cogency {_fmt(mine)} ms; fastest peer {LABELS[best[0]]} {_fmt(best[1])} ms "
                    f"(**{best[1] / mine:.2f}×**)",
                    best[1] >= factor * mine,
                ))
    if "fsync_full" in cog:
        out.append(("FULL: 1 fsync per turn", f"Cogency {cog['fsync_full'][0]:.2f}",
                    cog["fsync_full"][0] <= 1.05))
    cog_results = (results or {}).get("cogency", {})
    for setting in SETTINGS:
        replay = cog_results.get(f"replay@{setting}")
        if replay:
            out.append((
                f"{setting.upper()}: Cogency's turn ÷ its own SQL replayed through sqlite3 ≤ "
                "1.5× (CPU)",
                f"{replay['cpu_ratio_literal']:.2f}× of the traced SQL replayed as text, "
                f"{replay['cpu_ratio']:.2f}× of it replayed parameterized",
                replay["cpu_ratio_literal"] <= 1.5,
            ))
    best = fastest("first_full_ms")
    if best and "first_full_ms" in cog:
        mine = cog["first_full_ms"][0]
        out.append((
            "FULL: fresh process to first durable answer ≤ ¼ of the fastest peer's",
            f"Cogency {_fmt(mine)} ms; fastest peer {LABELS[best[0]]} {_fmt(best[1])} ms "
            f"(Cogency = {mine / best[1]:.2f}× of it)",
            mine <= best[1] / 4,
        ))
    if "first_full_rss_mib" in cog:
        mine = cog["first_full_rss_mib"][0]
        out.append(("An agent process ≤ 35 MiB resident after its first answer",
                    f"Cogency {mine:.1f} MiB", mine <= 35))
    service = cog_results.get("service@full") or cog_results.get("service@normal")
    if service and "1" in service["clients"]:
        figures = service["clients"]["1"]
        one = figures["overhead"]["p50"]
        shown = f"+{one:.2f} ms"
        if "bare" in figures:  # (absent from results written before it was measured)
            shown += (f" (a lean client's round trip to a bare HTTP server: "
                      f"{figures['bare']['p50']:.2f} ms; the server's own: "
                      f"{figures['own']['p50']:+.2f} ms")
            if "httpx_overhead" in figures:
                shown += (f"; with httpx as the client: "
                          f"{figures['httpx_overhead']['p50']:+.2f} ms, its round trip to the "
                          f"bare server alone {figures['httpx_bare']['p50']:.2f} ms")
            shown += ")"
        out.append((
            f"{service['synchronous'].upper()}: `cogency serve` over HTTP adds ≤ 3 ms p50 to "
            "Agent.run at 1 client",
            shown, one <= 3,
        ))
    if "growth" in cog:
        growth = ", ".join(f"{LABELS[n]} {r['growth'][0]:.2f}×" for n, r in peers.items()
                           if "growth" in r)
        last = cog.get("long_turns", 0)
        out.append((
            "NORMAL: per-turn time flat: turn 1,000 ≤ 1.3 × turn 10",
            f"Cogency {cog['growth'][0]:.2f}× (turns {max(last - 9, 1):,}–{last:,} ÷ turn 10 "
            "of fresh conversations, alternated)"
            + (f"; peers: {growth}" if growth else ""),
            cog["growth"][0] <= 1.3 if last >= 1000 else None,
        ))
    if "db_ratio" in cog:
        out.append((
            "Database size ≤ 2 × the raw text",
            f"Cogency {cog['db_ratio'][0]:.2f}× after {cog.get('long_turns')} turns",
            cog["db_ratio"][0] <= 2 if cog.get("long_turns", 0) >= 1000 else None,
        ))
    for key, what in (("construct_us", "time"), ("construct_kib", "peak memory")):
        best = fastest(key)
        if best and key in cog:
            unit = "µs" if key == "construct_us" else "KiB"
            out.append((
                f"Construction {what} ≤ the best peer's",
                f"Cogency {_fmt(cog[key][0])} {unit}; best peer {LABELS[best[0]]} "
                f"{_fmt(best[1])} {unit}",
                cog[key][0] <= best[1],
            ))
    best = fastest("import_ms")
    if best and "import_ms" in cog:
        out.append((
            "Cold import faster than every peer",
            f"Cogency {_fmt(cog['import_ms'][0])} ms; fastest peer {LABELS[best[0]]} "
            f"{_fmt(best[1])} ms",
            cog["import_ms"][0] < best[1],
        ))
    return out


def _section(title: str, intro: str, columns: list[str]) -> list[str]:
    return [f"### {title}", "", intro, "", "| " + " | ".join(columns) + " |",
            "|---|" + "---:|" * (len(columns) - 1)]


def cogency_tables(results: dict[str, dict[str, Any]]) -> str:
    """Cogency's own figures at both settings: its SQL floor and the HTTP service's cost."""
    cases = results.get("cogency", {})
    lines = []
    replays = [(s, cases[f"replay@{s}"]) for s in SETTINGS if f"replay@{s}" in cases]
    if replays:
        lines += _section(
            "Cogency ÷ its own SQL",
            "A turn's statements (recorded at the store's connection, checked against "
            "sqlite3's trace callback) replayed through a plain `sqlite3` connection on a fresh "
            "file, interleaved turn by turn with a fresh Cogency conversation; medians per turn "
            "after 2 warm-up turns. *As traced text*: each statement once, as the trace "
            "callback saw it first (it fires again for what a statement runs inside, such as a "
            "foreign key's cascade: not run again).",
            ["setting", "statements / transactions per turn", "Cogency CPU (ms)",
             "replayed as traced text (ms)", "ratio", "replayed parameterized (ms)", "ratio",
             "wall ratio (text)"])
        for setting, r in replays:
            lines.append(
                f"| {setting.upper()} | {r['statements_per_turn']:.0f} / "
                f"{r['transactions_per_turn']:.0f} | {r['cpu']['cogency'] * 1e3:.2f} | "
                f"{r['cpu']['literal'] * 1e3:.2f} | **{r['cpu_ratio_literal']:.2f}×** | "
                f"{r['cpu']['replay'] * 1e3:.2f} | {r['cpu_ratio']:.2f}× | "
                f"{r['wall_ratio_literal']:.2f}× |")
        lines.append("")
    services = [(s, cases[f"service@{s}"]) for s in SETTINGS if f"service@{s}" in cases]
    if services:
        lines += _section(
            "`cogency serve` over HTTP against `Agent.run`",
            "An instant model; each client its own key and conversation, one run after another "
            "(`POST /api/runs`, waiting for the answer); the server a `cogency serve` process "
            "on loopback, `Agent.run` in the measuring process. The client: `bench/lean_http.py`"
            " (HTTP/1.1 on one kept-alive connection per client, no framework), so that a "
            "round trip costs what the loopback and the server cost; httpx, most Python users' "
            "client, is measured too (its columns), its own cost per request part of its "
            "figures. *Bare HTTP*: the same client and requests against an HTTP server with no "
            "framework and no work (`bench/bare_http.py`, answering with a body the server "
            "sent): what the client, the loopback and a second process cost by themselves, a "
            "floor under any service's *added*. *Server's own*: added less that floor. The "
            "ways alternate round by round. Milliseconds per request.",
            ["setting", "clients", "Agent.run p50", "p99", "HTTP p50", "p99", "**added p50**",
             "added p99", "bare HTTP p50", "server's own p50", "httpx: added p50",
             "httpx: bare HTTP p50", "requests"])
        for setting, r in services:
            for count, f in r["clients"].items():
                bare = (f"{f['bare']['p50']:.2f} | {f['own']['p50']:+.2f}" if "bare" in f
                        else "– | –")
                httpx = (f"{f['httpx_overhead']['p50']:+.2f} | {f['httpx_bare']['p50']:.2f}"
                         if "httpx_overhead" in f else "– | –")
                lines.append(
                    f"| {setting.upper()} | {count} | {f['direct']['p50']:.2f} | "
                    f"{f['direct']['p99']:.2f} | {f['http']['p50']:.2f} | {f['http']['p99']:.2f}"
                    f" | **{f['overhead']['p50']:+.2f}** | {f['overhead']['p99']:+.2f} | "
                    f"{bare} | {httpx} | {f['http']['n']} |")
        lines.append("")
    flush = cases.get("flush")
    if flush:
        from cogency.storage.sqlite import LOG_AHEAD_BYTES

        lines += _section(
            "What a FULL turn's flush costs here",
            f"`python -m bench.bench_flush`: `fdatasync` after writing "
            f"{flush['bytes'] // 1024} KiB (what a turn adds to the log), in the system's "
            f"temporary directory; medians of {flush['rounds']} rounds of {flush['ops']}. "
            "Cogency's FULL turn is one flush of its log, which the store keeps written "
            f"{LOG_AHEAD_BYTES // 1024} KiB ahead of its end (*written ahead*: a log that grows "
            "is otherwise *appending*; a log started over after a checkpoint is written *over "
            "written blocks*), made by the event loop itself while the store has nothing else "
            "under way and fewer than 4 of its last 16 flushes took over 1 ms (*inline* "
            "below), else handed to the store's worker thread. Microseconds; the mean "
            "counts a way's slower flushes (the writing ahead: one in ~10).",
            ["the flush", "wall p50", "wall mean", "system CPU"])
        for way, f in flush["flush"].items():
            mean = f"{f['mean'] * 1e6:.0f}" if "mean" in f else "–"
            lines.append(f"| {way} | {f['wall'] * 1e6:.0f} | {mean} | "
                         f"{f['system'] * 1e6:.0f} |")
        lines += ["", "Each way a write, then the flush (or none), per operation; *inline* "
                  "is a lone run's flush, *on the worker* one among others:", "",
                  "| the hand-off | wall | user CPU | system CPU | voluntary switches |",
                  "|---|---:|---:|---:|---:|"]
        for way, f in flush["hand_off"].items():
            lines.append(f"| {way} | {f['wall'] * 1e6:.0f} | {f['user'] * 1e6:.0f} | "
                         f"{f['system'] * 1e6:.0f} | {f['switches']:.1f} |")
        if "where" in flush:  # (absent from results written before it was measured)
            from bench.bench_flush import where_line

            lines += ["", where_line(flush["where"])]
        lines.append("")
    return "\n".join(lines)


# -- output --------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "n/a"
    return {
        "cpu": f"{cpu}, {os.cpu_count()} logical cores",
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load": load,
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> bool:
    """Per-turn time against turn number, one line per framework (rolling median)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"cogency": "#d62728", "langgraph": "#1f77b4", "agno": "#2ca02c",
               "openai_agents": "#9467bd"}
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    for name, cases in results.items():
        long = cases.get("long")
        if not long:
            continue
        per_turn = [t * 1e3 for t in long["per_turn"]]
        half = _smoothing(len(per_turn)) // 2
        smooth = [statistics.median(per_turn[max(0, i - half):i + half + 1])
                  for i in range(len(per_turn))]
        turns = range(1, len(per_turn) + 1)
        ax.plot(turns, per_turn, color=colours.get(name), alpha=0.15, linewidth=0.6)
        ax.plot(turns, smooth, color=colours.get(name), linewidth=2.2 if name == "cogency" else 1.6,
                label=LABELS[name])
    ax.set_yscale("log")
    ax.set_xlabel("turn of one durable SQLite conversation")
    ax.set_ylabel("time per turn (ms, log scale)")
    ax.set_title("Per-turn time as the conversation grows (scripted model, same texts)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def _smoothing(turns: int) -> int:
    """Turns in the plot's rolling median: 9, or 1/40 of the conversation if longer (odd)."""
    return max(9, turns // 40) | 1


def document(
    results: dict[str, dict[str, Any]], plan: Plan, info: dict[str, Any], plot_name: str | None
) -> str:
    table = summarise(results)
    names = list(results)
    goal_lines = "\n".join(
        f"| {goal} | {where} | {'met' if ok else 'open (not measured)' if ok is None else 'missed'} |"
        for goal, where, ok in goals(table, results)
    )
    version_lines = "\n".join(
        f"- {LABELS[n]}: " + ", ".join(f"`{d}=={v}`" for d, v in info["versions"][n].items())
        for n in names
    )
    skipped = "".join(f"\n- {LABELS[n]}: not installed ({why})" for n, why in info["skipped"].items())
    longest = max((len(c["long"]["per_turn"]) for c in results.values() if "long" in c),
                  default=0)
    picture = (
        f"\n![Per-turn time against turn number]({plot_name})\n\n"
        f"Thin lines: every turn; thick lines: rolling median of {_smoothing(longest)} turns.\n"
        if plot_name else ""
    )
    m = info["machine"]
    return f"""# Benchmarks: Cogency, LangGraph, Agno and the OpenAI Agents SDK

Measured on {info['date']} with `python -m bench{' --quick' if plan.one_process else ''}`,
all frameworks on the same machine in the same run, each with a scripted model at its own
model boundary (no network, replies built instantly, nothing copied). Cells: median (p95);
**bold** is the ratio to Cogency (above 1× means Cogency is faster or smaller).

Every durable figure is at **equal durability**: the same `PRAGMA synchronous` on every
connection of every framework, read back from those connections after the run (a mismatch
fails the run). **FULL** flushes each commit to the disk (a commit survives a power loss);
NORMAL, in WAL mode, survives a crash of the process but may lose the last commits in a power
loss. No figure compares frameworks at different settings. (Cogency's SQLite store at FULL
commits as at NORMAL and flushes the log itself before it tells an outcome: read back as
FULL once every commit of the run is flushed; the fsyncs per turn count those flushes.)

{markdown_table(table)}
{picture}
{cogency_tables(results)}
## Goals

| goal | where Cogency stands | |
|---|---|---|
{goal_lines}

## Method

- **Fresh process per case** (`python -m bench.peers.<framework> CASE --synchronous S`),
  started by the runner, which collects one JSON line per case. Warm-ups first (the first run
  of a process pays lazy imports), then medians and p95 over the repeats: construction
  {plan.construct[0]}× (in {CONSTRUCT_ROUNDS} rounds, a fresh process per framework each
  round, the frameworks alternating), memory {plan.construct_mem[0]}×, one-step {plan.one_step[0]}×, tool call
  {plan.tool_call[0]}×, 25-turn conversations {plan.durable[0]}× at each setting (one fresh
  database file each; in rounds of {DURABLE_PER_PROCESS}, a fresh process per framework and
  setting each round, the frameworks and settings alternating), one long conversation of
  {plan.long} turns (NORMAL).
- **Fresh process to first durable answer**: the runner starts `python -m
  bench.peers.<framework> first_answer` and times until it reads the result line, which the
  process prints once its first answer is stored in a fresh file (interpreter start, imports,
  opening the agent and the database, one turn); {plan.first} runs per framework and setting,
  interleaved. The process reports its resident memory (`VmRSS`) at that moment.
- **fsyncs per turn**: `strace -f -c -e trace=fsync,fdatasync` on a process running a
  conversation of {plan.fsync_turns[0]} turns and one of {plan.fsync_turns[1]}, each on a fresh
  file; the difference of their counts divided by the difference of their turns (opening and
  closing cancel out). Every thread of the process is counted, checkpoints' flushes too.
- **Telemetry off** in every process: `AGNO_TELEMETRY=false` and `telemetry=False`,
  `OPENAI_AGENTS_DISABLE_TRACING=1` with `set_tracing_disabled(True)` and
  `RunConfig(tracing_disabled=True)`, `LANGCHAIN_TRACING_V2=false`, `LANGSMITH_TRACING=false`.
- **Fake models** at each framework's boundary, reading one shared script: LangGraph a
  `BaseChatModel` subclass returning `AIMessage` (with `tool_calls` or final content) inside a
  hand-built ReAct graph (`StateGraph(MessagesState)`, `ToolNode`, `tools_condition`); Agno a
  `Model` subclass whose `ainvoke` returns a `ModelResponse`; the OpenAI Agents SDK a `Model`
  whose `get_response` returns a `ModelResponse` with one `ResponseOutputMessage` or
  `ResponseFunctionToolCall`; Cogency `ScriptedLLM` over an endless iterator of one callable.
- **The same tool** (`async def lookup(key)`) wrapped by each framework's own decorator, and
  the same message texts: user messages of about 160 characters, answers of about 480.
- **Correctness inside every iteration**: the answer is the scripted one; a tool-call run
  must run the tool exactly once with the scripted key; each durable turn must show the model
  the history (at least min(2·turn−1, 7) conversation messages) and add rows to the database
  (read with a separate plain sqlite3 connection after the timed part).
- **Durable storage**, a fresh file each, WAL for every framework, and `synchronous` set alike
  on every connection: Cogency `SQLiteStore(path, synchronous=…)`; LangGraph a `PRAGMA` on
  its aiosqlite connection before `AsyncSqliteSaver.setup()`; Agno a SQLAlchemy `connect`
  event on its engine (Agno turns WAL on and leaves SQLite's default, FULL); the OpenAI SDK a
  `SQLiteSession` subclass whose `_configure_connection` sets it on each thread's connection.
  LangGraph `AsyncSqliteSaver` with a `thread_id`; Agno `AsyncSqliteDb` with a `session_id`
  and `add_history_to_context=True`; OpenAI Agents `SQLiteSession`; Cogency `SQLiteStore`
  with a `conversation_id`. All through each framework's async API.
- **One-step and tool-call runs** use no database for the peers (their agents keep nothing
  unless given one). Cogency has no such mode: every run saves its task (workspace row,
  messages) and completes it, here in an in-memory SQLite store (its short calls on the
  event loop); that is what Agno's storage-less agent does not pay in these two rows.
- **History windows are each framework's default**: LangGraph and the OpenAI SDK send the
  whole conversation every turn; Agno the last 3 runs; Cogency the newest messages within
  8,000 tokens (`history_tokens`), while every message stays in its database.
- **Durable 25-turn conversation**: opening the agent and its database (schema creation
  included), 25 turns and closing, divided by 25; a fresh file each time.
  CPU time (`time.process_time`, every thread of the process) over the same span is
  reported too: other work on a shared machine moves it far less than wall time.
- **Per-turn time at turn N**: median (p95) of the 10 turns around N of one conversation.
  **Growth** (and the flatness goal): each of the long conversation's last 10 turns is
  followed by a fresh conversation on a file of its own, whose turn 10 is timed; the median
  of the late turns over the median of those turns 10. Alternated, a shared machine's slow
  and fast spells (they last seconds, longer than a turn) fall on both alike, where the
  rows above compare turns made minutes apart.
  Cogency's p95 at turn 10 holds the one turn (the 14th) in which its process loads the
  exact tokenizer (100-250 ms, once per process): the first turn whose history window's upper
  bound of tokens, its UTF-8 length, no longer fits the window.
  **Database size**: the file plus any WAL left, after the conversation is closed, divided
  by the UTF-8 size of all user messages and answers.
- **Cold import**: `python -c "<the imports the benchmark uses>"` in a fresh interpreter,
  {plan.imports} runs per framework interleaved with the others, median minus the median of
  `python -c pass`.
- **Construction**: the agent, its model object and its one tool, without storage;
  memory is the tracemalloc peak of building one more agent after a warm-up build.

## Machine and versions

- {m['cpu']}; {m['os']}; Python {m['python']}; SQLite {m['sqlite']}
- Load average at start {info['load_start']}, at end {info['load_end']}: the machine is
  shared, so absolute times are noisy; ratios measured in the same run are the figures to
  compare.
{version_lines}{skipped}

## Reproduce

```bash
python -m venv ~/.cache/cogency-bench-peers         # the peers' pins clash with ours
~/.cache/cogency-bench-peers/bin/pip install -r bench/requirements-peers.txt
~/.cache/cogency-bench-peers/bin/pip install -e '.[serve]'
~/.cache/cogency-bench-peers/bin/python -m bench            # full run: this file and the plot
~/.cache/cogency-bench-peers/bin/python -m bench --quick    # a few minutes, prints the tables
~/.cache/cogency-bench-peers/bin/python -m bench --from-json run.json   # rewrite from results
python -m bench.replay --synchronous full             # Cogency ÷ its SQL alone
python -m bench.bench_flush                           # a flush, and its hand-off to the worker
python -m bench.bench_service --clients-json 1,10     # the HTTP service alone
python -m bench.instructions --against ../base/src    # instructions per turn (valgrind), A/B
python -m bench.instructions --case served            # per served request, app in process
python -m bench.instructions --case http              # the same in a cogency serve process
```

`strace` counts the fsyncs (`apt-get install strace`; without it that row is left out).
Times on a shared machine drift by up to 25% between runs; `bench.instructions` counts the
instructions of a durable turn with valgrind (`apt-get install valgrind`), which do not
drift (three runs on one machine: 2.121 to 2.123 M per turn), for an A/B of two checkouts (another one's
`src`, e.g. from `git worktree add`).
`--quick` runs every case briefly, a framework's cases in one process per setting and a
100-turn long conversation: a smoke run, not the published figures (the database-size and
flatness goals are defined at 1,000 turns).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, under a minute")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help="comma-separated, from: " + ", ".join(FRAMEWORKS))
    parser.add_argument("--output", type=Path, help="Markdown file (full run: docs/benchmarks.md)")
    parser.add_argument("--plot", type=Path,
                        help="PNG file (full run: docs/benchmarks-per-turn.png)")
    parser.add_argument("--json", type=Path, help="also save the raw results here")
    parser.add_argument("--long-turns", type=int, help="length of the long conversation")
    parser.add_argument("--from-json", type=Path,
                        help="run nothing: rewrite the table and plot from a --json file")
    args = parser.parse_args(argv)

    plan = QUICK if args.quick else FULL
    if args.long_turns:
        plan = Plan(**{**plan.__dict__, "long": args.long_turns})
    output = args.output or (None if args.quick else ROOT / "docs" / "benchmarks.md")
    picture = args.plot or (None if args.quick else ROOT / "docs" / "benchmarks-per-turn.png")
    wanted = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in FRAMEWORKS]
    if unknown:
        parser.error(f"unknown framework(s) {', '.join(unknown)}; choose from {FRAMEWORKS}")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    names, skipped = [], {}
    for name in wanted:
        gone = missing(name)
        if gone:
            skipped[name] = "missing " + ", ".join(gone)
            log(f"{LABELS[name]} skipped: {', '.join(gone)} not installed. To install the peers: "
                f"{INSTALL}")
        else:
            names.append(name)
    if "cogency" not in names:
        parser.error("Cogency itself is not importable here; pip install -e . first")

    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        info, results = saved["info"], saved["results"]
        if "plan" in info:
            plan = Plan(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in info["plan"].items()})
    else:
        info = {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "load_start": machine()["load"], "skipped": skipped,
            "versions": {n: versions(n) for n in names}, "plan": plan.__dict__,
        }
        started = time.perf_counter()
        results = run_all(names, plan, log)
        info["load_end"] = machine()["load"]
        log(f"done in {time.perf_counter() - started:.0f} s")

    plot_name = None
    if picture is not None:
        if plot(results, picture):
            plot_name = os.path.relpath(picture, (output or ROOT / "docs").parent)
            log(f"wrote {picture}")
        else:
            log("matplotlib is not installed: no plot (it is in bench/requirements-peers.txt)")
    text = document(results, plan, info, plot_name)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        kept = _kept_sections(output)
        output.write_text(text.rstrip("\n") + "\n\n" + kept if kept else text)
        log(f"wrote {output}")
    else:
        print(markdown_table(summarise(results)))
        print(cogency_tables(results))
        for goal, where, ok in goals(summarise(results), results):
            print(f"- {goal}: {where} [{'met' if ok else 'missed' if ok is False else 'n/a'}]")
    if args.json is not None:
        args.json.write_text(json.dumps({"info": info, "results": results}))
    return 0


def _kept_sections(path: Path) -> str:
    """Sections other benchmarks wrote into ``path`` (``<!-- bench_NAME:begin -->`` to
    ``<!-- bench_NAME:end -->``: ``bench.bench_offline``'s, ``bench.bench_postgres``'s), kept
    as they are."""
    text = path.read_text() if path.exists() else ""
    kept = []
    for found in re.finditer(r"<!-- (bench_\w+):begin -->.*?<!-- \1:end -->", text, re.S):
        kept.append(found.group(0) + "\n")
    return "\n".join(kept)


if __name__ == "__main__":
    sys.exit(main())
