"""PostgreSQL behind PgBouncer (transaction mode): what the pooler costs a turn, and how many
server connections many processes need through it.

1. Per-turn time through PgBouncer against directly, and with row-level security against
   without, in this process, on one database: turns of three conversations (a one-step task
   answered by an instant model, durable commits), alternated turn by turn between a store
   connected directly as the superuser (whom row-level security does not restrict), one
   connected directly as an ordinary role that owns the tables (restricted), and one of that
   role through PgBouncer, so a slow minute of the machine slows all alike. Reported: each
   run's median turn of each, and the medians over runs of the ratios; round trips of one
   turn. Behind the pooler the store's statements are unnamed (parsed and planned with every
   execution, in the same round trip), directly they are prepared once per connection.
2. Throughput of worker processes through a PgBouncer pool of 10 server connections: 1 and
   20 workers (each running 4 tasks at a time, a tool call and an answer from a ScriptedLLM
   with 20 ms latency, each with a pool of up to 5 client connections: 100 clients for 20
   workers), started together (``bench.bench_postgres``'s workers). ``pg_stat_activity`` is
   sampled every 20 ms during the run: the most server connections PostgreSQL saw for the
   database. Reported: medians over runs of tasks per second, of the scaling (20 workers'
   rate against 1 worker's in the same run) and of the most connections seen.

The machine has 2 cores shared with other work: absolute figures are noisy; compare ratios.

    python -m bench.bench_pgbouncer            # full
    python -m bench.bench_pgbouncer --quick    # a short run
    COGENCY_BENCH_PG=postgresql://user@host:5432/postgres  # the server (default: local)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from urllib.parse import urlsplit, urlunsplit

from contextlib import asynccontextmanager
from collections.abc import AsyncIterator

from bench.bench_postgres import ADMIN_DSN, fresh_database, round_trips, run_workers
from bench.pooler import Pooler
from cogency import Agent
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

POOL = 10
"""Server connections PgBouncer may open per database and user in part 2."""
ROLE = "cogency_bench"
"""An ordinary role (row-level security holds it), made once per server."""


@asynccontextmanager
async def owned_database() -> AsyncIterator[str]:
    """A fresh database owned by :data:`ROLE`; yields the superuser's URL to it."""
    import asyncpg

    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", ROLE):
            await admin.execute(f"CREATE ROLE {ROLE} LOGIN")
    finally:
        await admin.close()
    async with fresh_database() as dsn:
        admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
        try:
            await admin.execute(f'ALTER DATABASE "{urlsplit(dsn).path[1:]}" OWNER TO {ROLE}')
        finally:
            await admin.close()
        yield dsn


def as_role(dsn: str, port: int | None = None) -> str:
    """``dsn`` as :data:`ROLE` (through PgBouncer's ``port`` when given)."""
    parts = urlsplit(dsn)
    netloc = f"{ROLE}@{parts.hostname or '127.0.0.1'}:{port or parts.port or 5432}"
    if port:
        netloc = f"{ROLE}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def through(dsn: str, port: int) -> str:
    """``dsn`` pointed at PgBouncer's ``port`` on this machine."""
    parts = urlsplit(dsn)
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def pooler(pool_size: int) -> Pooler:
    server = urlsplit(ADMIN_DSN)
    return Pooler("transaction", host=server.hostname or "127.0.0.1",
                  port=server.port or 5432, users=(server.username or "postgres", ROLE),
                  pool_size=pool_size)


async def _turn(store: PostgresStore, conversation: str | None, turn: int) -> tuple[str, float]:
    began = time.perf_counter()
    result = await Agent(llm=ScriptedLLM([{"secure": True, "response": f"answer {turn}",
                                           "actions": []}]), store=store).run(
        f"turn {turn}", "alice", conversation)
    return result.conversation_id, (time.perf_counter() - began) * 1000


ROUTES = ("superuser", "ordinary role", "ordinary role via PgBouncer")


async def per_turn(turns: int, runs: int, bouncer: Pooler) -> list[dict[str, float]]:
    """Per run: the median turn of each route (milliseconds)."""
    figures = []
    for _ in range(runs):
        async with owned_database() as dsn:
            stores = dict(zip(ROUTES, (PostgresStore(dsn), PostgresStore(as_role(dsn)),
                                       PostgresStore(as_role(dsn, bouncer.port)))))
            times: dict[str, list[float]] = {route: [] for route in ROUTES}
            conversations: dict[str, str | None] = {route: None for route in ROUTES}
            await stores[ROUTES[1]].list_tasks()  # the role makes (and so owns) the tables
            try:
                for turn in range(turns + 1):
                    for route, store in stores.items():
                        conversations[route], elapsed = await _turn(
                            store, conversations[route], turn)
                        if turn:  # turn 0 opens the store
                            times[route].append(elapsed)
                assert [store.pooled for store in stores.values()] == [False, False, True]
            finally:
                for store in stores.values():
                    await store.close()
        figures.append({route: statistics.median(values) for route, values in times.items()})
    return figures


async def _sample(database: str, stop: asyncio.Event) -> list[int]:
    """Server connections to ``database`` (but the sampler's own), every 20 ms until ``stop``."""
    import asyncpg

    observer = await asyncpg.connect(ADMIN_DSN)
    seen = []
    try:
        while not stop.is_set():
            seen.append(await observer.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database))
            await asyncio.sleep(0.02)
    finally:
        await observer.close()
    return seen


async def throughput(tasks: int, runs: int, bouncer: Pooler, workers: int
                     ) -> dict[int, list[tuple[float, int]]]:
    """Per worker count (1 and ``workers``), per run: tasks per second and the most server
    connections PostgreSQL saw for the database meanwhile."""
    results: dict[int, list[tuple[float, int]]] = {1: [], workers: []}
    for _ in range(runs):
        for processes in results:  # interleaved, so load changes hit both counts alike
            async with fresh_database() as dsn:
                stop = asyncio.Event()
                sampler = asyncio.create_task(_sample(urlsplit(dsn).path.lstrip("/"), stop))
                try:
                    rate, _ = await asyncio.to_thread(
                        run_workers, through(dsn, bouncer.port), processes, tasks, False)
                finally:
                    stop.set()
                    seen = await sampler
                results[processes].append((rate, max(seen)))
    return results


async def main(quick: bool, workers: int) -> None:
    turns, turn_runs, tasks, runs = (20, 1, 4, 1) if quick else (300, 5, 30, 3)
    print(f"PgBouncer benchmark ({'quick' if quick else 'full'}): {os.cpu_count()} cores, "
          "shared and busy: absolute figures are noisy, compare the ratios")
    bouncer = pooler(POOL)
    try:
        figures = await per_turn(turns, turn_runs, bouncer)
        print(f"\n1. per-turn time, {turns} turns alternated, median of each of {turn_runs} "
              "run(s):")
        for run in figures:
            print("   " + "   ".join(f"{route} {ms:6.2f} ms" for route, ms in run.items()))
        superuser, role, pooled = ROUTES
        rls = statistics.median(run[role] / run[superuser] for run in figures)
        ratio = statistics.median(run[pooled] / run[role] for run in figures)
        print(f"   row-level security on / off (ordinary role / superuser): x{rls:.2f}")
        print(f"   through PgBouncer / direct: x{ratio:.2f} (median over runs)")
        async with fresh_database() as dsn:
            direct_trips = await round_trips(dsn)
        async with fresh_database() as dsn:
            pooled_trips = await round_trips(through(dsn, bouncer.port))
        print(f"   round trips of a one-step turn: {direct_trips['total']} direct, "
              f"{pooled_trips['total']} through PgBouncer")
        rates = await throughput(tasks, runs, bouncer, workers)
        print(f"\n2. throughput through a PgBouncer pool of {POOL} server connections: "
              f"{tasks} tasks per worker, median of {runs} run(s)")
        one = rates[1]
        for processes, values in rates.items():
            rate = statistics.median(r for r, _ in values)
            most = statistics.median(c for _, c in values)
            scaling = statistics.median(r / base for (r, _), (base, _) in zip(values, one))
            print(f"   {processes:2d} worker(s): {rate:7.1f} tasks/s   scaling x{scaling:.2f}   "
                  f"server connections seen: at most {most:g} (pool {POOL})")
    finally:
        bouncer.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--workers", type=int, default=20,
                        help="worker processes of part 2's second count (20)")
    options = parser.parse_args()
    asyncio.run(main(options.quick, options.workers))
