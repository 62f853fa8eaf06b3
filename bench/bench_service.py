"""``cogency serve``: requests per second and latency through real server processes.

1. Load: N concurrent users (1, 10, 50), each with its own key, each sending runs one after
   another (``POST /api/runs``, waiting for the answer) on its own conversation, for a fixed
   time. The model is scripted and answers every call after 50 ms. Configurations: SQLite with
   one server, PostgreSQL with one replica, PostgreSQL with two replicas (users spread over
   them). Reported per configuration and user count: requests/s, p50 and p99 latency.
2. The server's own cost: one client, sequential runs, with an instant model, through HTTP and
   straight through ``Agent.run`` on the same kind of store in this process; the difference of
   the medians is what the HTTP layer (auth, JSON, the run manager, the conversation hold)
   adds per request.

The machine has 2 cores shared with other work: absolute figures are noisy; compare figures
from one run.

    python -m bench.bench_service            # full (about 1 min)
    python -m bench.bench_service --quick    # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from cogency import Agent
from cogency.server.keys import create_key
from cogency.storage import open_store
from cogency.testing import ScriptedLLM

ADMIN_DSN = os.environ.get("COGENCY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ROOT = Path(__file__).resolve().parent.parent


def model() -> ScriptedLLM:
    """The served model: answers every call after ``$COGENCY_BENCH_DELAY`` seconds."""
    delay = float(os.environ.get("COGENCY_BENCH_DELAY", "0.05"))
    return ScriptedLLM(itertools.repeat({"response": "ok"}), delay=delay)


class _Server:
    def __init__(self, db: str, delay: float, workdir: str) -> None:
        env = {**os.environ, "COGENCY_BENCH_DELAY": str(delay),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.log = open(Path(workdir) / f"server-{uuid.uuid4().hex[:6]}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cogency.cli", "serve", "--db", db, "--port", "0",
             "--llm", "bench.bench_service:model", "--max-runs-per-key", "1000"],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=workdir)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if not found:
            raise SystemExit(f"the server did not start: {line!r}")
        self.url = found.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _keys(db: str, count: int) -> list[str]:
    store = open_store(db)
    try:
        return [(await create_key(store, f"user{n}"))[1] for n in range(count)]
    finally:
        await store.close()


async def _load(urls: list[str], keys: list[str], seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=len(keys) + 10)

    async def user(url: str, key: str, client: httpx.AsyncClient) -> None:
        conversation = None
        headers = {"Authorization": f"Bearer {key}"}
        while time.perf_counter() < stop or conversation is None:
            began = time.perf_counter()
            body: dict[str, Any] = {"query": "hello"}
            if conversation:
                body["conversation_id"] = conversation
            answer = await client.post(f"{url}/api/runs", json=body, headers=headers)
            answer.raise_for_status()
            conversation = answer.json()["conversation_id"]
            latencies.append(time.perf_counter() - began)

    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(user(urls[n % len(urls)], key, client)
                               for n, key in enumerate(keys)))
        elapsed = time.perf_counter() - began
    return {"rps": len(latencies) / elapsed, "p50": _percentile(latencies, 0.5) * 1000,
            "p99": _percentile(latencies, 0.99) * 1000, "n": len(latencies)}


async def _warm(urls: list[str], key: str) -> None:
    async with httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
        for url in urls:
            for _ in range(3):
                (await c.post(f"{url}/api/runs", json={"query": "warm up"})).raise_for_status()


async def _admin(sql: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


def _pg_url(name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(ADMIN_DSN)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, "", ""))


async def load(users_levels: list[int], seconds: float, workdir: str) -> None:
    print(f"1. load: a 50 ms model, {seconds:g} s per level; each user its own key and "
          "conversation, one run after another")
    print(f"{'configuration':<26}{'users':>6}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'runs':>7}")
    for label, backend, replicas in (("SQLite, 1 server", "sqlite", 1),
                                     ("PostgreSQL, 1 replica", "pg", 1),
                                     ("PostgreSQL, 2 replicas", "pg", 2)):
        name = f"cogency_bench_{uuid.uuid4().hex[:12]}"
        if backend == "pg":
            await _admin(f'CREATE DATABASE "{name}"')
            db = _pg_url(name)
        else:
            db = str(Path(workdir) / f"{name}.db")
        try:
            keys = await _keys(db, max(users_levels))
            servers = [_Server(db, 0.05, workdir) for _ in range(replicas)]
            try:
                urls = [server.url for server in servers]
                await _warm(urls, keys[0])
                for users in users_levels:
                    figures = await _load(urls, keys[:users], seconds)
                    print(f"{label:<26}{users:>6}{figures['rps']:>9.1f}{figures['p50']:>9.1f}"
                          f"{figures['p99']:>9.1f}{figures['n']:>7}", flush=True)
            finally:
                for server in servers:
                    server.stop()
        finally:
            if backend == "pg":
                await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def overhead(count: int, workdir: str) -> None:
    print(f"\n2. the server's own cost: an instant model, one client, {count} runs each way "
          "(medians)")
    db = str(Path(workdir) / "overhead.db")
    [key] = await _keys(db, 1)
    server = _Server(db, 0.0, workdir)
    try:
        timings: dict[str, list[float]] = {"http": [], "direct": []}
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            direct_db = str(Path(workdir) / "direct.db")
            async with Agent(llm=model_instant(), store=direct_db) as agent:
                http_conversation = direct_conversation = None
                for _ in range(count):  # alternated, so load on the machine hits both alike
                    began = time.perf_counter()
                    body: dict[str, Any] = {"query": "hello"}
                    if http_conversation:
                        body["conversation_id"] = http_conversation
                    answer = await client.post("/api/runs", json=body)
                    http_conversation = answer.json()["conversation_id"]
                    timings["http"].append(time.perf_counter() - began)
                    began = time.perf_counter()
                    result = await agent.run("hello", user_id="user0",
                                             conversation_id=direct_conversation)
                    direct_conversation = result.conversation_id
                    timings["direct"].append(time.perf_counter() - began)
        http_p50 = statistics.median(timings["http"][5:]) * 1000
        direct_p50 = statistics.median(timings["direct"][5:]) * 1000
        print(f"through HTTP (cogency serve, SQLite):   p50 {http_p50:.2f} ms")
        print(f"Agent.run in this process (SQLite):     p50 {direct_p50:.2f} ms")
        print(f"the server's own cost per request:      p50 {http_p50 - direct_p50:.2f} ms "
              "(goal: at most 5 ms)")
    finally:
        server.stop()


def model_instant() -> ScriptedLLM:
    return ScriptedLLM(itertools.repeat({"response": "ok"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(load([1, 10, 50], 1.0 if args.quick else 4.0, workdir))
        asyncio.run(overhead(30 if args.quick else 200, workdir))


if __name__ == "__main__":
    main()
