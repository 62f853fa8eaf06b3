"""PostgreSQL: how task throughput scales with worker processes, and what a turn costs.

1. Tasks per second (and worker CPU per task) with 1, 2 and 4 worker processes on one
   PostgreSQL database. Each task is one tool call and an answer from a ScriptedLLM with 20 ms
   latency per call; each worker runs 4 tasks at a time. Two workloads: "own users" (each
   worker serves its own 4 users, one conversation each, as a service's replicas serving many
   users) and "shared" (every worker's tasks go to the same 4 conversations, so with N workers
   each conversation has N tasks appending at once: the worst case, where appends to one
   conversation queue behind each other's durable commit, since messages are numbered in
   order under the conversation's row lock). Workers connect and warm up first, then start
   together; throughput is all tasks over the span from the first start to the last end.
   Reported: medians over runs, and the scaling: the median of each run's rate against one
   worker's in the same run.
2. The per-turn cost of a durable conversation on PostgreSQL next to SQLite, in this process,
   with the same workload: a conversation of many turns (each a task with a direct answer from
   an instant model), backends alternated turn by turn; the median turn and the
   PostgreSQL/SQLite ratio, next to one bare PostgreSQL round trip measured right after.
   PostgreSQL is measured twice: with the server's default durable commits (each waits for a
   disk flush) and with ``synchronous_commit=False``, the durability of the SQLite store's
   WAL + synchronous=NORMAL (safe from process crashes; an OS crash may lose the last commits).
   Then turn 10 against turn 1,000 (``--quick``: 60), whether a turn slows as history grows:
   turns of the long conversation alternated with turns 5-15 of young ones (see per_turn).
3. Round trips to PostgreSQL of one one-step turn (a task answered at once) in a warm store,
   counted at the driver, by store call.

The machine has 2 cores shared with other work: absolute figures are noisy; ratios measured
in one run are the figures to compare.

    python -m bench.bench_postgres            # full
    python -m bench.bench_postgres --quick    # a short run
    COGENCY_BENCH_PG=postgresql://user@host:5432/postgres  # the server (default: local)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cogency import Agent, tool
from cogency.storage import PostgresStore, SQLiteStore
from cogency.testing import ScriptedLLM

ADMIN_DSN = os.environ.get("COGENCY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
LATENCY = 0.02
CONCURRENCY = 4
USERS = 4


@tool
def note(marker: str) -> str:
    """Note a marker."""
    return f"noted {marker}"


def _script(marker: str) -> list[dict]:
    return [
        {"secure": True, "response": None,
         "actions": [{"name": "note", "args": {"marker": marker}}]},
        {"response": f"done {marker}", "actions": []},
    ]


# -- databases ------------------------------------------------------------------------------


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    import asyncpg

    name = f"cogency_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    parts = urlsplit(ADMIN_DSN)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))
    finally:
        admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


# -- part 1: worker processes ----------------------------------------------------------------


async def worker(dsn: str, worker_id: int, tasks: int, shared: bool) -> None:
    """One worker process: warm up, say ready, wait for go, run ``tasks``, report times.
    ``shared``: its users (and conversations) are every worker's, not its own."""
    store = PostgresStore(dsn, max_size=CONCURRENCY + 1)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> None:
        marker = f"w{worker_id}t{index}"
        user = f"u{index % USERS}" if shared else f"w{worker_id}u{index % USERS}"
        async with gate:
            agent = Agent(llm=ScriptedLLM(_script(marker), delay=LATENCY), tools=[note],
                          store=store)
            result = await agent.run(f"task {marker}", user, f"conv-{user}")
            assert result.stop_reason == "completed", result

    await one(-1)  # connect, migrate check, warm caches
    print("ready", flush=True)
    sys.stdin.readline()
    start, cpu = time.time(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(tasks)))
    end, cpu = time.time(), time.process_time() - cpu
    await store.close()
    print(json.dumps({"start": start, "end": end, "tasks": tasks, "cpu": cpu}), flush=True)


def run_workers(dsn: str, processes: int, tasks: int, shared: bool) -> tuple[float, float]:
    """Tasks per second of ``processes`` workers started together, and worker CPU ms per task."""
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.bench_postgres", "--worker", dsn, str(n), str(tasks),
             "shared" if shared else "own"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for n in range(processes)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"a worker failed (exit {child.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    done = sum(r["tasks"] for r in reports)
    return done / span, 1000 * sum(r["cpu"] for r in reports) / done


async def throughput(tasks: int, runs: int, shared: bool) -> dict[int, tuple[float, float, float]]:
    """Per worker count: the median tasks per second, worker CPU ms per task, and scaling (the
    median over runs of the rate against one worker's in the same run: the machine's slow
    minutes, when disk flushes take ten times longer, hit a run's counts alike)."""
    results: dict[int, list[tuple[float, float]]] = {1: [], 2: [], 4: []}
    for _ in range(runs):
        for processes in results:  # interleaved, so load changes hit every count alike
            async with fresh_database() as dsn:
                figures = await asyncio.to_thread(run_workers, dsn, processes, tasks, shared)
            results[processes].append(figures)
    return {
        p: (statistics.median(r for r, _ in runs_), statistics.median(c for _, c in runs_),
            statistics.median(r / one[0] for (r, _), one in zip(runs_, results[1])))
        for p, runs_ in results.items()
    }


async def round_trip(store: PostgresStore, count: int = 200) -> float:
    """Median milliseconds of one ``SELECT 1`` through the store's pool: the floor under
    every statement on this machine right now."""
    pool = await store._ready()
    times = []
    async with pool.acquire() as db:
        for _ in range(count):
            began = time.perf_counter()
            await db.fetchval("SELECT 1")
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


# -- part 3: round trips -----------------------------------------------------------------------


async def round_trips(dsn: str, turns: int = 3, *, memory: bool = False) -> dict[str, int]:
    """Round trips to the server during one one-step turn, by the store call that made them
    (after ``turns`` warm-up turns in the same conversation) on database ``dsn``: counted at
    the store's sockets, as the writes that follow an answer (what is written before the
    server answers travels together: one round trip).

    ``memory``: with memory on (``Memory`` learning with a scripted model): the turn also
    reads the profile for the prompt (``load_profile``), and its completion queues its
    learning. The learning itself (claimed and done in the background after the turn) is
    held until the turn is counted, then let through; it is not part of the turn."""
    from asyncio import selector_events

    from cogency import Memory

    sent = [0]
    answered: dict[int, bool] = {}
    transport = selector_events._SelectorSocketTransport
    original, original_read = transport.write, transport._read_ready__data_received

    def write(self, data):  # type: ignore[no-untyped-def]
        if answered.get(id(self), True):
            sent[0] += 1
        answered[id(self)] = False
        return original(self, data)

    def read(self):  # type: ignore[no-untyped-def]
        answered[id(self)] = True
        return original_read(self)

    phases: dict[str, int] = {}
    # One connection: the turns all go over the one whose statements the warm-up turns
    # prepared (with more, the counted turn could take one that only learning used, and
    # count preparing its statements; a server's long-lived connections are all warm).
    store = PostgresStore(dsn, max_size=1)
    names = ["begin_task", "load_messages", "save", "claim_task", "release_task"]
    if memory:
        names.append("load_profile")
    for name in names:
        method = getattr(store, name)

        async def counted(*args, _method=method, _name=name, **options):
            before = sent[0]
            try:
                return await _method(*args, **options)
            finally:
                phases[_name] = phases.get(_name, 0) + sent[0] - before

        setattr(store, name, counted)
    held = asyncio.Event()  # background learning waits while a turn is counted
    for name in ("claim_learning", "prune_history"):
        method = getattr(store, name)

        async def gated(*args, _method=method, **options):
            await held.wait()
            return await _method(*args, **options)

        setattr(store, name, gated)
    learned = {"preferences": [], "goals": [], "expertise": [], "communication_style": "",
               "project_context": [], "interests": [], "constraints": [],
               "success_pattern": "", "failure_pattern": ""}
    learner = Memory(llm=ScriptedLLM([learned] * (2 * turns + 2)), synthesis_threshold=100) \
        if memory else None
    transport.write, transport._read_ready__data_received = write, read
    try:
        conversation = None
        for turn in range(turns + 1):
            phases.clear()
            held.clear()
            before = sent[0]
            agent = Agent(llm=ScriptedLLM([{"secure": True, "response": f"answer {turn}",
                                            "actions": []}]), store=store,
                          memory=learner or False)
            result = await agent.run(f"turn {turn}", "alice", conversation)
            conversation = result.conversation_id
            counted = {**phases, "total": sent[0] - before}
            held.set()
            if agent.memory is not None:
                await agent.memory.close()  # learns the turn, outside the count
    finally:
        transport.write, transport._read_ready__data_received = original, original_read
        await store.close()
    return counted


# -- part 2: per-turn cost -------------------------------------------------------------------


def _one_turn(store: Any, conversation: str | None, turn: int) -> Awaitable[Any]:
    agent = Agent(llm=ScriptedLLM([{"secure": True, "response": f"answer {turn}",
                                    "actions": []}]), store=store)
    return agent.run(f"turn {turn}", "alice", conversation)


async def _timed_turn(store: Any, conversation: str | None, turn: int) -> tuple[str, float]:
    began = time.perf_counter()
    result = await _one_turn(store, conversation, turn)
    return result.conversation_id, (time.perf_counter() - began) * 1000


async def per_turn(turns: int, pairs: int) -> dict[str, dict[str, float]]:
    """Per-turn milliseconds on each backend, in two phases, backends alternated turn by turn.

    1. One conversation grows to ``turns`` turns: the median of all its turns.
    2. Turn 10 against turn ``turns``: each backend alternates a turn of that long conversation
       with a turn of a young one (a new conversation every 20 turns, timed at its turns 5 to
       15), ``pairs`` times. Early and late turns run side by side, so a slow minute of the
       machine (a disk flush takes 1 ms one minute and 10 the next) slows both alike; timing
       turn 10 first and turn 1,000 minutes later compares two moments as much as two turns.
    """
    with tempfile.TemporaryDirectory() as tmp:
        async with fresh_database() as dsn:
            stores = {
                "postgres": PostgresStore(dsn),
                # The same durability as the SQLite store's WAL + synchronous=NORMAL.
                "postgres-async-commit": PostgresStore(dsn, synchronous_commit=False),
                "sqlite": SQLiteStore(Path(tmp) / "b.db"),
            }
            times: dict[str, list[float]] = {name: [] for name in stores}
            early: dict[str, list[float]] = {name: [] for name in stores}
            late: dict[str, list[float]] = {name: [] for name in stores}
            long: dict[str, str | None] = {name: None for name in stores}
            young: dict[str, str | None] = {name: None for name in stores}
            try:
                for turn in range(turns + 1):
                    for name, store in stores.items():
                        long[name], elapsed = await _timed_turn(store, long[name], turn)
                        if turn:  # turn 0 opens the store
                            times[name].append(elapsed)
                for pair in range(pairs):
                    age = pair % 20  # the young conversation's turn
                    for name, store in stores.items():
                        if age == 0:
                            young[name] = None
                        young[name], elapsed = await _timed_turn(store, young[name], age)
                        if 5 <= age <= 15:
                            early[name].append(elapsed)
                        long[name], elapsed = await _timed_turn(store, long[name],
                                                                turns + 1 + pair)
                        late[name].append(elapsed)
                rtt = await round_trip(stores["postgres"])
            finally:
                for store in stores.values():
                    await store.close()
    figures = {
        name: {
            "median": statistics.median(values),
            "early": statistics.median(early[name]),
            "late": statistics.median(late[name]),
        }
        for name, values in times.items()
    }
    figures["postgres"]["round_trip"] = rtt
    return figures


async def main(quick: bool) -> None:
    tasks, runs, turns, pairs = (20, 1, 60, 60) if quick else (100, 7, 1000, 400)
    print(f"PostgreSQL benchmark ({'quick' if quick else 'full'}): {os.cpu_count()} cores, "
          "shared and busy: absolute figures are noisy, compare the ratios")
    print(f"\n1. throughput: {tasks} tasks per worker, {CONCURRENCY} at a time, ScriptedLLM "
          f"{LATENCY * 1000:.0f} ms per call, median of {runs} run(s)")
    for shared in (False, True):
        rates = await throughput(tasks, runs, shared)
        print("   shared conversations (every worker's tasks on the same 4):" if shared else
              "   own users (each worker's 4 users its own):")
        for processes, (rate, cpu, scaling) in rates.items():
            print(f"     {processes} worker(s): {rate:7.1f} tasks/s   "
                  f"scaling x{scaling:.2f}   worker CPU {cpu:5.2f} ms/task")
    costs = await per_turn(turns, pairs)
    print(f"\n2. per-turn cost of one durable conversation ({turns} turns, instant model), "
          f"median of all turns; then {pairs} turns past turn {turns} (late) side by side with "
          "turns 5-15 of young conversations (early)")
    for name, figures in costs.items():
        print(f"   {name:21s}: median {figures['median']:6.2f} ms   early {figures['early']:6.2f}"
              f" ms   late {figures['late']:6.2f} ms")
    pg, lite = costs["postgres"], costs["sqlite"]
    fast = costs["postgres-async-commit"]
    print(f"   postgres/sqlite: x{pg['median'] / lite['median']:.2f} (median), "
          f"postgres-async-commit/sqlite: x{fast['median'] / lite['median']:.2f}, "
          f"late/early on postgres: x{pg['late'] / pg['early']:.2f}")
    print(f"   one PostgreSQL round trip (SELECT 1, same pool, same moment): "
          f"{pg['round_trip']:.3f} ms; a turn costs {pg['median'] / pg['round_trip']:.0f} of them")
    for memory in (False, True):
        async with fresh_database() as dsn:
            trips = await round_trips(dsn, memory=memory)
        print(f"\n3. round trips to PostgreSQL of one one-step turn (warm store), memory "
              f"{'on' if memory else 'off'}: {trips.pop('total')} in all; by store call: "
              + ", ".join(f"{name} {count}" for name, count in trips.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--worker", nargs=4, metavar=("DSN", "ID", "TASKS", "USERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker[0], int(args.worker[1]), int(args.worker[2]),
                           args.worker[3] == "shared"))
    else:
        asyncio.run(main(args.quick))
