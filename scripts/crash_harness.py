"""Crash harness: agent tasks killed with SIGKILL at random moments, then checked and resumed.

Each round starts a worker process that runs agent tasks (a ScriptedLLM, a tool that appends
a line to a side-effect file) on one database (a SQLite file, or PostgreSQL with ``--db
postgresql://…``, directly or through a pooler), and kills it with SIGKILL after a random
delay. Then, in this process:

1. a SQLite database passes ``PRAGMA integrity_check`` and ``foreign_key_check`` (PostgreSQL
   enforces its keys itself);
2. every conversation's messages have seqs 1..message_count, no gap, no duplicate;
3. every message whose commit the worker logged (after ``save`` returned) is there, once;
4. every unfinished task is resumed to ``completed`` with ``Agent.resume``, and no tool call
   whose result was stored before the kill runs again (the side-effect file shows it);
5. every job then holds each of its tool results exactly once and its answer once.

    python scripts/crash_harness.py --kills 500          # the full run (figures for docs)
    python scripts/crash_harness.py --kills 100 --db postgresql://user@host/empty_db
    python scripts/crash_harness.py --kills 300 --parallel 3 --synchronous full  # grouped flushes
    python scripts/crash_harness.py --kills 300 --checkpoint-bytes 65536  # kills in checkpoints
    python scripts/crash_harness.py zygote   # (started by the rounds: forks the workers)

On PostgreSQL the database must be empty at the start; the checks read it with the same URL,
so give a role that sees every user's rows (row-level security: a superuser or BYPASSRLS).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

USERS = ("ana", "bo", "cy")
CHECKPOINT_ENV = "COGENCY_CRASH_CHECKPOINT_BYTES"
"""The SQLite workers' ``CHECKPOINT_BYTES`` (``--checkpoint-bytes``)."""
MAX_CONVERSATION_MESSAGES = 60
"""Conversations are continued while short, so a resumed task sees all its own results."""


# -- what every job does ------------------------------------------------------------------


def job_query(job: str, steps: int) -> str:
    return f"job {job} steps {steps}"


def parse_query(query: str) -> tuple[str, int]:
    match = re.fullmatch(r"job (\S+) steps (\d+)", query)
    if match is None:
        raise ValueError(f"not a harness query: {query!r}")
    return match.group(1), int(match.group(2))


def step_keys(job: str, steps: int) -> list[list[str]]:
    """The side-effect keys of each step: odd steps make two calls at once."""
    return [[f"{job}:{k}a", f"{job}:{k}b"] if k % 2 else [f"{job}:{k}"] for k in range(1, steps + 1)]


def script(job: str, steps: int) -> list[dict[str, Any]]:
    replies: list[dict[str, Any]] = []
    for number, keys in enumerate(step_keys(job, steps), start=1):
        replies.append({
            "secure": True, "understanding": f"step {number}", "response": None,
            "actions": [{"name": "append_line", "args": {"key": key}} for key in keys],
        })
    replies.append({"secure": True, "response": f"done {job}", "actions": []})
    return replies


def append_tool(side: Path):
    from cogency import tool

    @tool
    def append_line(key: str) -> str:
        """Append a line to the side-effect file (a side effect that must not repeat)."""
        fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{key}\n".encode())  # one write: a line is there whole or not at all
        finally:
            os.close(fd)
        return f"appended {key}"

    return append_line


# -- the worker (killed at a random moment) ------------------------------------------------


def logging_store(target: str, log: Path, synchronous: str = "normal"):
    from cogency.storage import open_store

    class LoggingStore(type(open_store(target))):  # type: ignore[misc]
        """Logs each saved message after its transaction committed: the worker's promise."""

        async def save(self, batch):  # type: ignore[no-untyped-def]
            version = await super().save(batch)
            lines = "".join(
                json.dumps({"conversation_id": batch.conversation_id, "seq": m["seq"],
                            "sha": _sha(m["content"])}) + "\n"
                for m in batch.messages
            )
            if lines:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, lines.encode())
                finally:
                    os.close(fd)
            return version

    return LoggingStore(target) if _postgres(target) else LoggingStore(target,
                                                                       synchronous=synchronous)


def zygote() -> None:
    """Import everything once, then fork a worker per ``fork DB SIDE LOG SEED`` line.

    Starting Python and loading the tokenizer takes over a second; forking a warm process
    takes milliseconds, so the kills land inside tasks. ``reap PID`` collects a killed worker
    (a zombie would still look like a running task holder).
    """
    import cogency.agent  # noqa: F401
    import cogency.testing  # noqa: F401
    from cogency.storage import sqlite as backend
    from cogency.tokens import count_tokens

    if os.environ.get(CHECKPOINT_ENV):  # checkpoints every few jobs, so kills land in them
        backend.CHECKPOINT_BYTES = int(os.environ[CHECKPOINT_ENV])

    count_tokens("warm up")
    os.write(1, b"zygote ready\n")
    for line in sys.stdin:
        command, *args = line.split()
        if command == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    asyncio.run(worker(args[0], Path(args[1]), Path(args[2]), int(args[3]),
                                       int(args[4]), args[5]))
                finally:
                    os._exit(0)
        elif command == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            os.write(1, f"reaped {args[0]} {status}\n".encode())


async def worker(db: str, side: Path, log: Path, seed: int, parallel: int = 1,
                 synchronous: str = "normal") -> None:
    """Jobs one after another, in ``parallel`` loops at once (each with users of its own,
    so no two run in one conversation), until killed."""
    store = logging_store(db, log, synchronous)
    await store.list_tasks()  # open and migrate before saying ready
    append = append_tool(side)
    os.write(1, f"ready {os.getpid()}\n".encode())
    await asyncio.gather(*(jobs(store, append, seed, lane, USERS[lane::parallel])
                           for lane in range(parallel)))


async def jobs(store: Any, append: Any, seed: int, lane: int, users: tuple[str, ...]) -> None:
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    rng = random.Random(seed if lane == 0 else seed * 10 + lane)  # one lane: as before
    for number in range(1_000_000):
        user = rng.choice(users)
        conversation = None
        if rng.random() < 0.6:
            short = [c.conversation_id for c in await store.list_conversations(user)
                     if c.message_count < MAX_CONVERSATION_MESSAGES]
            conversation = rng.choice(short) if short else None
        job, steps = f"{seed}-{lane}-{number}", rng.randint(1, 4)
        agent = Agent(llm=ScriptedLLM(script(job, steps)), tools=[append], store=store,
                      max_iterations=12, retry_delay=0)
        await agent.run(job_query(job, steps), user_id=user, conversation_id=conversation)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# -- the checks -----------------------------------------------------------------------------


@dataclass
class Figures:
    kills: int = 0
    kills_mid_task: int = 0
    tasks_resumed: int = 0
    jobs: int = 0
    messages: int = 0
    committed_checked: int = 0
    tool_calls: int = 0
    recorded_not_rerun: int = 0
    rerun_unrecorded: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.kills} SIGKILLs ({self.kills_mid_task} left a task unfinished), "
            f"{self.tasks_resumed} tasks resumed to completion, {self.jobs} jobs, "
            f"{self.messages} messages stored, {self.committed_checked} logged commits checked, "
            f"{self.tool_calls} tool calls; {self.recorded_not_rerun} recorded calls not re-run "
            f"on resume, {self.rerun_unrecorded} unrecorded calls run again (at least once); "
            f"{len(self.failures)} failures; {self.seconds:.1f}s"
        )


def _postgres(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def _rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    if _postgres(db):
        from concurrent.futures import ThreadPoolExecutor

        async def fetch() -> list[tuple[Any, ...]]:
            import asyncpg

            connection = await asyncpg.connect(db, timeout=10)
            try:
                return [tuple(row) for row in await connection.fetch(sql)]
            finally:
                await connection.close()

        with ThreadPoolExecutor(1) as thread:  # its own event loop, whoever calls
            return thread.submit(asyncio.run, fetch()).result()
    connection = sqlite3.connect(db)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def check_database(db: str, log: Path) -> tuple[int, list[str]]:
    """Integrity, contiguous seqs, and every logged commit present exactly once."""
    failures = []
    if not _postgres(db):
        integrity = _rows(db, "PRAGMA integrity_check")
        if integrity != [("ok",)]:
            failures.append(f"integrity_check: {integrity[:3]}")
        if _rows(db, "PRAGMA foreign_key_check"):
            failures.append("foreign_key_check found orphans")
    counts: dict[str, int] = {}
    seqs: dict[str, list[int]] = {}
    stored: dict[tuple[str, int], str] = {}
    for conversation_id, count, seq, content in _rows(  # one statement: one snapshot
        db, "SELECT c.conversation_id, c.message_count, m.seq, m.content FROM conversations c "
        "LEFT JOIN conversation_messages m USING (conversation_id) ORDER BY 1, 3"
    ):
        counts[conversation_id] = count
        if seq is not None:
            seqs.setdefault(conversation_id, []).append(seq)
            stored[(conversation_id, seq)] = _sha(content)
    for conversation_id, count in counts.items():
        if seqs.get(conversation_id, []) != list(range(1, count + 1)):
            failures.append(f"conversation {conversation_id}: seqs are not 1..{count}")
    checked = 0
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the last line of a killed write
            checked += 1
            if stored.get((entry["conversation_id"], entry["seq"])) != entry["sha"]:
                failures.append(f"logged commit {entry} is missing or changed")
    return checked, failures


def _tool_results(db: str) -> Counter[str]:
    keys: Counter[str] = Counter()
    for (content,) in _rows(db, "SELECT content FROM conversation_messages WHERE role = 'tool'"):
        result = json.loads(content)
        keys[result["args"]["key"]] += 1
    return keys


def _side(side: Path) -> Counter[str]:
    return Counter(side.read_text().split()) if side.exists() else Counter()


async def resume_all(db: str, side: Path, figures: Figures) -> None:
    """Resume every unfinished task (in this process) with its full script."""
    from cogency import Agent
    from cogency.storage import open_store
    from cogency.testing import ScriptedLLM

    store = open_store(db)
    append = append_tool(side)
    try:
        for task in await store.list_tasks():
            job, steps = parse_query(task.query)
            agent = Agent(llm=ScriptedLLM(script(job, steps)), tools=[append], store=store,
                          max_iterations=12, retry_delay=0)
            result = await agent.resume(task.task_id, user_id=task.user_id)
            figures.tasks_resumed += 1
            if result.stop_reason != "completed" or result.response != f"done {job}":
                figures.failures.append(f"resume of {job}: {result.stop_reason} {result.error}")
    finally:
        await store.close()


def check_jobs(db: str, side: Path, figures: Figures) -> None:
    """Every job finished, holding each tool result once, its answer once, its query once."""
    results = _tool_results(db)
    lines = _side(side)
    users = Counter(c for (c,) in _rows(db, "SELECT content FROM conversation_messages WHERE role='user'"))
    answers = Counter(c for (c,) in _rows(
        db, "SELECT content FROM conversation_messages WHERE role='assistant' AND content LIKE 'done %'"))
    figures.jobs = len(users)
    figures.messages = _rows(db, "SELECT count(*) FROM conversation_messages")[0][0]
    figures.tool_calls = sum(results.values())
    if _rows(db, "SELECT count(*) FROM task_workspaces")[0][0]:
        figures.failures.append("unfinished tasks remain after resume")
    for query, count in users.items():
        job, steps = parse_query(query)
        if count != 1:
            figures.failures.append(f"{job}: its query is stored {count} times")
        if answers[f"done {job}"] != 1:
            figures.failures.append(f"{job}: its answer is stored {answers[f'done {job}']} times")
        for key in (k for keys in step_keys(job, steps) for k in keys):
            if results[key] != 1:
                figures.failures.append(f"{key}: {results[key]} results stored")
            if lines[key] < 1:
                figures.failures.append(f"{key}: a result is stored but the tool never ran")


# -- rounds ---------------------------------------------------------------------------------


async def run_rounds(
    workdir: Path, kills: int, seed: int = 0, max_delay: float = 0.3,
    on_round: Any = None, db: str | None = None, parallel: int = 1,
    synchronous: str = "normal", checkpoint_bytes: int | None = None,
) -> Figures:
    """Kill ``kills`` workers; check and resume after each. Returns the figures. ``db``: a
    PostgreSQL URL (an empty database), else a SQLite file in ``workdir`` (opened by the
    workers with ``synchronous``). Each worker runs ``parallel`` jobs at once (1 to 3).
    ``checkpoint_bytes``: the SQLite workers checkpoint that often (default 4 MiB)."""
    if not 1 <= parallel <= len(USERS):
        raise ValueError(f"parallel must be 1 to {len(USERS)}: each lane has users of its own")
    workdir.mkdir(parents=True, exist_ok=True)
    file = workdir / "crash.db"
    side, log = workdir / "side.txt", workdir / "committed.log"
    for stale in (file, side, log, file.with_name(file.name + "-wal"),
                  file.with_name(file.name + "-shm")):
        stale.unlink(missing_ok=True)  # the checks compare against this run's own records
    db = db or str(file)
    rng = random.Random(seed)
    figures = Figures()
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH")]))}
    if checkpoint_bytes is not None:
        env[CHECKPOINT_ENV] = str(checkpoint_bytes)
    zygote_process = subprocess.Popen(
        [sys.executable, __file__, "zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=env, text=True, bufsize=1,
    )
    assert zygote_process.stdin is not None and zygote_process.stdout is not None
    try:
        if zygote_process.stdout.readline().strip() != "zygote ready":
            raise RuntimeError("the crash worker zygote did not start")
        for number in range(kills):
            zygote_process.stdin.write(f"fork {db} {side} {log} {seed * 100_000 + number} "
                                       f"{parallel} {synchronous}\n")
            ready = zygote_process.stdout.readline().split()
            if ready[:1] != ["ready"]:
                raise RuntimeError(f"the worker did not start: {ready}")
            pid = int(ready[1])
            time.sleep(rng.uniform(0, max_delay))
            os.kill(pid, signal.SIGKILL)
            zygote_process.stdin.write(f"reap {pid}\n")
            reaped = zygote_process.stdout.readline().split()
            status = int(reaped[2])
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                figures.failures.append(f"round {number}: the worker ended by itself ({status})")
            await _after_kill(number, db, side, log, figures)
            if on_round:
                on_round(number, figures)
    finally:
        zygote_process.stdin.close()
        zygote_process.wait(timeout=30)
    figures.seconds = time.monotonic() - started
    return figures


def _quiesce(db: str) -> None:
    """Wait until no statement of the killed worker still runs on PostgreSQL: a statement it
    sent whole before dying runs on (and may commit) after the kill."""
    if not _postgres(db):
        return
    deadline = time.monotonic() + 30
    while _rows(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state <> 'idle' AND pid <> pg_backend_pid()")[0][0]:
        if time.monotonic() > deadline:
            raise RuntimeError("the killed worker's statements did not end within 30 s")
        time.sleep(0.01)


async def _after_kill(number: int, db: str, side: Path, log: Path, figures: Figures) -> None:
    figures.kills += 1
    _quiesce(db)
    checked, failures = check_database(db, log)
    figures.committed_checked = checked  # every logged commit, checked again each round
    figures.failures += [f"round {number}: {f}" for f in failures]
    unfinished = {parse_query(q)[0] for (q,) in _rows(db, "SELECT query FROM task_workspaces")}
    figures.kills_mid_task += bool(unfinished)
    recorded_before = {
        key for key in _tool_results(db) if key.rsplit(":", 1)[0] in unfinished
    }
    lines_before = _side(side)
    await resume_all(db, side, figures)
    lines_after = _side(side)
    for key in recorded_before:
        if lines_after[key] != lines_before[key]:
            figures.failures.append(f"round {number}: {key} had a stored result but ran again")
        else:
            figures.recorded_not_rerun += 1
    # Ran before the kill, result not yet stored: run again on resume (at least once).
    figures.rerun_unrecorded += sum(
        1 for key, n in lines_after.items()
        if key not in recorded_before and lines_before[key] >= 1 and n > lines_before[key]
    )
    check_jobs(db, side, figures)
    _, failures = check_database(db, log)
    figures.failures += [f"round {number} after resume: {f}" for f in failures]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "zygote":
        zygote()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-delay", type=float, default=0.3)
    parser.add_argument("--dir", type=Path, default=Path("crash-run"))
    parser.add_argument("--db", help="an empty PostgreSQL database's URL (default: SQLite)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="jobs each worker runs at once, 1 to 3 (concurrent saves)")
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal",
                        help="the SQLite workers' durability (full: flushes, shared by "
                             "concurrent saves)")
    parser.add_argument("--checkpoint-bytes", type=int,
                        help="the SQLite workers checkpoint once their log holds this much "
                             "(small: kills land in checkpoints)")
    options = parser.parse_args(args)

    def progress(number: int, figures: Figures) -> None:
        if (number + 1) % 50 == 0:
            print(f"… {number + 1} kills, {len(figures.failures)} failures", flush=True)

    figures = asyncio.run(run_rounds(options.dir, options.kills, options.seed,
                                     options.max_delay, progress, options.db,
                                     options.parallel, options.synchronous,
                                     options.checkpoint_bytes))
    print(figures.summary())
    for failure in figures.failures[:20]:
        print("FAIL", failure)
    return 1 if figures.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
