"""``cogency serve`` under two hostile clients, through real server processes.

1. Resent chat histories: one user has 50 conversations of one 0.9 MB turn each; each of
   their requests resends a 0.9 MB history that matches none of them (the costliest case:
   every conversation ends as the history does). Reported: that request's latency (p50)
   next to the same request by a user with no conversation (the difference is what matching
   costs), and the latency of another user's small runs sent meanwhile (p50, p99, max): how
   much the match stalls the server for everyone. Then, in this process, the match itself
   (``turns_digest`` of the history and the store's lookup; median).
2. Slow-loris: attackers on loopback addresses other than the users' open many connections
   and send their request headers one byte per second, reconnecting when cut off. Reported:
   the attackers' connections the server holds (sampled every second: the most, and at the
   end), and the users' run latency (p50, p99) under attack next to the same users without.

Default server settings throughout (``--header-timeout 10``, ``--max-connections 1000``,
``--max-connections-per-client 100``), a 50 ms model in part 2 and an instant one in part 1;
in part 2 the server runs with an open-file limit of 1024, a common default (each connection
takes one file).
The machine is shared: compare figures of one run. It runs on older Cogency too (for a
before/after: ``PYTHONPATH=/path/to/old/src python -m bench.bench_service_attacks``).

    python -m bench.bench_service_attacks            # about 2 min
    python -m bench.bench_service_attacks --quick    # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.bench_service import _admin, _percentile, _pg_url, _Server
from cogency.server.keys import create_key
from cogency.storage import open_store

ROOT = Path(__file__).resolve().parent.parent
NOFILE = 1024
"""The server's open-file limit in part 2: a common default (each connection takes one)."""
TURN = 900_000
"""Characters of each stored (and each resent) turn: 0.9 MB."""


async def _keys(db: str, users: list[str]) -> dict[str, str]:
    store = open_store(db)
    try:
        return {user: (await create_key(store, user))[1] for user in users}
    finally:
        await store.close()


async def _heavy_user(db: str, conversations: int) -> None:
    """``heavy``'s conversations, each [0.9 MB question, "ok", "more", "ok"]."""
    import itertools

    from cogency import Agent
    from cogency.testing import ScriptedLLM

    async with Agent(llm=ScriptedLLM(itertools.repeat({"response": "ok"})), store=db) as agent:
        for number in range(conversations):
            history = [("user", f"{number:04d}" + "x" * TURN), ("assistant", "ok")]
            async for _ in agent.stream("more", "heavy", history=history):
                pass


def _resent(tag: str) -> dict[str, Any]:
    """A chat request whose history (0.9 MB) ends as every stored conversation does."""
    return {"model": "cogency", "messages": [
        {"role": "user", "content": tag + "y" * TURN}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"}]}


async def resent_histories(requests: int, workdir: str) -> None:
    await _resent_histories("SQLite", str(Path(workdir) / "resent.db"), requests, workdir)
    name = f"cogency_bench_{uuid.uuid4().hex[:12]}"
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        await _resent_histories("PostgreSQL", _pg_url(name), requests, workdir)
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _resent_histories(backend: str, db: str, requests: int, workdir: str) -> None:
    print(f"1. resent histories ({backend}): 50 conversations of one {TURN / 1e6:.1f} MB "
          f"turn; {requests} requests resending a {TURN / 1e6:.1f} MB history that matches "
          "none")
    keys = await _keys(db, ["heavy", "fresh", "other"])
    await _heavy_user(db, 50)
    server = _Server(db, 0.0, workdir)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            async def post(user: str, path: str, body: dict[str, Any]) -> float:
                began = time.perf_counter()
                answer = await client.post(path, json=body,
                                           headers={"Authorization": f"Bearer {keys[user]}"})
                answer.raise_for_status()
                return time.perf_counter() - began

            await post("other", "/api/runs", {"query": "warm up"})
            times: dict[str, list[float]] = {"heavy": [], "fresh": []}
            stalls: list[float] = []
            quiet: list[float] = []
            for number in range(requests):
                for user in ("fresh", "heavy"):
                    done = asyncio.Event()

                    async def other(into: list[float]) -> None:
                        while not done.is_set():
                            into.append(await post("other", "/api/runs", {"query": "hi"}))

                    watcher = asyncio.create_task(other(stalls if user == "heavy" else quiet))
                    times[user].append(await post(user, "/v1/chat/completions",
                                                  _resent(f"{user}{number:04d}")))
                    done.set()
                    await watcher
    finally:
        server.stop()
    heavy, fresh = (statistics.median(times[user]) * 1000 for user in ("heavy", "fresh"))
    print(f"the request, by the user with 50 such conversations:  p50 {heavy:8.1f} ms")
    print(f"the same request, by a user with none:                p50 {fresh:8.1f} ms")
    print(f"what matching costs (the difference):                     {heavy - fresh:8.1f} ms")
    print(f"another user's runs meanwhile: p50 {statistics.median(stalls) * 1000:.1f} ms, "
          f"p99 {_percentile(stalls, 0.99) * 1000:.1f} ms, max {max(stalls) * 1000:.1f} ms "
          f"(during the other user's requests: p50 {statistics.median(quiet) * 1000:.1f} ms, "
          f"max {max(quiet) * 1000:.1f} ms)")
    await _match_in_process(db)


async def _match_in_process(db: str) -> None:
    """The match alone, as the server does it: by digest (or, in an older Cogency, by reading
    the user's 50 newest conversations)."""
    store = open_store(db)
    turns = [(m["role"], m["content"]) for m in _resent("local")["messages"][:-1]]
    try:
        from cogency.storage.base import turns_digest
    except ImportError:
        turns_digest = None  # type: ignore[assignment]
    try:
        spent = []
        for _ in range(10):
            began = time.perf_counter()
            if turns_digest is not None:
                digest = turns_digest(turns)
                assert digest is not None
                await store.find_conversation_by_turns("heavy", digest)
                how = "the digest of the 0.9 MB history and one lookup"
            else:
                from cogency.server.auth import Caller
                from cogency.server.openai_api import (  # type: ignore[attr-defined]
                    _resent as read_and_compare,
                )

                await read_and_compare(Caller("heavy", "", store, None),  # type: ignore[arg-type]
                                       turns)
                how = "reading the 50 newest conversations"
            spent.append(time.perf_counter() - began)
    finally:
        await store.close()
    print(f"the match alone, in this process ({how}): median "
          f"{statistics.median(spent) * 1000:.2f} ms (goal: under 20 ms)")


async def _users(url: str, keys: list[str], seconds: float) -> tuple[list[float], int]:
    """The latencies of the users' answered runs, and how many of their runs failed."""
    latencies: list[float] = []
    failed = 0
    stop = time.perf_counter() + seconds

    async def user(key: str, client: httpx.AsyncClient) -> None:
        nonlocal failed
        headers = {"Authorization": f"Bearer {key}"}
        while time.perf_counter() < stop:
            began = time.perf_counter()
            try:
                (await client.post(f"{url}/api/runs", json={"query": "hello"},
                                   headers=headers)).raise_for_status()
            except httpx.HTTPError:
                failed += 1
                await asyncio.sleep(0.1)
                continue
            latencies.append(time.perf_counter() - began)

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as client:
        await asyncio.gather(*(user(key, client) for key in keys))
    return latencies, failed


def _established(port: int, sources: set[str]) -> int:
    """Connections the server on ``port`` has open with ``sources`` (its side of them, as the
    kernel lists them: a connection the server closed no longer counts, whatever the
    client knows of it)."""
    import ipaddress

    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state != "01" or int(local.split(":")[1], 16) != port:
                continue
            address = ipaddress.IPv4Address(int(remote.split(":")[0], 16).to_bytes(4, "little"))
            count += str(address) in sources
    return count


async def _attack(host: str, port: int, attackers: int, seconds: float) -> None:
    """The slow-loris attackers (run in a process of their own, so the users' client does
    not share their CPU): prints the connections held each second, then the totals."""
    sources = [f"127.0.{n // 250 + 1}.{n % 250 + 2}" for n in range(max(1, attackers // 100))]
    cut = refused = 0
    stop = asyncio.Event()

    async def attacker(source: str) -> None:
        nonlocal cut, refused
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port,
                                                               local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(1)
                continue
            try:
                header = b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 10_000
                for byte in header:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:
                        answer = await asyncio.wait_for(reader.read(100), 1.0)
                    except asyncio.TimeoutError:
                        if stop.is_set():
                            break
                        continue
                    if b" 503 " in answer:
                        refused += 1
                    else:
                        cut += 1
                    break
            except OSError:
                cut += 1
            finally:
                writer.close()

    tasks = [asyncio.create_task(attacker(sources[n % len(sources)]))
             for n in range(attackers)]
    for _ in range(int(seconds)):
        await asyncio.sleep(1)
        print(f"held {_established(port, set(sources))}", flush=True)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"cut {cut} refused {refused} sources {len(sources)}", flush=True)


async def slow_loris(attackers: int, seconds: float, workdir: str) -> None:
    print(f"\n2. slow-loris: {attackers} connections from {max(1, attackers // 100)} loopback "
          f"addresses (a process of their own), each sending its headers one byte per second "
          f"(reconnecting when cut off); 10 users meanwhile, each sending runs one after "
          f"another (a 50 ms model), for {seconds:g} s without the attack, then "
          f"{seconds:g} s under it")
    db = str(Path(workdir) / "loris.db")
    keys = list((await _keys(db, [f"user{n}" for n in range(10)])).values())
    server = _Server(db, 0.05, workdir, nofile=NOFILE)
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    stop = asyncio.Event()
    newcomer: list[int] = []

    async def newcome() -> None:
        """Someone new: each request on a fresh connection."""
        while not stop.is_set():
            try:
                async with httpx.AsyncClient(timeout=30) as fresh:
                    newcomer.append((await fresh.get(f"{server.url}/health")).status_code)
            except httpx.HTTPError:
                newcomer.append(0)
            await asyncio.sleep(0.25)

    try:
        baseline = await _users(server.url, keys, seconds)
        attack = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.bench_service_attacks", "--attack", host, port,
            str(attackers), str(seconds + 4), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), os.environ.get("PYTHONPATH", "")])})
        await asyncio.sleep(2)  # the attack takes hold
        watcher = asyncio.create_task(newcome())
        attacked = await _users(server.url, keys, seconds)
        stop.set()
        await watcher
        output = (await attack.communicate())[0].decode().split()
    finally:
        server.stop()
    held = [int(value) for word, value in zip(output, output[1:]) if word == "held"]
    cut, refused, sources = (int(output[output.index(word) + 1])
                             for word in ("cut", "refused", "sources"))
    print(f"attackers' connections the server held (its side, sampled each second): most "
          f"{max(held)}, at the end {held[-1]}; closed by it with 408: {cut}, refused with "
          f"503: {refused}")
    print(f"a newcomer's requests on fresh connections under the attack: "
          f"{newcomer.count(200)} answered, {newcomer.count(503)} refused (503), "
          f"{len(newcomer) - newcomer.count(200) - newcomer.count(503)} failed")
    for label, (values, failed) in (("without the attack", baseline),
                                    ("under the attack", attacked)):
        print(f"users' runs {label:<19} p50 {statistics.median(values) * 1000:7.1f} ms, "
              f"p99 {_percentile(values, 0.99) * 1000:7.1f} ms ({len(values)} answered, "
              f"{failed} failed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--attack", nargs=4, metavar=("HOST", "PORT", "N", "SECONDS"),
                        help=argparse.SUPPRESS)  # the attackers' own process
    args = parser.parse_args()
    if args.attack:
        host, port, count, seconds = args.attack
        asyncio.run(_attack(host, int(port), int(count), float(seconds)))
        return
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(resent_histories(2 if args.quick else 5, workdir))
        asyncio.run(slow_loris(300 if args.quick else 2000, 10.0 if args.quick else 30.0,
                               workdir))


if __name__ == "__main__":
    main()
