"""Storage benchmark: append cost vs history length, file size vs text held, import time.

    python -m bench.bench_storage            # 10 / 1,000 / 100,000 messages
    python -m bench.bench_storage --quick    # 10 / 1,000 / 10,000, fewer samples

1. One conversation grows to 10, 1,000 and 100,000 messages (built with bulk ``SaveBatch``
   writes through the store). At each point: the median of many "``add_message`` + ``autosave``"
   calls, each also changing the workspace (the agent's usual save). Target: last/first ≤ 1.3.
2. The database file (checkpointed, VACUUMed) against the UTF-8 bytes of the message text it
   holds, with realistic message sizes. Target ≤ 2×.
3. ``import cogency`` in a fresh interpreter, minus a bare interpreter start.

Absolute figures are noisy on a shared machine; the ratios are measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cogency.state import State, add_message, autosave
from cogency.storage import SaveBatch, SQLiteStore
from cogency.tokens import count_tokens

# Realistic sizes (characters): a user turn, the model's JSON reply, a tool result.
MESSAGE_SIZES = (("user", 200), ("assistant", 800), ("tool", 2_000))
WORDS = (
    "the agent reads file config value error test user request python data result function "
    "module import return state conversation workspace memory profile task tool call output "
    "because when then however which could should would number list string parse build run"
).split()


def make_text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


class Corpus:
    """Pre-made messages (text and token count), reused round-robin so building is fast."""

    def __init__(self, seed: int = 7, variants: int = 50) -> None:
        rng = random.Random(seed)
        self.items = []
        for _ in range(variants):
            for role, size in MESSAGE_SIZES:
                text = make_text(rng, size)
                self.items.append((role, text, count_tokens(text)))
        self.position = 0

    def next(self, task_id: str) -> dict:
        role, text, tokens = self.items[self.position % len(self.items)]
        self.position += 1
        return {"role": role, "content": text, "task_id": task_id, "tokens": tokens,
                "created_at": "2025-01-01T00:00:00.000000+00:00"}


async def grow(store: SQLiteStore, state: State, corpus: Corpus, count: int,
               batch: int = 5_000) -> None:
    """Append ``count`` messages in bulk batches (one transaction each)."""
    while count > 0:
        size = min(batch, count)
        await store.save(SaveBatch(
            user_id=state.user_id, task_id=state.task_id,
            conversation_id=state.conversation.conversation_id, expected_version=state.version,
            messages=[corpus.next(state.task_id) for _ in range(size)],
        ))
        count -= size


async def time_appends(state: State, corpus: Corpus, samples: int) -> float:
    """Median seconds of add_message + autosave (with a workspace change)."""
    times = []
    for n in range(samples):
        role, text, _ = corpus.items[n % len(corpus.items)]
        start = time.perf_counter()
        add_message(state, role, text)
        state.workspace.discoveries = f"step {n}"
        await autosave(state)
        times.append(time.perf_counter() - start)
        state.conversation.messages.clear()  # the runtime window is not what we measure
        state.execution.messages.clear()
    return statistics.median(times)


def message_count(path: Path, conversation_id: str) -> int:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(
            "SELECT count(*) FROM conversation_messages WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()[0]
    finally:
        connection.close()


async def bench_appends(
    path: Path, points: tuple[int, ...], samples: int
) -> tuple[dict[int, float], dict[int, float]]:
    """Medians per history length: one conversation grown in steps, then an interleaved check.

    The check holds one conversation per length in the same file and appends to them in
    shuffled rounds, so the machine's load falls on every length alike.
    """
    corpus = Corpus()
    store = SQLiteStore(path)
    grown: dict[int, float] = {}
    try:
        state = await State.start_task("benchmark", "bench-user", store=store)
        held = 0
        for point in points:
            await grow(store, state, corpus, point - held)
            grown[point] = await time_appends(state, corpus, samples)
            held = message_count(path, state.conversation.conversation_id)

        states = {points[-1]: state}
        for point in points[:-1]:
            states[point] = await State.start_task("benchmark", "bench-user", store=store)
            await grow(store, states[point], corpus, point)
        times: dict[int, list[float]] = {point: [] for point in points}
        rng = random.Random(3)
        order = list(points)
        for _ in range(samples):
            rng.shuffle(order)
            for point in order:
                times[point].append(await time_appends(states[point], corpus, 1))
        interleaved = {point: statistics.median(times[point]) for point in points}
    finally:
        await store.close()
    return grown, interleaved


def file_size_report(path: Path) -> dict[str, float]:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("VACUUM")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        messages, text_bytes = connection.execute(
            "SELECT count(*), sum(length(CAST(content AS BLOB))) FROM conversation_messages"
        ).fetchone()
    finally:
        connection.close()
    size = path.stat().st_size
    wal = Path(f"{path}-wal")
    size_wal = wal.stat().st_size if wal.exists() else 0
    return {"file_bytes": size, "wal_bytes": size_wal, "text_bytes": text_bytes,
            "messages": messages, "page_size": page_size, "ratio": size / text_bytes}


def median_run(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def import_time(runs: int) -> tuple[float, float]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env_python = [sys.executable, "-c"]
    os.environ["PYTHONPATH"] = src + os.pathsep + os.environ.get("PYTHONPATH", "")
    baseline = median_run([*env_python, "pass"], runs)
    with_cogency = median_run([*env_python, "import cogency"], runs)
    return with_cogency, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller history, fewer samples")
    args = parser.parse_args()
    points = (10, 1_000, 10_000) if args.quick else (10, 1_000, 100_000)
    samples = 60 if args.quick else 300

    sizes = ", ".join(f"{role} {size}" for role, size in MESSAGE_SIZES)
    print(f"message sizes (chars, round-robin): {sizes}; ascii-heavy English-like words")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        grown, interleaved = asyncio.run(bench_appends(path, points, samples))
        for title, medians in (
            (f"one conversation grown in steps, median of {samples}", grown),
            (f"one conversation per length, interleaved rounds, median of {samples}", interleaved),
        ):
            print(f"\nappend + autosave (ms), {title}:")
            for point, seconds in medians.items():
                print(f"  at message {point:>7,}: {seconds * 1000:8.3f}")
            first, last = medians[points[0]], medians[points[-1]]
            print(f"  ratio {points[-1]:,}/{points[0]}: {last / first:.2f}  (target <= 1.3)")

        report = file_size_report(path)
        print(f"\nfile size after checkpoint + VACUUM (page size {report['page_size']}):")
        print(f"  {report['messages']:,} messages, {report['text_bytes'] / 1e6:.2f} MB of text, "
              f"file {report['file_bytes'] / 1e6:.2f} MB (+ wal {report['wal_bytes']} B)")
        print(f"  ratio file/text: {report['ratio']:.2f}  (target <= 2.0)")

    runs = 5 if args.quick else 9
    with_cogency, baseline = import_time(runs)
    print(f"\nimport cogency, median of {runs} fresh processes: {with_cogency * 1000:.0f} ms, "
          f"bare python {baseline * 1000:.0f} ms, import cost {(with_cogency - baseline) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
