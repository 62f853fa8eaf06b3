"""Time to the first piece of the answer against time to the whole answer, with the offline model.

One llama.cpp server (``LocalLLM``, SmolLM2-135M-Instruct) answers questions of
:data:`bench.offline_questions.QUESTIONS` (a) through ``Agent.stream`` (what an HTTP endpoint
streams from): seconds from the call to the first ``response_delta`` event, and to the
``response`` event (the whole answer, stored); and (b) as a plain streamed chat request to the
same server, no framework (the question alone, temperature 0, the same token limit): seconds
to its first content piece and to its end. The two alternate, each going first half the
time. Reported: the medians over every question and run, and the ratios.

    python -m bench.bench_answer_stream                  # 20 questions × 3 runs
    python -m bench.bench_answer_stream --quick          # 5 questions × 1 run
    python -m bench.bench_answer_stream --output docs/benchmarks.md   # also its section
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_offline import _load, write_section
from bench.offline_questions import QUESTIONS
from cogency import Agent
from cogency.llm import LocalLLM
from cogency.llm._local import ANSWER_TOKENS

BEGIN, END = "<!-- bench_answer_stream:begin -->", "<!-- bench_answer_stream:end -->"


async def through_agent(agent: Agent, question: str) -> tuple[float, float]:
    """Seconds to the first answer delta and to the response event."""
    started = time.perf_counter()
    first = whole = None
    async for event in agent.stream(question, user_id="bench"):
        if event.type == "response_delta" and first is None:
            first = time.perf_counter() - started
        elif event.type == "response":
            whole = time.perf_counter() - started
    assert first is not None and whole is not None, "the answer did not stream"
    return first, whole


async def plainly(llm: LocalLLM, question: str) -> tuple[float, float]:
    """Seconds to the first content piece and to the end of a plain streamed request."""
    import openai

    async with openai.AsyncOpenAI(api_key="none", base_url=llm.base_url,
                                  timeout=llm.timeout) as client:
        started = time.perf_counter()
        first = None
        stream = await client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": question}],
            max_tokens=ANSWER_TOKENS, temperature=0, stream=True,
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
        whole = time.perf_counter() - started
    return first if first is not None else whole, whole


async def measure(questions: list[str], runs: int, store: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"first": [], "whole": [], "plain_first": [],
                                     "plain_whole": []}
    llm = LocalLLM()
    try:
        await llm.start()
        async with Agent(llm=llm, store=store) as agent:
            for number in range(runs * len(questions)):
                question = questions[number % len(questions)]
                sides = [("", lambda q=question: through_agent(agent, q)),
                         ("plain_", lambda q=question: plainly(llm, q))]
                if number % 2:
                    sides.reverse()
                for prefix, ask in sides:
                    first, whole = await ask()
                    times[prefix + "first"].append(first)
                    times[prefix + "whole"].append(whole)
                print(f"[{number + 1}/{runs * len(questions)}] agent {times['first'][-1]:.3f}"
                      f" / {times['whole'][-1]:.3f} s, plain {times['plain_first'][-1]:.3f} / "
                      f"{times['plain_whole'][-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        await llm.close()
    return times


def report(times: dict[str, list[float]], questions: int, runs: int,
           load: tuple[str, str]) -> str:
    med = {name: statistics.median(values) for name, values in times.items()}
    lines = [
        BEGIN,
        "## The answer, streamed: time to its first piece",
        "",
        f"Measured on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC with "
        f"`python -m bench.bench_answer_stream`: {questions} questions of "
        f"`bench/offline_questions.py` × {runs} runs, asked of SmolLM2-135M-Instruct on one "
        "llama.cpp server (a) through `Agent.stream` with `llm=\"local\"` and (b) as a plain "
        "streamed chat request (the question alone, temperature 0, at most "
        f"{ANSWER_TOKENS} tokens), alternating. Medians over {len(times['first'])} answers.",
        "",
        "| | first piece of the answer (s) | whole answer (s) | first ÷ whole |",
        "|---|---:|---:|---:|",
        f"| through Cogency (`response_delta`, then `response`) | {med['first']:.3f} | "
        f"{med['whole']:.3f} | {med['first'] / med['whole']:.2f} |",
        f"| asked plainly (first content chunk, end of stream) | {med['plain_first']:.3f} | "
        f"{med['plain_whole']:.3f} | {med['plain_first'] / med['plain_whole']:.2f} |",
        f"| ratio, Cogency ÷ plain | {med['first'] / med['plain_first']:.2f} | "
        f"{med['whole'] / med['plain_whole']:.2f} | |",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical "
        f"cores, shared (load average {load[0]} at start, {load[1]} at end): times are noisy. "
        "The whole answer through Cogency includes storing it (the `response` event comes "
        "after the save); the system prompt it sends is longer than the bare question.",
        END,
    ]
    return "\n".join(lines) + "\n"


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 questions, 1 run")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, help="rewrite this file's section")
    args = parser.parse_args(argv)
    count, runs = (5, 1) if args.quick else (args.questions, args.runs)
    step = max(1, len(QUESTIONS) // count)
    questions = [q.text for q in QUESTIONS[::step][:count]]
    start_load = _load()
    with tempfile.TemporaryDirectory() as tmp:
        times = await measure(questions, runs, str(Path(tmp) / "bench.db"))
    section = report(times, len(questions), runs, (start_load, _load()))
    print(section)
    if args.output:
        write_section(args.output, section, BEGIN, END)


if __name__ == "__main__":
    asyncio.run(main())
