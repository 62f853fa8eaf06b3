"""``cogency serve``: requests per second and latency through real server processes.

1. Load: N concurrent users (1, 10, 50), each with its own key, each sending runs one after
   another (``POST /api/runs``, waiting for the answer) on its own conversation, for a fixed
   time. The model is scripted and answers every call after 50 ms. Configurations: SQLite with
   one server, PostgreSQL with one replica, PostgreSQL with two replicas (users spread over
   them). Reported per configuration and user count: requests/s, p50 and p99 latency.
2. The server's own cost: one client, sequential runs, with an instant model, three ways
   alternated: straight through ``Agent.run``, through the app in this process (ASGI, no
   socket), and over loopback HTTP to a ``cogency serve`` process. The difference of the first
   two medians is what the service (auth, JSON, the run manager, the conversation hold) adds
   per request; the third adds the client, the socket and a second process.
3. The same for ``POST /v1/chat/completions`` with a client's tools (Open WebUI's 28
   built-ins, never called) and without, against ``Agent.run`` with and without them.

The machine has 2 cores shared with other work: absolute figures are noisy; compare figures
from one run.

    python -m bench.bench_service            # full (about 1 min)
    python -m bench.bench_service --quick    # a short run
    python -m bench.bench_service --client-tools   # part 3 alone
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
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

from bench.lean_http import LeanConnection

ADMIN_DSN = os.environ.get("COGENCY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ROOT = Path(__file__).resolve().parent.parent


class _Served(ScriptedLLM):
    """ScriptedLLM keeps every call's messages, for a test's assertions. A model serving
    thousands of requests keeps none: kept, they would pile up in the server's memory (and
    slow its garbage collector) as no real model's calls do."""

    async def generate(self, messages: list[Any], *, schema: Any = None) -> Any:
        try:
            return await super().generate(messages, schema=schema)
        finally:
            self.calls.clear()
            self.call_options.clear()


def model() -> ScriptedLLM:
    """The served model: answers every call after ``$COGENCY_BENCH_DELAY`` seconds."""
    delay = float(os.environ.get("COGENCY_BENCH_DELAY", "0.05"))
    return _Served(itertools.repeat({"response": "ok"}), delay=delay)


class _Listening:
    """A server process that prints ``listening on URL`` once it listens."""

    def __init__(self, command: list[str], log: Path, **popen: Any) -> None:
        self.log = open(log, "w")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, **popen)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if not found:
            self.stop()
            raise SystemExit(f"{command[2]} did not start: {line!r}")
        self.url = found.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


class _Server(_Listening):
    def __init__(self, db: str, delay: float, workdir: str, nofile: int | None = None,
                 llm: str = "bench.bench_service:model") -> None:
        """``nofile``: the server's open-file limit (else this process's); ``llm``: the model
        it serves (by default the scripted one, answering after ``delay`` seconds)."""
        env = {**os.environ, "COGENCY_BENCH_DELAY": str(delay),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        super().__init__(
            [sys.executable, "-m", "cogency.cli", "serve", "--db", db, "--port", "0",
             "--llm", llm, "--max-runs-per-key", "1000",
             "--no-memory"],  # the served turn alone: learning would double the model calls
            Path(workdir) / f"server-{uuid.uuid4().hex[:6]}.log", env=env, cwd=workdir,
            preexec_fn=None if nofile is None else lambda: _limit_files(nofile))


class _Bare(_Listening):
    """``bench.bare_http`` answering every request with ``body``: the floor under any HTTP
    service, measured with the same client."""

    def __init__(self, body: bytes, workdir: str) -> None:
        path = Path(workdir) / f"bare-{uuid.uuid4().hex[:6]}.json"
        path.write_bytes(body)
        super().__init__([sys.executable, "-m", "bench.bare_http", str(path)],
                         path.with_suffix(".log"), cwd=ROOT)


def _limit_files(count: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


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
    print(f"\n2. the server's own cost: an instant model, one client, {count} runs each way, "
          "alternated (medians)")
    from cogency.server import create_app

    db, app_db = str(Path(workdir) / "overhead.db"), str(Path(workdir) / "app.db")
    [key] = await _keys(db, 1)
    [app_key] = await _keys(app_db, 1)
    server = _Server(db, 0.0, workdir)
    headers = {"Authorization": f"Bearer {key}"}
    timings: dict[str, list[float]] = {"http": [], "asgi": [], "direct": []}
    cpu: dict[str, list[float]] = {"asgi": [], "direct": []}
    try:
        async with Agent(llm=model_instant(), store=str(Path(workdir) / "direct.db")) as direct, \
                Agent(llm=model_instant(), store=app_db) as served, \
                httpx.AsyncClient(base_url=server.url, timeout=60, headers=headers) as http, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)),
                                  base_url="http://asgi", timeout=60,
                                  headers={"Authorization": f"Bearer {app_key}"}) as asgi:
            conversations: dict[str, str | None] = {"http": None, "asgi": None, "direct": None}
            for _ in range(count):
                for way in ("direct", "asgi", "http"):
                    began, began_cpu = time.perf_counter(), time.process_time()
                    if way == "direct":
                        result = await direct.run("hello", user_id="user0",
                                                  conversation_id=conversations[way])
                        conversations[way] = result.conversation_id
                    else:
                        body: dict[str, Any] = {"query": "hello"}
                        if conversations[way]:
                            body["conversation_id"] = conversations[way]
                        client = http if way == "http" else asgi
                        answer = await client.post("/api/runs", json=body)
                        answer.raise_for_status()
                        conversations[way] = answer.json()["conversation_id"]
                    timings[way].append(time.perf_counter() - began)
                    if way in cpu:  # this process's CPU (all its threads): robust to load
                        cpu[way].append(time.process_time() - began_cpu)
    finally:
        server.stop()
    p50 = {way: statistics.median(values[5:]) * 1000 for way, values in timings.items()}
    print(f"Agent.run in this process (SQLite):            p50 {p50['direct']:6.2f} ms")
    print(f"the app in this process (ASGI, no socket):     p50 {p50['asgi']:6.2f} ms")
    print(f"through HTTP to `cogency serve` (loopback):    p50 {p50['http']:6.2f} ms")
    cpu50 = {way: statistics.median(values[5:]) * 1000 for way, values in cpu.items()}
    print(f"the server's own cost (app - Agent.run):       p50 {p50['asgi'] - p50['direct']:6.2f} ms "
          "(goal: at most 5 ms)")
    print(f"  in CPU time of this process: Agent.run {cpu50['direct']:.2f} ms, app "
          f"{cpu50['asgi']:.2f} ms, difference {cpu50['asgi'] - cpu50['direct']:.2f} ms")
    print(f"a request over loopback HTTP (http - Agent.run): p50 "
          f"{p50['http'] - p50['direct']:6.2f} ms (client, socket and a second process too)")


def model_instant() -> ScriptedLLM:
    return _Served(itertools.repeat({"response": "ok"}))


def open_webui_tools() -> list[dict[str, Any]]:
    """The 28 built-in tools Open WebUI 0.12 sends with every chat message (recorded)."""
    recorded = ROOT / "tests" / "recorded" / "open_webui_0_12_chat.json"
    return list(json.loads(recorded.read_text())["request"]["tools"])


async def overhead_client_tools(count: int, workdir: str) -> dict[str, Any]:
    """What the OpenAI endpoint adds per request, with a client's tools (Open WebUI's 28
    built-ins, which the model never calls) and without: ``Agent.run`` in this process
    against ``POST /v1/chat/completions`` through the app in this process (ASGI, no socket)
    and over loopback HTTP to a ``cogency serve`` process, each on its own SQLite file, one
    client, an instant model, the six ways alternated request by request (medians, the first
    five of each left out)."""
    from cogency.server import create_app

    tools = open_webui_tools()
    db, app_db = str(Path(workdir) / "tools-http.db"), str(Path(workdir) / "tools-app.db")
    [key] = await _keys(db, 1)
    [app_key] = await _keys(app_db, 1)
    server = _Server(db, 0.0, workdir)
    ways = ("direct", "direct+tools", "asgi", "asgi+tools", "http", "http+tools")
    timings: dict[str, list[float]] = {way: [] for way in ways}
    try:
        async with Agent(llm=model_instant(), store=str(Path(workdir) / "tools-direct.db")) \
                as direct, Agent(llm=model_instant(), store=app_db) as served, \
                httpx.AsyncClient(base_url=server.url, timeout=60,
                                  headers={"Authorization": f"Bearer {key}"}) as http, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)),
                                  base_url="http://asgi", timeout=60,
                                  headers={"Authorization": f"Bearer {app_key}"}) as asgi:
            conversations: dict[str, str | None] = dict.fromkeys(ways)
            for _ in range(count):
                for way in ways:
                    with_tools = way.endswith("+tools")
                    began = time.perf_counter()
                    if way.startswith("direct"):
                        result = await direct.run(
                            "hello", user_id="user0", conversation_id=conversations[way],
                            client_tools=tools if with_tools else None)
                        conversations[way] = result.conversation_id
                    else:
                        body: dict[str, Any] = {
                            "model": "cogency", "messages": [{"role": "user", "content": "hello"}]}
                        if with_tools:
                            body["tools"] = tools
                        if conversations[way]:
                            body["metadata"] = {"conversation_id": conversations[way]}
                        client = http if way.startswith("http") else asgi
                        answer = await client.post("/v1/chat/completions", json=body)
                        answer.raise_for_status()
                        conversations[way] = answer.json()["conversation_id"]
                    timings[way].append(time.perf_counter() - began)
    finally:
        server.stop()
    p50 = {way: statistics.median(values[5:]) * 1000 for way, values in timings.items()}
    return {"p50_ms": p50, "n": count,
            "asgi_overhead_ms": {"tools": p50["asgi+tools"] - p50["direct+tools"],
                                 "none": p50["asgi"] - p50["direct"]},
            "http_overhead_ms": {"tools": p50["http+tools"] - p50["direct+tools"],
                                 "none": p50["http"] - p50["direct"]}}


def print_client_tools(figures: dict[str, Any]) -> None:
    p50 = figures["p50_ms"]
    print(f"\n3. POST /v1/chat/completions with a client's tools (Open WebUI's 28, never "
          f"called) and without: {figures['n']} requests each way, alternated (p50, ms)")
    for way in ("direct", "direct+tools", "asgi", "asgi+tools", "http", "http+tools"):
        print(f"  {way:<14} {p50[way]:7.2f}")
    for kind in ("none", "tools"):
        print(f"  the server's own cost ({'with' if kind == 'tools' else 'without'} tools): "
              f"app - Agent.run {figures['asgi_overhead_ms'][kind]:.2f} ms (goal: at most 5), "
              f"HTTP - Agent.run {figures['http_overhead_ms'][kind]:.2f} ms")


async def overhead_by_clients(
    clients: list[int], rounds: int, per_round: int, workdir: str, synchronous: str
) -> dict[str, Any]:
    """`cogency serve` over real HTTP against ``Agent.run`` in this process, at each number of
    concurrent clients: each client its own user (key) and conversation, sending one run after
    another (an instant model). The floor under any HTTP service is measured too: the same
    client and requests against ``bench.bare_http``, which answers each at once with a body
    the server sent. Each is measured with two clients: ``bench.lean_http`` (HTTP/1.1 on one
    kept-alive connection per client, no framework: what the service is judged with) and
    httpx (most Python users' client, whose own cost per request is part of its figures).
    The ways alternate round by round (``per_round`` runs per client each), so a slow moment
    of the machine hits all; every request's latency counts. Both stores are SQLite files at
    ``synchronous``."""
    url = lambda name: f"sqlite:///{Path(workdir) / name}?synchronous={synchronous}"  # noqa: E731
    out: dict[str, Any] = {"synchronous": synchronous, "clients": {}}
    ways = ("direct", "http", "bare", "httpx", "httpx_bare")
    for count in clients:
        served = url(f"served-{count}.db")
        keys = await _keys(served, count)
        server = _Server(served, 0.0, workdir)
        bare: _Bare | None = None
        latencies: dict[str, list[float]] = {way: [] for way in ways}
        lean: dict[tuple[str, int], LeanConnection] = {}
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                sample = await http.post("/api/runs", json={"query": "hello"},
                                         headers={"Authorization": f"Bearer {keys[0]}"})
                sample.raise_for_status()
            bare = _Bare(sample.content, workdir)
            urls = {"http": server.url, "bare": bare.url, "httpx": server.url,
                    "httpx_bare": bare.url}
            async with Agent(llm=model_instant(), store=url(f"direct-{count}.db")) as direct, \
                    httpx.AsyncClient(timeout=60,
                                      limits=httpx.Limits(max_connections=count + 5)) as http:
                conversations: dict[tuple[str, int], str | None] = {}

                async def one(way: str, n: int) -> None:
                    target = urls.get(way, "")
                    headers = {"authorization": f"Bearer {keys[n]}"}
                    if way in ("http", "bare") and (way, n) not in lean:
                        lean[(way, n)] = await LeanConnection.open(target)
                    for _ in range(per_round):
                        began = time.perf_counter()
                        conversation = conversations.get((way, n))
                        if way == "direct":
                            result = await direct.run("hello", user_id=f"user{n}",
                                                      conversation_id=conversation)
                            conversations[(way, n)] = result.conversation_id
                            latencies[way].append(time.perf_counter() - began)
                            continue
                        body: dict[str, Any] = {"query": "hello"}
                        if conversation:
                            body["conversation_id"] = conversation
                        if way in ("http", "bare"):
                            status, content = await lean[(way, n)].post("/api/runs", body,
                                                                         headers)
                        else:
                            answer = await http.post(target + "/api/runs", json=body,
                                                     headers=headers)
                            status, content = answer.status_code, answer.content
                        if status != 200:
                            raise SystemExit(f"POST /api/runs answered {status}: "
                                             f"{content[:500]!r}")
                        conversations[(way, n)] = json.loads(content)["conversation_id"]
                        latencies[way].append(time.perf_counter() - began)

                for round_ in range(rounds + 1):  # round 0 warms each up, untimed
                    for way in ways:
                        mark = len(latencies[way])
                        await asyncio.gather(*(one(way, n) for n in range(count)))
                        if round_ == 0:
                            del latencies[way][mark:]
        finally:
            for connection in lean.values():
                await connection.close()
            server.stop()
            if bare is not None:
                bare.stop()
        figures: dict[str, Any] = {
            way: {"p50": _percentile(values, 0.5) * 1000,
                  "p99": _percentile(values, 0.99) * 1000, "n": len(values)}
            for way, values in latencies.items()}
        for prefix in ("", "httpx_"):
            http_way = prefix.rstrip("_") or "http"
            figures[f"{prefix}overhead"] = {
                q: figures[http_way][q] - figures["direct"][q] for q in ("p50", "p99")}
            # What the server itself adds: the overhead less the client's and the loopback's
            figures[f"{prefix}own"] = {
                q: figures[f"{prefix}overhead"][q] - figures[f"{prefix}bare"][q]
                for q in ("p50", "p99")}
        out["clients"][str(count)] = figures
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--overhead-only", action="store_true", help="only parts 2 and 3")
    parser.add_argument("--client-tools", action="store_true",
                        help="only part 3: the OpenAI endpoint with a client's tools and without")
    parser.add_argument("--clients-json", metavar="N,N",
                        help="only `cogency serve` over HTTP against Agent.run at these numbers "
                             "of clients; prints one JSON line (python -m bench uses it)")
    parser.add_argument("--rounds", type=int, default=10, help="with --clients-json")
    parser.add_argument("--per-round", type=int, default=10, help="with --clients-json")
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal",
                        help="with --clients-json: the SQLite stores' durability")
    args = parser.parse_args()
    if args.clients_json:
        with tempfile.TemporaryDirectory() as workdir:
            counts = [int(n) for n in args.clients_json.split(",")]
            print(json.dumps(asyncio.run(overhead_by_clients(
                counts, args.rounds, args.per_round, workdir, args.synchronous))))
        return
    with tempfile.TemporaryDirectory() as workdir:
        if not args.overhead_only and not args.client_tools:
            asyncio.run(load([1, 10, 50], 1.0 if args.quick else 4.0, workdir))
        if not args.client_tools:
            asyncio.run(overhead(30 if args.quick else 200, workdir))
        print_client_tools(asyncio.run(overhead_client_tools(30 if args.quick else 200,
                                                             workdir)))


if __name__ == "__main__":
    main()
