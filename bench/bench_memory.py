"""What situated memory costs a run: latency with ``memory=True`` against ``memory=False``.

Both agents use a ScriptedLLM that takes ``--delay`` seconds per call (50 ms by default, a fast
hosted model); learning has its own ScriptedLLM with the same delay. Runs alternate between the
two agents in one process, back to back, so learning of one run overlaps the next run as it
would in a busy chat. Reported: median run latency of each and their ratio, and what learning
costs per interaction: LLM calls (goal: 1, plus 1 per ``synthesis_threshold`` interactions)
and prompt tokens (every message the learning model was sent, counted with the package's
tokenizer). ``--learn-delay`` makes learning slower than a run (a user's tasks then queue up
and are learned together).

    python -m bench.bench_memory            # 60 runs per side
    python -m bench.bench_memory --quick    # 20 runs per side
    python -m bench.bench_memory --storage 1000   # bytes stored per 1,000 learned interactions

``--storage N`` runs N tasks of one user through ``Agent.run`` with memory on, each learning
a mix that exercises every kind of row: a preference whose value keeps changing (history), a
new goal (the bound pushes old ones out: history), a fact re-mentioned every time (one more
source), and reports the bytes the memory tables take (SQLite ``dbstat``: pages, indexes
included) per 1,000 interactions, next to the messages of those tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cogency import Agent
from cogency.memory import Memory
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens

ANSWER = {"secure": True, "objective": "answer", "response": "Here is the answer.", "actions": []}
EXTRACTION = {
    "preferences": [{"key": "language", "value": "Rust"}], "goals": ["ship the release"],
    "expertise": ["systems programming"], "communication_style": "concise",
    "project_context": [{"key": "cogency", "value": "agent framework"}], "interests": [],
    "constraints": [], "success_pattern": "short code examples", "failure_pattern": "",
}
SYNTHESIS = {
    "preferences": [{"key": "language", "value": "Rust"}], "goals": ["ship the release"],
    "expertise_areas": ["systems programming"], "communication_style": "concise",
    "projects": [{"key": "cogency", "value": "agent framework"}], "interests": [],
    "constraints": [], "success_patterns": ["short code examples"], "failure_patterns": [],
}


def _learning_reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return SYNTHESIS if "consolidate" in messages[0]["content"] else EXTRACTION


async def bench(runs: int, delay: float, users: int, threshold: int,
                learn_delay: float | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        plain_store = SQLiteStore(Path(tmp) / "plain.db")
        memory_store = SQLiteStore(Path(tmp) / "memory.db")
        plain = Agent(llm=ScriptedLLM([ANSWER] * (runs + 2), delay=delay), store=plain_store)
        learner = ScriptedLLM([_learning_reply] * (4 * runs),
                              delay=delay if learn_delay is None else learn_delay)
        remembering = Agent(
            llm=ScriptedLLM([ANSWER] * (runs + 2), delay=delay),
            store=memory_store,
            memory=Memory(llm=learner, synthesis_threshold=threshold),
        )
        for agent in (plain, remembering):  # warm up: open the databases, load the tokenizer
            await agent.run("warm up", user_id="warmup")
        await remembering.memory.settle()
        warm_calls = len(learner.calls)
        warm_tokens = _prompt_tokens(learner.calls)

        timings: dict[str, list[float]] = {"off": [], "on": []}
        for index in range(runs):
            user = f"user{index % users}"
            order = [("off", plain), ("on", remembering)]
            if index % 2:
                order.reverse()  # neither side always runs first
            for label, agent in order:
                started = time.perf_counter()
                result = await agent.run(f"question {index}", user_id=user)
                timings[label].append(time.perf_counter() - started)
                assert result.stop_reason == "completed", result
        settle_started = time.perf_counter()
        await remembering.close()
        settle = time.perf_counter() - settle_started
        await plain.close()
        learned = syntheses = 0
        for number in range(users):
            profile = await memory_store.load_profile(f"user{number}")
            assert profile is not None and profile.goals == ["ship the release"]
            learned += profile.interaction_count
            syntheses += profile.synthesis_version - 1
        await plain_store.close()
        await memory_store.close()

    off, on = statistics.median(timings["off"]), statistics.median(timings["on"])
    # Each pair ran back to back, so their ratio cancels most of the machine's load drift.
    paired = statistics.median(a / b for a, b in zip(timings["on"], timings["off"], strict=True))
    return {
        "runs": runs,
        "median_off_ms": off * 1000,
        "median_on_ms": on * 1000,
        "ratio": on / off,
        "paired_ratio": paired,
        "learning_calls_per_interaction": (len(learner.calls) - warm_calls) / runs,
        "learning_prompt_tokens_per_interaction":
            (_prompt_tokens(learner.calls) - warm_tokens) / runs,
        "syntheses": syntheses,
        "interactions_learned": learned,
        "settle_on_close_ms": settle * 1000,
    }


async def storage(interactions: int) -> dict[str, float]:
    """Bytes of the memory tables after ``interactions`` learned tasks (see the docstring)."""

    def extraction(messages: list[dict[str, Any]]) -> dict[str, Any]:
        prompt = messages[0]["content"]
        if "consolidate" in prompt:
            return _keep_profile(prompt)
        number = int(prompt.split("Query: question ", 1)[1].split()[0])
        return {**EXTRACTION,
                "preferences": [{"key": "editor", "value": ("vim", "helix", "emacs")[number % 3]}],
                "goals": [f"goal number {number}"]}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "storage.db"
        store = SQLiteStore(path)
        learner = ScriptedLLM(_endless(extraction))
        agent = Agent(llm=ScriptedLLM(_endless(ANSWER)), store=store,
                      memory=Memory(llm=learner))
        for number in range(interactions):
            await agent.run(f"question {number} about my editor", user_id="alice")
            await agent.memory.settle()
        await agent.close()
        await store.close()
        import sqlite3

        db = sqlite3.connect(path)
        sizes = dict(db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))
        current, history = db.execute(
            "SELECT SUM(superseded_at IS NULL), SUM(superseded_at IS NOT NULL) "
            "FROM profile_entries").fetchone()
        count = db.execute("SELECT json_extract(profile_data, '$.interaction_count') "
                           "FROM user_profiles").fetchone()[0]
        db.close()
    memory = sum(size for name, size in sizes.items()
                 if name.startswith(("profile_entries", "learning_queue")))
    messages = sum(size for name, size in sizes.items()
                   if name.startswith(("conversation_messages", "sqlite_autoindex_conversation_m")))
    scale = 1000 / interactions
    return {"interactions": count, "memory_bytes_per_1000": memory * scale,
            "message_bytes_per_1000": messages * scale, "current_entries": current,
            "history_entries": history}


def _keep_profile(prompt: str) -> dict[str, Any]:
    """A consolidation that keeps the profile it is shown."""
    import json

    return json.loads(prompt.split("<profile>\n", 1)[1].split("\n</profile>", 1)[0])


def _endless(item: Any) -> Any:
    while True:
        yield item


def _prompt_tokens(calls: list[list[dict[str, Any]]]) -> int:
    return sum(count_tokens(message["content"]) for call in calls for message in call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 runs per side instead of 60")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per LLM call")
    parser.add_argument("--learn-delay", type=float, default=None,
                        help="seconds per learning call (default: --delay); longer than a run, "
                             "a user's tasks queue up while one is learned")
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--threshold", type=int, default=3, help="synthesis_threshold")
    parser.add_argument("--storage", type=int, default=0, metavar="N",
                        help="measure the bytes stored for N learned interactions instead")
    args = parser.parse_args()
    if args.storage:
        stored = asyncio.run(storage(args.storage))
        print(f"interactions learned           {stored['interactions']}")
        print(f"profile entries                {stored['current_entries']} current, "
              f"{stored['history_entries']} history")
        print(f"memory tables per 1,000        {stored['memory_bytes_per_1000'] / 1024:.0f} KiB "
              "(profile_entries and learning_queue, with their indexes)")
        print(f"their messages per 1,000       {stored['message_bytes_per_1000'] / 1024:.0f} KiB "
              "(for scale)")
        return
    runs = args.runs or (20 if args.quick else 60)
    figures = asyncio.run(bench(runs, args.delay, args.users, args.threshold, args.learn_delay))
    print(f"runs per side                  {figures['runs']}")
    print(f"median run, memory=False       {figures['median_off_ms']:.1f} ms")
    print(f"median run, memory=True        {figures['median_on_ms']:.1f} ms")
    print(f"ratio of medians on/off        {figures['ratio']:.3f}  (target <= 1.05)")
    print(f"median of paired ratios        {figures['paired_ratio']:.3f}")
    calls = round(figures["learning_calls_per_interaction"] * figures["runs"])
    print(
        f"learning calls per interaction {figures['learning_calls_per_interaction']:.3f}  "
        f"({calls - figures['syntheses']} extractions + {figures['syntheses']} consolidations "
        f"for {figures['runs']} interactions; at most 1 + 1/{args.threshold} = "
        f"{1 + 1 / args.threshold:.3f}, less when a user's tasks are learned together)"
    )
    print(f"learning prompt tokens per interaction "
          f"{figures['learning_prompt_tokens_per_interaction']:.0f}")
    print(f"interactions learned           {figures['interactions_learned']}")
    print(f"close() settling learning      {figures['settle_on_close_ms']:.1f} ms")
    print("absolute figures are noisy on a shared machine; the ratio is what to compare")


if __name__ == "__main__":
    main()
