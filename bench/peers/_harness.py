"""The cases every framework runs, the same way: scripts, texts, timing, assertions, JSON out.

A framework module (``bench/peers/<name>.py``) provides ``construct``, ``open_session`` and a
fake model at its own model boundary that reads its replies from a :class:`Script`. This
module runs one case in the current (fresh) process and prints one JSON line, which the
runner (``python -m bench``) collects. Frameworks are imported only inside the adapters, after
telemetry is switched off here.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

TELEMETRY_OFF = {
    "AGNO_TELEMETRY": "false",
    "AGNO_MONITOR": "false",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "OPENAI_AGENTS_DONT_LOG_MODEL_DATA": "1",
    "OPENAI_AGENTS_DONT_LOG_TOOL_DATA": "1",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
}
"""Set in every benchmark process before any framework is imported."""

RESULT_PREFIX = "BENCH_RESULT "
USER_ID = "bench-user"
SESSION_ID = "bench-conversation"
ANSWER_TOOL = "lookup"
HISTORY_FLOOR = 7
"""Conversation messages every framework sends the model once its history window is full
(Agno's default window is the last 3 runs: 6 messages, plus the new one)."""

# -- the same message texts for every framework ------------------------------------------------

_WORDS = (
    "ledger", "harbor", "quartz", "meadow", "signal", "copper", "lantern", "orbit", "pepper",
    "canyon", "velvet", "tundra", "marble", "cipher", "willow", "ember", "falcon", "glacier",
    "hollow", "island", "jasmine", "kernel", "lilac", "mosaic", "nectar", "oyster", "prism",
)


def _prose(seed: int, chars: int) -> str:
    words, index, length = [], seed, 0
    while length < chars:
        index = (index * 1103515245 + 12345) % 2**31
        words.append(_WORDS[index % len(_WORDS)])
        length += len(words[-1]) + 1
    return " ".join(words)[:chars]


def user_text(turn: int) -> str:
    """Turn ``turn``'s user message: about 160 characters, like a one-sentence question."""
    return f"Turn {turn}: " + _prose(turn, 150)


def answer_text(turn: int) -> str:
    """Turn ``turn``'s answer: about 480 characters, a paragraph."""
    return f"Answer {turn}: " + _prose(turn + 7919, 465)


def raw_text_bytes(turns: int) -> int:
    """UTF-8 size of every user message and answer of ``turns`` turns."""
    return sum(len(user_text(t).encode()) + len(answer_text(t).encode()) for t in range(1, turns + 1))


# -- the script the fake models read, and the tool -------------------------------------------


class Script:
    """What the fake model answers next. The harness sets a plan per run; fakes call :meth:`next`.

    Plan items are ``("answer", text)`` or ``("tool", name, key)``. Nothing is copied: the fake
    passes the number of conversation messages it was given (system messages not counted),
    kept in ``seen`` for the assertions.
    """

    __slots__ = ("plan", "step", "seen", "calls")

    def __init__(self) -> None:
        self.plan: tuple[tuple[str, ...], ...] = ()
        self.step = 0
        self.seen = 0
        self.calls = 0

    def set(self, *plan: tuple[str, ...]) -> None:
        self.plan = plan
        self.step = 0

    def next(self, seen: int) -> tuple[str, ...]:
        self.seen = seen
        self.calls += 1
        if self.step >= len(self.plan):
            raise AssertionError(f"the model was called more often than planned ({self.plan!r})")
        item = self.plan[self.step]
        self.step += 1
        return item


class ToolLog:
    """Counts real executions of the tool, so every tool-call run can prove the tool ran."""

    runs = 0
    last_key = ""


async def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: the key to look up.
    """
    ToolLog.runs += 1
    ToolLog.last_key = key
    return f"value-of-{key}"


# -- what an adapter provides ------------------------------------------------------------------


class Session(Protocol):
    """One agent bound to one conversation (durable when opened with a database path)."""

    async def turn(self, text: str) -> str:
        """Send one user message; return the final answer text."""
        ...

    async def close(self) -> None: ...

    def stored(self, db: sqlite3.Connection) -> int:
        """How many rows of this conversation the database holds (read with a plain connection)."""
        ...

    async def synchronous(self) -> set[int]:
        """``PRAGMA synchronous`` as read on every connection the framework wrote with."""
        ...


class Adapter(Protocol):
    NAME: str
    DISTRIBUTIONS: tuple[str, ...]
    IMPORTS: str

    def make_tool(self) -> Any:
        """The framework's tool object for :func:`lookup`, made once per process (as at
        module level in an application)."""
        ...

    def construct(self, script: Script, tool: Any) -> Any: ...

    async def open_session(
        self, script: Script, db_path: str | None, synchronous: str = "normal"
    ) -> Session: ...


SYNCHRONOUS = {"normal": 1, "full": 2}
"""``PRAGMA synchronous`` values: every framework's connections are set to the same one."""


# -- cases -------------------------------------------------------------------------------------


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def case_construct(adapter: Adapter, repeat: int, warmup: int) -> dict[str, Any]:
    script, tool = Script(), adapter.make_tool()
    for _ in range(warmup):
        adapter.construct(script, tool)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        agent = adapter.construct(script, tool)
        samples.append(time.perf_counter() - start)
        _check(agent is not None, "construct returned nothing")
    return {"samples": samples, "unit": "s"}


def case_construct_mem(adapter: Adapter, repeat: int, warmup: int) -> dict[str, Any]:
    """Peak traced bytes while building one agent (after a warm-up build), and bytes it keeps."""
    script, tool = Script(), adapter.make_tool()
    for _ in range(max(warmup, 1)):
        adapter.construct(script, tool)
    gc.collect()
    tracemalloc.start()
    peaks, kept, agents = [], [], []
    for _ in range(repeat):
        gc.collect()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        agents.append(adapter.construct(script, tool))
        current, peak = tracemalloc.get_traced_memory()
        peaks.append(peak - before)
        kept.append(current - before)
    tracemalloc.stop()
    return {"samples": peaks, "kept": kept, "unit": "B"}


async def case_one_step(adapter: Adapter, repeat: int, warmup: int) -> dict[str, Any]:
    script = Script()
    session = await adapter.open_session(script, None)
    samples = []
    try:
        for index in range(warmup + repeat):
            expected = answer_text(index + 1)
            script.set(("answer", expected))
            calls, text = script.calls, user_text(index + 1)
            start = time.perf_counter()
            answer = await session.turn(text)
            elapsed = time.perf_counter() - start
            _check(answer == expected, f"one-step answer {answer!r} is not {expected!r}")
            _check(script.calls == calls + 1, "a one-step run must call the model exactly once")
            if index >= warmup:
                samples.append(elapsed)
    finally:
        await session.close()
    return {"samples": samples, "unit": "s"}


async def case_tool_call(adapter: Adapter, repeat: int, warmup: int) -> dict[str, Any]:
    script = Script()
    session = await adapter.open_session(script, None)
    samples = []
    try:
        for index in range(warmup + repeat):
            key = f"k{index}"
            expected = answer_text(index + 1)
            script.set(("tool", ANSWER_TOOL, key), ("answer", expected))
            runs, text = ToolLog.runs, user_text(index + 1)
            start = time.perf_counter()
            answer = await session.turn(text)
            elapsed = time.perf_counter() - start
            _check(ToolLog.runs == runs + 1 and ToolLog.last_key == key, "the tool did not run")
            _check(answer == expected, f"tool-call answer {answer!r} is not {expected!r}")
            _check(script.step == 2, "a tool-call run must call the model twice")
            if index >= warmup:
                samples.append(elapsed)
    finally:
        await session.close()
    return {"samples": samples, "unit": "s"}


class _Conversation:
    """One durable conversation on a fresh file at ``path``, turn by turn.

    Every turn asserts the answer, that the model saw more history than the turn before (until
    the framework's own history window is full), and that the database holds more rows; the
    closing, that every connection the framework wrote with had ``synchronous`` set.
    ``setup`` and ``cpu``: seconds spent opening and closing the agent and its database, and
    CPU seconds of this process, all threads, over the opening, the turns and the closing."""

    def __init__(self, adapter: Adapter, path: Path, synchronous: str) -> None:
        self.adapter, self.path, self.synchronous = adapter, path, synchronous
        self.script = Script()
        self.session: Session | None = None
        self.check: sqlite3.Connection | None = None  # opened once the framework made its
        self.rows = self.turns = 0                    # file: one opened before makes it empty
        self.setup = self.cpu = 0.0

    async def open(self) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        self.session = await self.adapter.open_session(self.script, str(self.path),
                                                       self.synchronous)
        self.setup += time.perf_counter() - start
        self.cpu += time.process_time() - cpu_start

    async def turn(self) -> float:
        """The next turn; its wall time."""
        assert self.session is not None
        turn = self.turns = self.turns + 1
        expected = answer_text(turn)
        self.script.set(("answer", expected))
        text = user_text(turn)  # built before the clock starts, as the answer is
        start, cpu_start = time.perf_counter(), time.process_time()
        answer = await self.session.turn(text)
        elapsed = time.perf_counter() - start
        self.cpu += time.process_time() - cpu_start
        _check(answer == expected, f"turn {turn}: answer {answer!r} is not {expected!r}")
        wanted = min(2 * turn - 1, HISTORY_FLOOR)
        _check(
            self.script.seen >= wanted,
            f"turn {turn}: the model saw {self.script.seen} conversation messages, not at "
            f"least {wanted}: the history was not carried",
        )
        if self.check is None:
            _check(self.path.exists(), f"turn {turn}: no new row in the database (no file)")
            self.check = _reader(self.path)
        stored = self.session.stored(self.check)
        _check(stored > self.rows, f"turn {turn}: no new row in the database ({stored} rows)")
        self.rows = stored
        return elapsed

    async def close(self, *, checked: bool = True) -> int:
        """Close it (after checking ``synchronous``, unless it failed); the file's bytes."""
        try:
            if checked and self.session is not None:
                await check_synchronous(self.session, self.synchronous)
        finally:
            if self.check is not None:
                self.check.close()
            if self.session is not None:
                start, cpu_start = time.perf_counter(), time.process_time()
                await self.session.close()
                self.setup += time.perf_counter() - start
                self.cpu += time.process_time() - cpu_start
        path = self.path
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def _conversation(
    adapter: Adapter, turns: int, directory: Path, on_turn: Callable[[int, float], None],
    synchronous: str = "normal",
) -> tuple[int, int, float, float]:
    """Run ``turns`` turns of one durable conversation on a fresh file (``_Conversation``).

    Returns (rows, bytes, seconds spent opening and closing the agent and its database,
    CPU seconds of this process, all threads, over the opening, the turns and the closing).
    """
    conversation = _Conversation(adapter, directory / f"{adapter.NAME}.db", synchronous)
    await conversation.open()
    try:
        for turn in range(1, turns + 1):
            on_turn(turn, await conversation.turn())
    except BaseException:
        await conversation.close(checked=False)
        raise
    size = await conversation.close()
    return conversation.rows, size, conversation.setup, conversation.cpu


def _reader(path: Path) -> sqlite3.Connection:
    """The harness's own connection to the framework's file, which never makes the file: a
    framework that made none fails here, and one that makes its file on first use makes it."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True)


async def check_synchronous(session: Session, synchronous: str) -> None:
    """Equal durability, proven: every connection the framework wrote with reads back the
    ``synchronous`` the benchmark set."""
    seen = await session.synchronous()
    _check(seen == {SYNCHRONOUS[synchronous]},
           f"PRAGMA synchronous read back {sorted(seen)} on the framework's connections, not "
           f"{SYNCHRONOUS[synchronous]} ({synchronous})")


async def case_durable(
    adapter: Adapter, repeat: int, warmup: int, turns: int, synchronous: str = "normal"
) -> dict[str, Any]:
    """Per-turn time of a whole ``turns``-turn durable conversation on a fresh database file:
    opening the agent and database (schema creation included), every turn, closing; divided
    by ``turns``. The correctness reads between turns are not timed."""
    samples, cpu_samples = [], []
    for index in range(warmup + repeat):
        times: list[float] = []
        with tempfile.TemporaryDirectory(prefix="bench-") as directory:
            _, _, setup, cpu = await _conversation(
                adapter, turns, Path(directory), lambda _t, s: times.append(s), synchronous
            )
        if index >= warmup:
            samples.append((sum(times) + setup) / len(times))
            cpu_samples.append(cpu / len(times))
    return {"samples": samples, "unit": "s", "turns": turns, "cpu_samples": cpu_samples,
            "cpu_median": statistics.median(cpu_samples) if cpu_samples else None,
            "cpu_p95": percentile(cpu_samples, 95) if cpu_samples else None,
            "synchronous": synchronous}


LATE_SAMPLES = 10
"""Turns at the end of the long conversation each timed against turn 10 of a fresh one."""


async def case_long(adapter: Adapter, turns: int, synchronous: str = "normal",
                    samples: int = LATE_SAMPLES) -> dict[str, Any]:
    """Every turn's time in one ``turns``-turn durable conversation, and the database's size.

    Its last ``samples`` turns alternate with turn 10 of as many fresh conversations,
    each on a file of its own and brought to turn 9 beforehand: a late turn, an early one, a
    late one... (``late`` and ``turn10``; their ratio is the growth). A shared machine's slow
    and fast spells last longer than a turn and fall on both alike, and each timed turn
    follows one turn of another conversation."""
    times: list[float] = []
    late: list[float] = []
    early: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as directory:
        folder = Path(directory)
        main = _Conversation(adapter, folder / f"{adapter.NAME}.db", synchronous)
        fresh = [_Conversation(adapter, folder / f"{adapter.NAME}-early-{n}.db", synchronous)
                 for n in range(min(samples, turns))]
        opened: list[_Conversation] = []
        try:
            for conversation in (main, *fresh):
                await conversation.open()
                opened.append(conversation)
            for conversation in fresh:
                for _ in range(9):
                    await conversation.turn()
            waiting = iter(fresh)
            for turn in range(1, turns + 1):
                times.append(await main.turn())
                if turn > turns - len(fresh):
                    late.append(times[-1])
                    early.append(await next(waiting).turn())
        except BaseException:
            for conversation in opened:
                await conversation.close(checked=False)
            raise
        for conversation in fresh:
            await conversation.close()
        size = await main.close()
    raw = raw_text_bytes(turns)
    return {
        "per_turn": times, "unit": "s", "turns": turns, "rows": main.rows, "db_bytes": size,
        "raw_bytes": raw, "db_ratio": size / raw, "synchronous": synchronous,
        "late": late, "turn10": early,
    }


async def case_first_answer(adapter: Adapter, synchronous: str) -> dict[str, Any]:
    """One durable turn on a fresh file, in a fresh process: the runner times the process
    from its start to this result line; reported here, the process's CPU time and resident
    memory once the answer is stored."""
    script = Script()
    with tempfile.TemporaryDirectory(prefix="bench-") as directory:
        path = str(Path(directory) / f"{adapter.NAME}.db")
        session = await adapter.open_session(script, path, synchronous)
        try:
            expected = answer_text(1)
            script.set(("answer", expected))
            answer = await session.turn(user_text(1))
            _check(answer == expected, f"first answer {answer!r} is not {expected!r}")
            result = {"cpu": time.process_time(), **memory(), "synchronous": synchronous}
            check = _reader(Path(path))
            try:
                _check(session.stored(check) > 0, "the first answer stored no row")
            finally:
                check.close()
            await check_synchronous(session, synchronous)
        finally:
            await session.close()
    return result


def memory() -> dict[str, int]:
    """This process's resident memory now and at its peak (KiB, from /proc; 0 elsewhere)."""
    found = {"rss_kib": 0, "peak_kib": 0}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                found["rss_kib"] = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                found["peak_kib"] = int(line.split()[1])
    except OSError:
        pass
    return found


CASES = ("construct", "construct_mem", "one_step", "tool_call", "durable", "long", "turns",
         "first_answer")


def run_case(adapter: Adapter, case: str, repeat: int, warmup: int, turns: int,
             synchronous: str = "normal") -> dict[str, Any]:
    if case == "construct":
        result = case_construct(adapter, repeat, warmup)
    elif case == "construct_mem":
        result = case_construct_mem(adapter, repeat, warmup)
    elif case == "one_step":
        result = asyncio.run(case_one_step(adapter, repeat, warmup))
    elif case == "tool_call":
        result = asyncio.run(case_tool_call(adapter, repeat, warmup))
    elif case == "durable":
        result = asyncio.run(case_durable(adapter, repeat, warmup, turns, synchronous))
    elif case == "long":
        result = asyncio.run(case_long(adapter, turns, synchronous))
    elif case == "turns":  # the long conversation alone (what strace counts the fsyncs of)
        result = asyncio.run(case_long(adapter, turns, synchronous, samples=0))
    elif case == "first_answer":
        result = asyncio.run(case_first_answer(adapter, synchronous))
    else:
        raise SystemExit(f"unknown case {case!r}; one of {', '.join(CASES)}")
    if "samples" in result and result["samples"]:
        result["median"] = statistics.median(result["samples"])
        result["p95"] = percentile(result["samples"], 95)
    return {"framework": adapter.NAME, "case": case, **result}


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile, linearly interpolated (numpy's default method)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * pct / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main(adapter: ModuleType, argv: list[str] | None = None) -> None:
    """``python -m bench.peers.<framework> CASE[:REPEAT[:WARMUP]] ... [--turns N]``.

    Runs the cases in order in this process and prints one JSON line per case. For ``long``
    and ``turns`` (the same conversation, without turn 10 of fresh ones to alternate with)
    the number after the colon is the conversation's length in turns.
    """
    parser = argparse.ArgumentParser(prog=f"python -m bench.peers.{adapter.NAME}")
    parser.add_argument("cases", nargs="+", metavar="CASE[:REPEAT[:WARMUP]]")
    parser.add_argument("--turns", type=int, default=25, help="turns of the durable case")
    parser.add_argument("--synchronous", choices=sorted(SYNCHRONOUS), default="normal",
                        help="PRAGMA synchronous of every connection of the durable cases")
    args = parser.parse_args(argv)
    quiet()
    for spec in args.cases:
        name, *numbers = spec.split(":")
        if name not in CASES:
            parser.error(f"unknown case {name!r}; one of {', '.join(CASES)}")
        repeat = int(numbers[0]) if numbers else 20
        warmup = int(numbers[1]) if len(numbers) > 1 else 3
        turns = repeat if name in ("long", "turns") else args.turns
        result = run_case(adapter, name, repeat, warmup, turns,  # type: ignore[arg-type]
                          args.synchronous)
        sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
        sys.stdout.flush()


def quiet() -> None:
    """Telemetry off and warnings silenced, before a framework is imported."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)
    warnings.simplefilter("ignore")
