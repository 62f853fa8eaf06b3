"""``python -m bench.replay``: a durable Cogency turn against its own SQL run through plain sqlite3.

The SQL floor of a turn: what the statements a turn sends SQLite cost with nothing around
them. One conversation is run with its store's connection recording every statement with its
parameters (``execute``/``executemany``), turn by turn; then, interleaved turn by turn, a
fresh Cogency conversation (timed) and the recorded turns replayed through a plain
``sqlite3`` connection on a fresh file (timed), both at the same ``synchronous``. The ratio of
their CPU per turn is what Cogency adds to its SQL (the agent loop, the model call, the
thread hop to the store's worker, Python around every statement).

The replay is checked to be the same work: sqlite3's trace callback, on the recording
connection and on an untimed replay, sees the same statements with the same values, in the
same order (a statement the recording missed would show there). The store's own flushes of
the log (``os.fdatasync``, at ``synchronous="full"``) are recorded where they fell among the
statements, and replayed as a flush of the replay's log. Two replays: parameterized,
as the store sends them (the floor: the statements are parsed once and cached, as the
store's are), and literal, the traced SQL text itself (each statement parsed again).

    python -m bench.replay --synchronous full --turns 60     # prints one JSON line
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.peers import cogency as adapter
from bench.peers._harness import SESSION_ID, USER_ID, Script, answer_text, user_text

Statement = tuple[str, str, Any, int]  # ("one" | "many" | "flush", sql, parameters, connection)
Trace = tuple[int, str]  # (connection, the SQL as sqlite3's trace callback saw it)
FLUSH: Trace = (-1, "fdatasync")  # the store flushed its log (no connection's statement)


class _Recording(sqlite3.Connection):
    """A connection that records every statement it is asked to run, with its parameters.
    Connections are numbered in the order they were opened (the store's own first, then the
    one its checkpoints run on)."""

    log: list[Statement]
    number: int
    traces: list[Trace]
    refires: set[int]

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        self.log.append(("one", sql, parameters, self.number))
        mark = len(self.traces)
        try:
            return super().execute(sql, parameters)
        finally:
            self._refired(mark)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:  # type: ignore[override]
        rows = list(parameters)
        self.log.append(("many", sql, rows, self.number))
        mark = len(self.traces)
        try:
            return super().executemany(sql, rows)
        finally:
            self._refired(mark)

    def _refired(self, mark: int) -> None:
        """SQLite's trace callback fires again, with the same text, as a statement runs a
        subprogram (a foreign key's cascade, a trigger): those entries since ``mark`` go to
        ``refires``, so that the literal replay runs the statement once, as the store did."""
        ours = [at for at in range(mark, len(self.traces)) if self.traces[at][0] == self.number]
        self.refires.update(at for before, at in zip(ours, ours[1:])
                            if self.traces[at] == self.traces[before])

    def executescript(self, script: str, /) -> sqlite3.Cursor:  # type: ignore[override]
        raise AssertionError("the store ran a script: replay cannot record it statement-wise")


@contextmanager
def recording(log: list[Statement], traces: list[Trace],
              refires: set[int] | None = None) -> Iterator[None]:
    """Every ``sqlite3.connect`` in this block makes a recording, traced connection;
    ``refires`` gets the indexes of the trace entries a statement's subprograms made."""
    real = sqlite3.connect
    opened = [0]

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = real(*args, factory=_Recording, **kwargs)
        assert isinstance(connection, _Recording)
        number = connection.number = opened[0]
        opened[0] += 1
        connection.log, connection.traces = log, traces
        connection.refires = set() if refires is None else refires
        connection.set_trace_callback(lambda sql: traces.append((number, sql)))
        return connection

    real_flush = os.fdatasync

    def flush(fd: int) -> None:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(" (deleted)"):  # (else: a new
            log.append(("flush", "", None, FLUSH[0]))                     # file, made of
            traces.append(FLUSH)                                          # the image)
        real_flush(fd)

    sqlite3.connect = connect  # type: ignore[assignment]
    os.fdatasync = flush
    try:
        yield
    finally:
        sqlite3.connect = real  # type: ignore[assignment]
        os.fdatasync = real_flush


async def capture(path: Path, turns: int, synchronous: str
                  ) -> tuple[list[Statement], list[list[Statement]], list[Trace],
                             list[list[Trace]]]:
    """The statements of opening the store and of each of ``turns`` turns, the whole trace,
    and each turn's traced statements (literal SQL, each statement once: not again for the
    subprograms it ran). A checkpoint the store's copier thread ran during a turn counts in
    that turn, on a connection of its own."""
    log: list[Statement] = []
    traces: list[Trace] = []
    refires: set[int] = set()
    script = Script()
    per_turn: list[list[Statement]] = []
    traced: list[list[Trace]] = []
    with recording(log, traces, refires):
        session = await adapter.open_session(script, str(path), synchronous)
        try:
            await session.store.list_tasks(USER_ID)  # opens the connection: setup, untimed
            setup_end = len(log)
            for turn in range(1, turns + 1):
                script.set(("answer", answer_text(turn)))
                before, before_trace = len(log), len(traces)
                assert await session.turn(user_text(turn)) == answer_text(turn)
                per_turn.append(log[before:])
                traced.append([trace for at, trace in enumerate(traces[before_trace:],
                                                                before_trace)
                               if at not in refires])
            turns_end = len(traces)  # what closing the store runs is neither replayed nor timed
        finally:
            await session.close()
    return log[:setup_end], per_turn, traces[:turns_end], traced


class Replay:
    """Plain ``sqlite3`` connections to one file, one for each the store opened (numbered
    alike), each opened when first used."""

    def __init__(self, path: Path, trace: Any = None) -> None:
        self.path, self.trace = path, trace
        self.connections: dict[int, sqlite3.Connection] = {}
        self.log: int | None = None  # the replay's write-ahead log, open to flush it

    def flush(self) -> None:
        """What the store's flush does: ``fdatasync`` of the write-ahead log."""
        if self.log is None:
            self.log = os.open(f"{self.path}-wal", os.O_RDONLY)
        os.fdatasync(self.log)
        if self.trace is not None:
            self.trace(FLUSH)

    def __getitem__(self, number: int) -> sqlite3.Connection:
        db = self.connections.get(number)
        if db is None:
            from cogency.storage.sqlite import CHAIN_TURNS, _chain_turns

            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            # The function the store's statements call (a turn's SQL work includes it).
            db.create_function(CHAIN_TURNS, 2, _chain_turns, deterministic=True)
            if self.trace is not None:
                db.set_trace_callback(lambda sql: self.trace((number, sql)))
            self.connections[number] = db
        return db

    def close(self) -> None:
        if self.log is not None:
            os.close(self.log)
        for db in reversed(self.connections.values()):
            db.close()


def replay_connection(path: Path, setup: list[Statement], trace: Any = None) -> Replay:
    """A replay of ``setup`` on a new file at ``path``, made as the store makes one (of the
    schema's image where it can, ``_make_from_image``): the store's opening statements then
    find the file they found."""
    from cogency.storage.sqlite import _make_from_image

    _make_from_image(path)
    replay = Replay(path, trace)
    run(replay, setup)
    return replay


def run(replay: Replay, statements: list[Statement]) -> None:
    for kind, sql, parameters, number in statements:
        if kind == "one":
            replay[number].execute(sql, parameters).fetchall()
        elif kind == "many":
            replay[number].executemany(sql, parameters)
        else:
            replay.flush()


async def measure(turns: int, synchronous: str, skip: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as directory:
        folder = Path(directory)
        setup, per_turn, traces, traced = await capture(folder / "captured.db", turns,
                                                        synchronous)
        # The replay is the same work: the same statements, values and order, on each
        # connection (the copier's statements fall between the store's as the threads ran).
        replayed: list[Trace] = []
        check = replay_connection(folder / "check.db", setup, replayed.append)
        for statements in per_turn:
            run(check, statements)
        check.close()
        for number in sorted({n for n, _ in traces} | {n for n, _ in replayed}):
            ours = [sql for n, sql in replayed if n == number]
            theirs = [sql for n, sql in traces if n == number]
            if ours != theirs:
                first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                             min(len(ours), len(theirs)))
                raise AssertionError(
                    f"the replay differs from the recorded turns on connection {number} at "
                    f"statement {first}: {ours[first:first + 1]!r} vs "
                    f"{theirs[first:first + 1]!r}")

        db = replay_connection(folder / "replay.db", setup)
        literal = replay_connection(folder / "literal.db", setup)
        script = Script()
        session = await adapter.open_session(script, str(folder / "timed.db"), synchronous)
        wall: dict[str, list[float]] = {"cogency": [], "replay": [], "literal": []}
        cpu: dict[str, list[float]] = {"cogency": [], "replay": [], "literal": []}
        try:
            for turn, (statements, texts) in enumerate(zip(per_turn, traced), start=1):
                script.set(("answer", answer_text(turn)))
                text = user_text(turn)  # built before the clock starts, as the answer is
                began, began_cpu = time.perf_counter(), time.process_time()
                answer = await session.turn(text)
                wall["cogency"].append(time.perf_counter() - began)
                cpu["cogency"].append(time.process_time() - began_cpu)
                assert answer == answer_text(turn)
                began, began_cpu = time.perf_counter(), time.process_time()
                run(db, statements)
                wall["replay"].append(time.perf_counter() - began)
                cpu["replay"].append(time.process_time() - began_cpu)
                began, began_cpu = time.perf_counter(), time.process_time()
                for number, text in texts:  # as sqlite3's trace callback saw it: literal
                    if (number, text) == FLUSH:
                        literal.flush()
                    else:
                        literal[number].execute(text).fetchall()
                wall["literal"].append(time.perf_counter() - began)
                cpu["literal"].append(time.process_time() - began_cpu)
            seen = await session.synchronous()
        finally:
            await session.close()
            db.close()
            literal.close()
        assert seen == {{"normal": 1, "full": 2}[synchronous]}, seen
    statements_per_turn = statistics.median(
        sum(len(p) if k == "many" else k == "one" for k, _, p, _ in s) for s in per_turn)
    med = {key: {way: statistics.median(values[skip:]) for way, values in figures.items()}
           for key, figures in (("wall", wall), ("cpu", cpu))}
    return {
        "case": "replay", "framework": "cogency", "synchronous": synchronous, "turns": turns,
        "statements_per_turn": statements_per_turn,
        "transactions_per_turn": statistics.median(
            sum(1 for _, sql, _, _ in s if sql.startswith("BEGIN")) for s in per_turn),
        "wall": med["wall"], "cpu": med["cpu"],
        "cpu_ratio": med["cpu"]["cogency"] / med["cpu"]["replay"],
        "wall_ratio": med["wall"]["cogency"] / med["wall"]["replay"],
        "cpu_ratio_literal": med["cpu"]["cogency"] / med["cpu"]["literal"],
        "wall_ratio_literal": med["wall"]["cogency"] / med["wall"]["literal"],
        "conversation": SESSION_ID,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal")
    parser.add_argument("--turns", type=int, default=60)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.turns, args.synchronous))))


if __name__ == "__main__":
    sys.exit(main())
