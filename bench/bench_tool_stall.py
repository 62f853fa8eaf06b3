"""The longest event-loop stall while a tool returns 1 MB of hostile text through Agent.run.

A watcher task sleeps 1 ms at a time and records how late it wakes; the run is one tool call
whose result is 1 MB of a shape that costs the most to redact or count (dotted digits, one long
word, URL-like colons, secret-looking labels, CJK), then the answer. Baseline: the same run with
a 10-character result. Reported per shape: the median over ``--runs`` of the run's longest stall
(goal: under 50 ms), and the median run time.

    python -m bench.bench_tool_stall            # 1 MB, 5 runs per shape
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from cogency import Agent
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tools import tool

SHAPES = {
    "short (baseline)": "",
    "dotted digits": "1.1.",
    "one long word": "a",
    "url colons": "://a:",
    "label words": "password=hunter2hunter2 ",
    "cjk": "漢字かな",
}


class StallWatch:
    """The longest time the loop took to wake a 1 ms sleep, minus the 1 ms."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - started - 0.001)

    async def __aenter__(self) -> StallWatch:
        self._task = asyncio.create_task(self._watch())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def hostile(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size] if unit else "short text"


async def one_run(store: SQLiteStore, text: str) -> tuple[float, float]:
    @tool
    async def fetch() -> str:
        """Return the text."""
        return text

    llm = ScriptedLLM([
        {"secure": True, "actions": [{"name": "fetch", "args": {}}]},
        {"response": "done", "actions": []},
    ])
    agent = Agent(llm=llm, tools=[fetch], store=store)
    started = time.perf_counter()
    async with StallWatch() as watch:
        result = await agent.run("fetch it", user_id="bench")
    assert result.stop_reason == "completed", result
    return watch.worst, time.perf_counter() - started


async def bench(megabytes: float, runs: int) -> dict[str, tuple[float, float]]:
    size = int(megabytes * 1_000_000)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        try:
            await one_run(store, "warm up the tokenizer and the store")
            for name, unit in SHAPES.items():
                text = hostile(unit, size)
                stalls, times = [], []
                for _ in range(runs):
                    stall, took = await one_run(store, text)
                    stalls.append(stall)
                    times.append(took)
                figures[name] = statistics.median(stalls), statistics.median(times)
        finally:
            await store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    figures = asyncio.run(bench(args.mb, args.runs))
    print(f"tool result of {args.mb:g} MB through Agent.run, median of {args.runs} runs")
    print(f"{'result':<18} {'longest stall ms':>17} {'run ms':>8}")
    for name, (stall, took) in figures.items():
        print(f"{name:<18} {stall * 1000:>17.1f} {took * 1000:>8.1f}")
    print(f"worst stall: {max(s for s, _ in figures.values()) * 1000:.1f} ms (goal < 50 ms)")


if __name__ == "__main__":
    main()
