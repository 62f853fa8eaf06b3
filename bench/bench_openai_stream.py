"""Time to the first piece of a streamed answer against time to the whole answer, through
``cogency serve``'s OpenAI endpoints, with the offline model.

A ``cogency serve --llm local --no-memory`` process (SmolLM2-135M-Instruct on llama.cpp) is
asked questions of :data:`bench.offline_questions.QUESTIONS` with the official ``openai``
client over loopback HTTP, streaming: ``/v1/chat/completions`` (seconds from sending the
request to the first chunk with content, and to the end of the stream) and ``/v1/responses``
(to the first ``response.output_text.delta``, and to ``response.completed``), the two
alternating, each going first half the time. Reported: medians over every question and run.

    python -m bench.bench_openai_stream              # 20 questions × 3 runs
    python -m bench.bench_openai_stream --quick      # 5 questions × 1 run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_offline import _load
from bench.bench_service import _keys, _Server
from bench.offline_questions import QUESTIONS


def chat(client, question: str) -> tuple[float, float]:
    started = time.perf_counter()
    first = None
    for chunk in client.chat.completions.create(
            model="cogency", stream=True, messages=[{"role": "user", "content": question}]):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    whole = time.perf_counter() - started
    return (first if first is not None else whole), whole


def responses(client, question: str) -> tuple[float, float]:
    started = time.perf_counter()
    first = None
    for event in client.responses.create(model="cogency", stream=True, input=question):
        if first is None and event.type == "response.output_text.delta":
            first = time.perf_counter() - started
    whole = time.perf_counter() - started
    return (first if first is not None else whole), whole


def main(argv: list[str] | None = None) -> None:
    import openai

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 questions, 1 run")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    count, runs = (5, 1) if args.quick else (args.questions, args.runs)
    step = max(1, len(QUESTIONS) // count)
    questions = [q.text for q in QUESTIONS[::step][:count]]
    times: dict[str, list[float]] = {f"{way}_{part}": [] for way in ("chat", "responses")
                                     for part in ("first", "whole")}
    load = _load()
    with tempfile.TemporaryDirectory() as workdir:
        db = str(Path(workdir) / "stream.db")
        [key] = asyncio.run(_keys(db, 1))
        server = _Server(db, 0.0, workdir, llm="local")
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, timeout=300)
            chat(client, "Say hello.")  # the model's first load and warm-up, untimed
            for number in range(runs * len(questions)):
                question = questions[number % len(questions)]
                ways = [("chat", chat), ("responses", responses)]
                if number % 2:
                    ways.reverse()
                for way, ask in ways:
                    first, whole = ask(client, question)
                    times[f"{way}_first"].append(first)
                    times[f"{way}_whole"].append(whole)
                print(f"[{number + 1}/{runs * len(questions)}] chat "
                      f"{times['chat_first'][-1]:.3f} / {times['chat_whole'][-1]:.3f} s, "
                      f"responses {times['responses_first'][-1]:.3f} / "
                      f"{times['responses_whole'][-1]:.3f} s", file=sys.stderr, flush=True)
        finally:
            server.stop()
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"`cogency serve --llm local`, {len(questions)} questions × {runs} runs, medians of "
          f"{len(times['chat_first'])} answers per endpoint (load average {load} at start, "
          f"{_load()} at end):")
    for way in ("chat", "responses"):
        print(f"  {way:<10} first content {med[f'{way}_first']:.3f} s, whole answer "
              f"{med[f'{way}_whole']:.3f} s (first ÷ whole "
              f"{med[f'{way}_first'] / med[f'{way}_whole']:.2f})")


if __name__ == "__main__":
    main()
