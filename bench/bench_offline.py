"""The offline model through Cogency against the same model asked plainly.

One llama.cpp server (``LocalLLM``, SmolLM2-135M-Instruct by default) answers every question
of :data:`bench.offline_questions.QUESTIONS` twice: (a) as a plain chat request (the question
as the only message, no system prompt, ``temperature`` 0, the same token limit the agent's
plain answers get) and (b) through ``Agent(llm=LocalLLM()).run`` (what ``llm="local"``
builds), on a fresh SQLite file. The two alternate, each going first half the time. Reported:
both accuracies, their ratio (goal: at least 1), the median seconds per answer of each, and
accuracy by kind of question.

    python -m bench.bench_offline                 # every question, prints the table
    python -m bench.bench_offline --quick         # 10 questions
    python -m bench.bench_offline --output docs/benchmarks.md   # also rewrites its section
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.offline_questions import QUESTIONS, Question
from cogency import Agent
from cogency.llm import LocalLLM
from cogency.llm._local import ANSWER_TOKENS

BEGIN, END = "<!-- bench_offline:begin -->", "<!-- bench_offline:end -->"


@dataclass
class Side:
    """One way of asking: what it answered, whether right, how long each took."""

    answers: list[str | None] = field(default_factory=list)
    right: list[bool] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(self.right) / len(self.right) if self.right else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else 0.0


async def ask_plainly(llm: LocalLLM, question: str) -> str:
    """The question as one chat request to the same server, no framework."""
    await llm.start()
    import openai

    async with openai.AsyncOpenAI(api_key="none", base_url=llm.base_url,
                                  timeout=llm.timeout) as client:
        reply = await client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": question}],
            max_tokens=ANSWER_TOKENS, temperature=0,
        )
    return reply.choices[0].message.content or ""


async def compare(
    llm: LocalLLM, questions: tuple[Question, ...] | list[Question], store: str,
    progress: Any = None,
) -> tuple[Side, Side]:
    """Every question asked plainly and through the agent; ``(plain, agent)``."""
    plain, agent_side = Side(), Side()
    async with Agent(llm=llm, store=store) as agent:
        for index, question in enumerate(questions):

            async def through_agent(q: Question = question) -> str | None:
                return (await agent.run(q.text, user_id="bench")).response

            async def directly(q: Question = question) -> str | None:
                return await ask_plainly(llm, q.text)

            order = [(plain, directly), (agent_side, through_agent)]
            if index % 2:
                order.reverse()
            for side, ask in order:
                started = time.perf_counter()
                answer = await ask()
                side.seconds.append(time.perf_counter() - started)
                side.answers.append(answer)
                side.right.append(question.check(answer))
            if progress is not None:
                print(f"[{index + 1}/{len(questions)}] {question.text!r}: plain "
                      f"{'✓' if plain.right[-1] else '✗'} {_short(plain.answers[-1])} | agent "
                      f"{'✓' if agent_side.right[-1] else '✗'} {_short(agent_side.answers[-1])}",
                      file=progress, flush=True)
    return plain, agent_side


def _short(text: str | None, limit: int = 70) -> str:
    text = " ".join((text or "").split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def report(questions: list[Question], plain: Side, agent: Side, load: tuple[str, str]) -> str:
    """The Markdown section for docs/benchmarks.md."""
    ratio = agent.accuracy / plain.accuracy if plain.accuracy else float("inf")
    kinds = sorted({q.kind for q in questions}, key=[q.kind for q in questions].index)
    lines = [
        BEGIN,
        "## The offline model: Cogency against the same model asked plainly",
        "",
        f"Measured on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC with "
        f"`python -m bench.bench_offline`: {len(questions)} simple questions with checkable "
        "answers (`bench/offline_questions.py`), each asked of SmolLM2-135M-Instruct on one "
        "llama.cpp server (a) as a plain chat request (the question alone, temperature 0, "
        f"at most {ANSWER_TOKENS} tokens) and (b) through `Agent(llm=\"local\").run`. An answer is "
        "right when the first candidate it names (a number, a city, a colour…) is the right "
        "one.",
        "",
        "| | asked plainly | through Cogency |",
        "|---|---:|---:|",
        f"| accuracy | {plain.accuracy:.0%} ({sum(plain.right)}/{len(questions)}) | "
        f"{agent.accuracy:.0%} ({sum(agent.right)}/{len(questions)}) |",
        f"| ratio, Cogency ÷ plain (goal ≥ 1.0) | | **{ratio:.2f}** |",
        f"| median time per answer (s) | {plain.median:.2f} | {agent.median:.2f} |",
    ]
    for kind in kinds:
        picked = [i for i, q in enumerate(questions) if q.kind == kind]
        lines.append(
            f"| {kind} ({len(picked)}) | {sum(plain.right[i] for i in picked)} right | "
            f"{sum(agent.right[i] for i in picked)} right |"
        )
    lines += [
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical "
        f"cores, shared (load average {load[0]} at start, {load[1]} at end), so times are "
        "noisy; accuracy is deterministic at temperature 0 on one machine.",
        "",
        "Why Cogency does not do worse: a step that can only answer (no tools) is asked of the "
        "small model as plain text under a short system prompt, and the step is made of that "
        "text. Made to write the JSON step itself, the same model copied the contract's field "
        "descriptions as its answers, wrote \"json\" as an answer, or ran out of tokens inside "
        "the object. With tools, a grammar from a short step schema constrains every reply.",
        END,
    ]
    return "\n".join(lines) + "\n"


def _load() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "n/a"


def write_section(path: Path, section: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace a benchmark's section of ``path`` (or append it): this one's by default."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 questions")
    parser.add_argument("--output", type=Path, help="rewrite this file's bench_offline section")
    args = parser.parse_args(argv)
    questions = list(QUESTIONS[:: max(1, len(QUESTIONS) // 10)] if args.quick else QUESTIONS)
    llm = LocalLLM()
    start_load = _load()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain, agent = await compare(llm, questions, str(Path(tmp) / "bench.db"),
                                         progress=sys.stderr)
    finally:
        await llm.close()
    section = report(questions, plain, agent, (start_load, _load()))
    print(section)
    if args.output:
        write_section(args.output, section)


if __name__ == "__main__":
    asyncio.run(main())
