"""What the agent loop itself costs: framework overhead with a model that answers instantly.

The model is a ScriptedLLM over an endless generator (no script is built or copied), so every
figure is Cogency's own work: context assembly, token counting, parsing, tools and SQLite.
Reported (medians over repeated runs after warm-ups, on a fresh SQLite file):

- one-step run (a direct answer) and tool-call run (one tool step, then the answer);
- per turn of a 25-turn durable conversation (each turn a task continuing the conversation);
- turn 10 against turn ~1,000 of one conversation, measured alternately, and their ratio
  (target <= 1.3: nothing in a turn may grow with the history beyond the prompt window).
  With short turns the prompt window (8,000 tokens of history) fills up between the two, so
  that ratio includes the prompt growing; with long turns it is full at turn 10 already, so
  the ratio shows growth beyond the window alone;
- ``Agent(...)`` construction time, and its peak memory (tracemalloc, a separate pass);
- transactions per run, and a same-process baseline: one bare SQLite write transaction
  through the same worker-thread hop (the floor any durable run pays per transaction).

The machine may be busy: absolute times are noisy, ratios measured in one run are not.

    python -m bench.bench_agent            # full (1,000-turn conversation)
    python -m bench.bench_agent --quick    # smaller counts (200-turn conversation)
    python -m bench.bench_agent --profile  # also cProfile the late turns
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import itertools
import pstats
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cogency import Agent, tool
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM

ANSWER = {
    "secure": True, "objective": "answer the question", "understanding": "a simple question",
    "approach": "answer directly", "discoveries": "", "response": "Here is the answer.",
    "actions": [],
}
TOOL_STEP = {
    "secure": True, "objective": "echo a word", "understanding": "needs the tool",
    "approach": "call echo", "discoveries": "", "response": None,
    "actions": [{"name": "echo", "args": {"text": "hello"}}],
}
QUESTION = "What is the capital of France, and why is it the capital? Answer briefly."
LONG_QUESTION = QUESTION + " Context: " + "the quick brown fox jumps over the lazy dog " * 45
"""About 450 tokens: the 8,000-token history window is full from turn ~10 on."""


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


class CountingStore(SQLiteStore):
    """A SQLite store that counts its write transactions."""

    writes = 0

    def _write(self, fn: Callable[[sqlite3.Connection], Any], **how: bool
               ) -> Callable[[sqlite3.Connection], Any]:
        self.writes += 1
        return super()._write(fn, **how)


def endless(*items: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return itertools.cycle(items)


async def timed(make: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await make()
    return time.perf_counter() - start


class Clock:
    """Wall time and process CPU time (all threads: the SQLite worker too) of one span.

    CPU time is what Cogency itself spends; it barely moves when other processes load the
    machine, so ratios are read from it as well as from wall time.
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    async def time(self, make: Callable[[], Awaitable[Any]]) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        value = await make()
        self.cpu.append(time.process_time() - cpu)
        self.wall.append(time.perf_counter() - wall)
        return value

    def median(self) -> tuple[float, float]:
        return statistics.median(self.wall), statistics.median(self.cpu)

    def best(self) -> float:
        """The fastest wall time: the least disturbed by other processes."""
        return min(self.wall)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def bench_runs(tmp: Path, runs: int, warmup: int) -> dict[str, Any]:
    store = CountingStore(tmp / "runs.db")
    direct = Agent(llm=ScriptedLLM(endless(ANSWER)), store=store)
    tooled = Agent(llm=ScriptedLLM(endless(TOOL_STEP, ANSWER)), tools=[echo], store=store)
    for _ in range(warmup):
        await direct.run(QUESTION)
        await tooled.run(QUESTION)
    one, tools_ = Clock(), Clock()
    writes_one = writes_tool = 0
    for _ in range(runs):  # interleaved, so machine noise hits both alike
        before = store.writes
        await one.time(lambda: direct.run(QUESTION))
        writes_one = store.writes - before
        before = store.writes
        await tools_.time(lambda: tooled.run(QUESTION))
        writes_tool = store.writes - before
        direct.llm.calls.clear()
        tooled.llm.calls.clear()
    floor = await bare_transaction(tmp / "floor.db", runs)
    await store.close()
    return {
        "one_step": one.median(),
        "tool_call": tools_.median(),
        "writes_one_step": writes_one,
        "writes_tool_call": writes_tool,
        "transaction_floor": floor,
    }


async def bare_transaction(path: Path, runs: int) -> tuple[float, float]:
    """One BEGIN IMMEDIATE / INSERT / COMMIT through a worker thread, as the store does it."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    executor = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()

    def write() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (v) VALUES (?)", ("x" * 200,))
        db.execute("COMMIT")

    clock = Clock()
    for _ in range(runs + 5):
        await clock.time(lambda: loop.run_in_executor(executor, write))
    executor.shutdown()
    db.close()
    del clock.wall[:5], clock.cpu[:5]
    return clock.median()


async def conversation_turns(path: Path, turns: int) -> list[float]:
    """Per-turn times of one conversation of ``turns`` tasks on a fresh database file."""
    store = SQLiteStore(path)
    llm = ScriptedLLM(endless(ANSWER))
    agent = Agent(llm=llm, store=store)
    conversation = None
    times: list[float] = []
    for turn in range(1, turns + 1):
        start = time.perf_counter()
        result = await agent.run(f"{QUESTION} (turn {turn})", conversation_id=conversation)
        times.append(time.perf_counter() - start)
        conversation = result.conversation_id
        llm.calls.clear()  # the double's record of prompts is not the framework's to carry
    await store.close()
    return times


async def turn_10_against_turn_n(
    path: Path, turns: int, samples: int, question: str, profile: bool
) -> tuple[tuple[float, float], tuple[float, float], float, str]:
    """Median (wall, CPU) time of turn 10 and of turn ~``turns``, measured alternately in one process.

    One conversation is brought to ``turns - samples`` turns; then each sample times one more
    turn of it and turn 10 of a fresh conversation in the same database, back to back, so
    the machine's noise falls on both alike.
    """
    store = SQLiteStore(path)
    llm = ScriptedLLM(endless(ANSWER))
    agent = Agent(llm=llm, store=store)

    async def turn(conversation: str | None, clock: Clock | None = None) -> str:
        run = lambda: agent.run(question, conversation_id=conversation)  # noqa: E731
        result = await (clock.time(run) if clock else run())
        llm.calls.clear()  # the double's record of prompts is not the framework's to carry
        return result.conversation_id

    long_one = None
    for _ in range(turns - samples):
        long_one = await turn(long_one)
    early, late = Clock(), Clock()
    profiler = cProfile.Profile()
    for _ in range(samples):
        fresh = None
        for _ in range(9):
            fresh = await turn(fresh)
        await turn(fresh, early)
        if profile:
            profiler.enable()
        await turn(long_one, late)
        profiler.disable()
    await store.close()
    report = ""
    if profile:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        report = out.getvalue()
    return early.median(), late.median(), late.best() / early.best(), report


def construction(tmp: Path, count: int) -> tuple[float, int]:
    llm = ScriptedLLM([])
    path = str(tmp / "construct.db")
    for _ in range(20):
        Agent(llm=llm, tools=[echo], store=path)  # warm-up: imports, caches
    times = []
    for _ in range(count):
        start = time.perf_counter()
        Agent(llm=llm, tools=[echo], store=path)
        times.append(time.perf_counter() - start)
    gc.collect()
    tracemalloc.start()  # a separate pass: tracing slows the timing above
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    agent = Agent(llm=llm, tools=[echo], store=path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del agent
    return statistics.median(times), peak - base


async def main(quick: bool, profile: bool) -> None:
    runs, warmup = (40, 5) if quick else (150, 10)
    long_turns = 200 if quick else 1000
    repeats = 3 if quick else 7
    samples = 10 if quick else 25
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        figures = await bench_runs(tmp, runs, warmup)
        (one_wall, one_cpu), (tool_wall, tool_cpu) = figures["one_step"], figures["tool_call"]
        floor_wall, floor_cpu = figures["transaction_floor"]
        print("median wall / CPU time")
        print(f"one-step run          {ms(one_wall)} / {ms(one_cpu)}  "
              f"({figures['writes_one_step']} write transactions)")
        print(f"tool-call run         {ms(tool_wall)} / {ms(tool_cpu)}  "
              f"({figures['writes_tool_call']} write transactions)")
        print(f"baseline, one bare SQLite write transaction: {ms(floor_wall)} / {ms(floor_cpu)}; "
              f"one-step run = {one_wall / floor_wall:.0f}x / {one_cpu / floor_cpu:.0f}x of it")
        per_turn = []
        for repeat in range(repeats):
            times = await conversation_turns(tmp / f"turns25-{repeat}.db", 25)
            per_turn.append(statistics.median(times))
        print(f"25-turn conversation  {ms(statistics.median(per_turn))} per turn (wall; "
              f"{repeats} fresh databases)")

        for label, question in (("short turns", QUESTION), ("long turns", LONG_QUESTION)):
            (early_wall, early_cpu), (late_wall, late_cpu), best, report = await turn_10_against_turn_n(
                tmp / f"long-{label[:4]}.db", long_turns, samples, question, profile
            )
            print(f"{label}: turn 10 {ms(early_wall)} / {ms(early_cpu)}, turn ~{long_turns} "
                  f"{ms(late_wall)} / {ms(late_cpu)}, ratio {late_wall / early_wall:.2f} / "
                  f"{late_cpu / early_cpu:.2f}, of the fastest samples {best:.2f} (target <= 1.3)")
            if report:
                print(f"\ncProfile of the late turns ({label}):\n{report}")
        construct, peak = construction(tmp, 300 if quick else 1000)
        print(f"Agent(...) with one tool: construction median {construct * 1e6:.1f} us, "
              f"peak memory {peak / 1024:.1f} KiB")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    parser.add_argument("--profile", action="store_true", help="cProfile the late turns")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.profile))


if __name__ == "__main__":
    cli()
