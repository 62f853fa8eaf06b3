"""The offline model's success on simple file tasks, with the files tools and every call allowed.

What ``cogency run "…" --tools files --yes`` does on the default offline model
(SmolLM2-135M-Instruct): each task runs through ``Agent(llm=LocalLLM(), tools=files_tools(root),
approve=True).run`` in a fresh directory holding a few small files, on a fresh SQLite file.
A task succeeds when its check holds: the answer names what the file says, or the file it
asked for exists with the right text. Each of the 5 tasks is asked in 3 wordings (the model
runs at temperature 0, so a retry of the same words would repeat itself). Reported: successes,
the stop reasons, the median iterations and seconds per task, and how many runs wrote a file
that no task asked for.

    python -m bench.bench_offline_tools              # 5 tasks x 3 wordings
    python -m bench.bench_offline_tools --quick      # 5 tasks x 1 wording
    python -m bench.bench_offline_tools --json       # one JSON line per run, then the summary
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILES = {
    "notes.txt": "the secret number is 42\n",
    "todo.txt": "buy milk\ncall Ada\n",
    "colors.txt": "red\ngreen\nblue\n",
}


@dataclass(frozen=True)
class Task:
    name: str
    wordings: tuple[str, ...]
    check: Callable[[str | None, Path], bool]


def _says(*words: str) -> Callable[[str | None, Path], bool]:
    return lambda answer, root: all(w.lower() in (answer or "").lower() for w in words)


def _wrote(name: str, text: str) -> Callable[[str | None, Path], bool]:
    def check(answer: str | None, root: Path) -> bool:
        path = root / name
        return path.is_file() and text.lower() in path.read_text(errors="replace").lower()

    return check


TASKS = (
    Task("read a number", (
        "What number is in notes.txt?",
        "Read the file notes.txt and tell me the secret number.",
        "notes.txt holds a number. Which one?",
    ), _says("42")),
    Task("list the files", (
        "List the files in the current directory.",
        "Which files are here?",
        "What files does this folder hold?",
    ), _says("notes.txt", "todo.txt")),
    Task("first line", (
        "What is the first line of todo.txt?",
        "Read todo.txt and tell me its first line.",
        "todo.txt: what does its first line say?",
    ), _says("milk")),
    Task("write a file", (
        "Write the word hello to a file named greeting.txt.",
        "Create greeting.txt containing hello.",
        "Save 'hello' in greeting.txt.",
    ), _wrote("greeting.txt", "hello")),
    Task("count lines", (
        "How many lines does colors.txt have?",
        "Count the lines of colors.txt.",
        "colors.txt has how many lines?",
    ), _says("3")),
)


@dataclass
class Run:
    task: str
    query: str
    ok: bool
    stop_reason: str
    iterations: int
    seconds: float
    answer: str | None
    calls: list[str]
    stray_files: list[str]


async def run_one(agent_for: Callable[[Path], Any], task: Task, query: str) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "work"
        root.mkdir()
        for name, text in FILES.items():
            (root / name).write_text(text)
        calls: list[str] = []
        began = time.perf_counter()
        async with agent_for(root) as agent:
            stop, iterations, answer = "error", 0, None
            async for event in agent.stream(query, user_id="bench"):
                if event.type == "action":
                    calls.append(f"{event.name}({json.dumps(event.args, sort_keys=True)})")
                elif event.type == "response":
                    answer = event.text
                elif event.type == "end":
                    stop, iterations = event.stop_reason, event.iterations
        seconds = time.perf_counter() - began
        expected = set(FILES) | ({"greeting.txt"} if task.name == "write a file" else set())
        stray = sorted(p.name for p in root.iterdir() if p.name not in expected)
        return Run(task.name, query, task.check(answer, root), stop, iterations, seconds,
                   answer, calls, stray)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one wording per task")
    parser.add_argument("--json", action="store_true", help="one JSON line per run")
    parser.add_argument("--max-iterations", type=int, default=10)
    args = parser.parse_args(argv)

    from cogency import Agent
    from cogency.llm import LocalLLM
    from cogency.tools import files_tools

    llm = LocalLLM()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")

        def agent_for(root: Path) -> Any:
            return Agent(llm=llm, tools=files_tools(root), store=db, approve=True,
                         max_iterations=args.max_iterations)

        try:
            for task in TASKS:
                for query in task.wordings[: 1 if args.quick else None]:
                    run = await run_one(agent_for, task, query)
                    runs.append(run)
                    if args.json:
                        print(json.dumps(run.__dict__, ensure_ascii=False), flush=True)
                    print(f"{'✓' if run.ok else '✗'} {task.name}: {query!r} -> "
                          f"{run.stop_reason} after {run.iterations} in {run.seconds:.1f} s; "
                          f"calls {run.calls[:4]}{'…' if len(run.calls) > 4 else ''}; "
                          f"answer {(run.answer or '')[:80]!r}", file=sys.stderr, flush=True)
        finally:
            await llm.close()
    stops = Counter(run.stop_reason for run in runs)
    summary = {
        "runs": len(runs),
        "succeeded": sum(run.ok for run in runs),
        "stop_reasons": dict(stops),
        "median_iterations": statistics.median(run.iterations for run in runs),
        "median_seconds": round(statistics.median(run.seconds for run in runs), 1),
        "total_seconds": round(sum(run.seconds for run in runs), 1),
        "runs_with_stray_files": sum(bool(run.stray_files) for run in runs),
        "by_task": {task.name: sum(r.ok for r in runs if r.task == task.name) for task in TASKS},
        "load": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    asyncio.run(main())
