"""``python -m bench.bench_flush``: what the disk flush of a durable turn costs on this machine,
and what handing it to the store's worker thread adds.

At ``synchronous="full"`` a one-step turn is one flush of the write-ahead log, made by the
event loop itself while the store has nothing else under way and its disk is fast (fewer than
4 of its last 16 flushes over 1 ms), else on the store's worker thread (``SQLiteStore``).
Parts 1 and 2 are what that wait costs, measured alone; part 3 is where a lone run's flushes
went on this disk; ``python -m bench`` measures whole turns.

1. **The flush** (``os.fdatasync``) after writing what a turn adds to the log (``--kib``,
   23 KiB by default), three ways:
   - *appending*: at the end of a file that grows, as every flush of a new log is;
   - *over written blocks*: over blocks written and flushed before, as in a log that was
     started over after a checkpoint (``_checkpoint``'s ``RESTART``);
   - *over reserved blocks*: over blocks reserved by ``posix_fallocate`` and never written;
   - *written ahead*: at the end of a file that grows, kept written (zeros) ``LOG_AHEAD_BYTES``
     past the end, that much at a time, as ``SQLiteStore`` keeps a log of that size or more
     at ``synchronous="full"`` (``_grow_log``): most flushes are over written blocks, one in
     ~10 flushes the zeros and the file's new size too.

   Wall time per flush (the median, and the mean: a way whose flushes differ shows it in the
   mean), and system CPU per operation (the writing ahead included).
2. **The hand-off**, an event loop's coroutine that writes and waits for the flush:
   - *inline*: the flush on the event loop (a lone run's, while the disk is fast: the loop
     waits on the disk, and wakes no thread);
   - *on the worker*: on ``SQLiteStore``'s own worker thread, told back to the loop as the
     store tells its callers (a run's among others, or on a slow disk);
   - *the worker's round trip*, with no flush;
   - *two threads handing a lock back and forth*: the floor under any hand-off between
     threads, with no event loop.

   Wall time, user and system CPU, and voluntary context switches, per operation.
3. **Where a lone run's flushes go**: ``--turns`` one-step turns of one agent at
   ``synchronous="full"`` (a scripted model, 25-turn conversations, a fresh file), each
   flush observed at ``os.fdatasync``: how many the event loop made and how many the worker,
   how many were slow (over ``FLUSH_ON_LOOP_SECONDS``), and the flushes' percentiles.

Every way runs in every round, in turn, so that a slow moment of the machine hits them all;
figures are medians over the rounds.

    python -m bench.bench_flush                 # ~10 s; tables, then one JSON line
    python -m bench.bench_flush --dir /var/lib/app --rounds 9
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers._harness import percentile
from cogency.storage.sqlite import (
    FLUSH_ON_LOOP_SECONDS,
    LOG_AHEAD_BYTES,
    _settle_soon,
    _Worker,
)

FLUSHES = ("appending", "over written blocks", "over reserved blocks", "written ahead")
HAND_OFFS = ("inline", "on the worker", "the worker's round trip", "two threads, a lock")


def _usage() -> tuple[float, float, int]:
    used = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return used.ru_utime, used.ru_stime, used.ru_nvcsw


def flushes(path: Path, way: str, ops: int, size: int) -> dict[str, float]:
    """``ops`` writes of ``size`` bytes one after another, each flushed; the median flush."""
    data = os.urandom(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if way == "over written blocks":
            os.pwrite(fd, bytes(ops * size), 0)
            os.fdatasync(fd)
        elif way == "over reserved blocks":
            os.posix_fallocate(fd, 0, ops * size)
            os.fdatasync(fd)
        times: list[float] = []
        _, system, _ = _usage()
        ahead = 0  # written ahead: the file's end
        for op in range(ops):
            if way == "written ahead" and ahead < (op + 1) * size + LOG_AHEAD_BYTES // 4:
                os.pwrite(fd, bytes((op + 1) * size + LOG_AHEAD_BYTES - ahead), ahead)
                ahead = (op + 1) * size + LOG_AHEAD_BYTES
            os.pwrite(fd, data, op * size)
            began = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - began)
        system = _usage()[1] - system
    finally:
        os.close(fd)
        path.unlink()
    return {"wall": statistics.median(times), "mean": statistics.fmean(times),
            "system": system / ops}


async def hand_offs(path: Path, way: str, ops: int, size: int) -> dict[str, float]:
    """``ops`` operations of one way (see the module's docstring), per operation."""
    data = os.urandom(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    worker = _Worker("bench-flush")
    loop = asyncio.get_running_loop()
    try:
        def job(told: asyncio.Future[None], flush: bool) -> Callable[[], None]:
            def run() -> None:
                if flush:
                    os.fdatasync(fd)
                _settle_soon(told, None, None)
            return run

        if way == "two threads, a lock":
            return await asyncio.to_thread(_ping_pong, ops)
        user, system, switches = _usage()
        began = time.perf_counter()
        for op in range(ops):
            os.pwrite(fd, data, op * size)
            if way == "inline":
                os.fdatasync(fd)
                continue
            told: asyncio.Future[None] = loop.create_future()
            worker.post(job(told, flush=way == "on the worker"))
            await told
        wall = time.perf_counter() - began
        after = _usage()
    finally:
        worker.stop()
        os.close(fd)
        path.unlink()
    return {"wall": wall / ops, "user": (after[0] - user) / ops,
            "system": (after[1] - system) / ops, "switches": (after[2] - switches) / ops}


def _ping_pong(ops: int) -> dict[str, float]:
    """This thread and another hand a lock back and forth ``ops`` times."""
    there, back = threading.Lock(), threading.Lock()
    there.acquire()
    back.acquire()

    def other() -> None:
        for _ in range(ops):
            there.acquire()
            back.release()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    user, system, switches = _usage()
    began = time.perf_counter()
    for _ in range(ops):
        there.release()
        back.acquire()
    wall = time.perf_counter() - began
    after = _usage()
    thread.join()
    return {"wall": wall / ops, "user": (after[0] - user) / ops,
            "system": (after[1] - system) / ops, "switches": (after[2] - switches) / ops}


async def where(directory: Path, turns: int) -> dict[str, Any]:
    """Part 3 (see the module's docstring): ``turns`` turns, each flush's thread and time."""
    from cogency import Agent
    from cogency.storage import SQLiteStore
    from cogency.testing import ScriptedLLM

    real = os.fdatasync
    loop_thread = threading.current_thread()
    seen: list[tuple[bool, float]] = []  # (on the loop, seconds), one per flush

    def observed(fd: int) -> None:
        began = time.perf_counter()
        try:
            real(fd)
        finally:
            seen.append((threading.current_thread() is loop_thread,
                         time.perf_counter() - began))

    store = SQLiteStore(directory / "bench-flush.db", synchronous="full")
    llm = ScriptedLLM(itertools.repeat({"response": "ok"}))
    agent = Agent(llm, store=store, memory=False)
    os.fdatasync = observed  # this process's flushes, for the turns only
    try:
        conversation: str | None = None
        for turn in range(turns):
            if turn % 25 == 0:
                conversation = None
            conversation = (await agent.run("hello", "bench", conversation)).conversation_id
            llm.calls.clear()  # (a scripted model keeps what it was sent)
    finally:
        os.fdatasync = real
        await agent.close()
        await store.close()
    times = [took for _, took in seen]
    return {"turns": turns, "flushes": len(seen),
            "on_the_loop": sum(1 for here, _ in seen if here),
            "on_the_worker": sum(1 for here, _ in seen if not here),
            "slow": sum(1 for took in times if took > FLUSH_ON_LOOP_SECONDS),
            "percentiles": {str(q): percentile(times, q)
                            for q in (50, 90, 99, 100)} if times else {}}


def measure(directory: Path, rounds: int, ops: int, size: int, turns: int = 0
            ) -> dict[str, Any]:
    path = directory / "bench-flush.log"
    flush: dict[str, list[dict[str, float]]] = {way: [] for way in FLUSHES}
    hand: dict[str, list[dict[str, float]]] = {way: [] for way in HAND_OFFS}
    for _ in range(rounds):
        for way in FLUSHES:
            flush[way].append(flushes(path, way, ops, size))
        for way in HAND_OFFS:
            hand[way].append(asyncio.run(hand_offs(path, way, ops, size)))

    def medians(samples: list[dict[str, float]]) -> dict[str, float]:
        return {key: statistics.median(s[key] for s in samples) for key in samples[0]}

    result = {"case": "flush", "directory": str(directory), "rounds": rounds, "ops": ops,
              "bytes": size, "flush": {way: medians(s) for way, s in flush.items()},
              "hand_off": {way: medians(s) for way, s in hand.items()}}
    if turns:
        result["where"] = asyncio.run(where(directory, turns))
    return result


def table(result: dict[str, Any]) -> str:
    us = lambda seconds: f"{seconds * 1e6:.0f}"  # noqa: E731
    lines = [f"The flush after writing {result['bytes'] // 1024} KiB (medians of "
             f"{result['rounds']} rounds of {result['ops']}), in {result['directory']}:", "",
             "| way | wall p50 (µs) | wall mean (µs) | system CPU (µs) |", "|---|---:|---:|---:|"]
    for way, figures in result["flush"].items():
        lines.append(f"| {way} | {us(figures['wall'])} | {us(figures['mean'])} | "
                     f"{us(figures['system'])} |")
    lines += ["", "The hand-off, per operation (a write, then the flush or none):", "",
              "| way | wall (µs) | user CPU (µs) | system CPU (µs) | voluntary switches |",
              "|---|---:|---:|---:|---:|"]
    for way, figures in result["hand_off"].items():
        lines.append(f"| {way} | {us(figures['wall'])} | {us(figures['user'])} | "
                     f"{us(figures['system'])} | {figures['switches']:.1f} |")
    if "where" in result:
        lines += ["", where_line(result["where"])]
    return "\n".join(lines)


def where_line(where: dict[str, Any]) -> str:
    """Part 3 in a sentence."""
    ms = {q: f"{seconds * 1e3:.2f}" for q, seconds in where["percentiles"].items()}
    return (f"Where a lone run's flushes went ({where['turns']} turns at FULL): "
            f"{where['on_the_loop']} of {where['flushes']} on the event loop, "
            f"{where['on_the_worker']} on the worker; {where['slow']} took over "
            f"{FLUSH_ON_LOOP_SECONDS * 1e3:g} ms (flush p50 {ms.get('50')}, p90 {ms.get('90')}, "
            f"p99 {ms.get('99')}, longest {ms.get('100')} ms).")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_flush", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None,
                        help="the directory whose disk is measured (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300, help="operations per way and round")
    parser.add_argument("--kib", type=int, default=23, help="KiB written before each flush")
    parser.add_argument("--turns", type=int, default=1000,
                        help="turns of part 3 (0: leave it out)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.ops < 1 or args.kib < 1 or args.turns < 0:
        parser.error("--rounds, --ops and --kib must be positive, --turns not negative")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {str(args.dir)!r} is not a directory")
    with tempfile.TemporaryDirectory(prefix="bench-flush-", dir=args.dir) as directory:
        result = measure(Path(directory), args.rounds, args.ops, args.kib * 1024, args.turns)
    print(table(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
