"""``python -m bench.instructions``: the instructions a durable turn executes, counted by
valgrind, a figure that does not move with the machine's speed (for an A/B of two checkouts).

Wall and CPU times on a shared virtual machine drift by up to 25% from one run to the next,
more than most single changes to a turn save. Instructions do not drift: this runs
``python -m bench``'s durable case (Cogency's adapter: 25-turn conversations on fresh files)
under valgrind's callgrind, once with ``--warmup`` conversations and once with
``--conversations`` more, and reports the difference per turn: start-up, imports and the first
conversations (where the exact encoding loads) cancel out. With ``--against SRC`` (another
checkout's ``src``), the same there, and the change. Hash seeds are fixed
(``PYTHONHASHSEED=0``): three runs of the default set-up gave 2.121 to 2.123 M per turn, and
its test holds a checkout measured against itself to within 1%. Callgrind counts from where
the measured part begins: the interpreter's start and the imports run uncounted, several
times faster.

``--case served`` counts a ``POST /api/runs`` instead, answered by ``cogency serve``'s app in
the same process (its middleware, the key's check, the conversation's hold, the agent, the
JSON answer; no socket and no HTTP client), each conversation ``--turns`` requests long.
``--case http`` counts the same request sent over loopback HTTP to a ``cogency serve`` process
(the measured one; the client is outside valgrind): uvicorn, the socket's Python side and the
access log too. The three cases side by side say where a served request's work goes.

Instructions are not time: a system call (a disk flush, a thread's wake-up) counts for a few,
and so the figure leaves out the kernel's part of a turn. It says whether the user-space work
of a turn grew or shrank, not by how much the turn's time did.

    python -m bench.instructions --synchronous normal
    python -m bench.instructions --case served
    python -m bench.instructions --case http
    python -m bench.instructions --against /tmp/base/src      # A/B: a checkout made with
                                                              # git worktree add /tmp/base main
Needs valgrind (``apt-get install valgrind``); about 26 s per checkout on two cores
(``--case http`` 38 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _count_from_here() -> None:
    """In the measured process: callgrind counts from now on. It started with its counting
    off (``--instr-atstart=no``): the interpreter's start and the imports, the same in both
    processes, run several times faster uncounted."""
    subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True,
                   capture_output=True, timeout=600)


def _conversations(count: int, turns: int, synchronous: str) -> None:
    """In the measured process: ``count`` durable conversations of ``turns`` turns each."""
    from bench.peers import _harness
    from bench.peers import cogency as adapter

    async def run() -> None:
        for _ in range(count):
            with tempfile.TemporaryDirectory(prefix="bench-") as directory:
                await _harness._conversation(adapter, turns, Path(directory),  # type: ignore[arg-type]
                                             lambda _turn, _seconds: None, synchronous)

    _harness.quiet()
    _count_from_here()
    asyncio.run(run())


def _served(count: int, turns: int, synchronous: str) -> None:
    """In the measured process: ``count`` conversations of ``turns`` runs each, every run a
    ``POST /api/runs`` answered by ``cogency serve``'s app in this process (its middleware,
    the key's check, the conversation's hold, the agent and the JSON answer; no socket)."""
    import json

    from bench.bench_service import model_instant
    from cogency import Agent
    from cogency.server import create_app
    from cogency.server.keys import create_key
    from cogency.storage import open_store

    async def post(app: Any, key: str, conversation: str | None) -> str:
        body = json.dumps({"query": "hello", "conversation_id": conversation}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/api/runs",
                 "raw_path": b"/api/runs", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {key}".encode()),
                             (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
        messages: list[dict[str, Any]] = []
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client never goes away
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)

        await app(scope, receive, send)
        if messages[0]["status"] != 200:
            raise SystemExit(f"POST /api/runs answered {messages[0]['status']}: {messages[1:]}")
        return str(json.loads(messages[1]["body"])["conversation_id"])

    async def run() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-") as directory:
            store = open_store(f"sqlite:///{directory}/served.db?synchronous={synchronous}")
            _, key = await create_key(store, "bench-user")
            async with Agent(llm=model_instant(), store=store) as agent:
                app = create_app(agent)
                async with app.router.lifespan_context(app):
                    for _ in range(count):
                        conversation = None
                        for _ in range(turns):
                            conversation = await post(app, key, conversation)
            await store.close()

    _count_from_here()
    asyncio.run(run())


def _serving(synchronous: str) -> None:
    """In the measured process: ``cogency serve`` on a fresh SQLite file with the instant
    model (bench.bench_service's), after printing a key of its user for the driver."""
    from bench.bench_service import _keys
    from cogency.cli import main
    from cogency.server import create_app  # noqa: F401 - imported before the counting

    _count_from_here()
    with tempfile.TemporaryDirectory(prefix="bench-") as directory:
        db = f"sqlite:///{directory}/http.db?synchronous={synchronous}"
        [key] = asyncio.run(_keys(db, 1))
        print(f"key {key}", flush=True)
        os.environ["COGENCY_BENCH_DELAY"] = "0"
        raise SystemExit(main(["serve", "--db", db, "--port", "0", "--no-memory",
                               "--llm", "bench.bench_service:model",
                               "--max-runs-per-key", "1000"]))


def _drive(server: subprocess.Popen[str], count: int, turns: int) -> None:
    """Outside valgrind: ``count`` conversations of ``turns`` runs each, sent to ``server``
    (a ``_serving`` process) one after another over HTTP; then it is stopped (SIGTERM)."""
    import httpx

    assert server.stdout is not None
    said = server.stdout.readline()
    line = server.stdout.readline() if said.startswith("key ") else said
    found = re.search(r"listening on (http://\S+)", line)
    if found is None:
        server.kill()
        raise SystemExit(f"the measured server did not start: {line!r}")
    key = said.split()[-1]
    with httpx.Client(base_url=found.group(1), timeout=600,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        for _ in range(count):
            conversation = None
            for _ in range(turns):
                answer = client.post("/api/runs", json={"query": "hello",
                                                        "conversation_id": conversation})
                if answer.status_code != 200:
                    server.kill()
                    raise SystemExit(f"POST /api/runs answered {answer.status_code}: "
                                     f"{answer.text[:500]}")
                conversation = answer.json()["conversation_id"]
    server.terminate()


def _instructions(src: Path, count: int, turns: int, synchronous: str,
                  case: str = "turn") -> int:
    """Instructions (callgrind's ``Ir``) of a process running ``count`` conversations with
    the package at ``src`` (``http``: the server that answers them)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONMALLOC": "malloc",
           "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]), "COGENCY_BENCH_SRC": str(src)}
    with tempfile.TemporaryDirectory() as scratch:
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={scratch}/out",
                   sys.executable, "-m", "bench.instructions", "--child", str(count), "--turns",
                   str(turns), "--synchronous", synchronous, "--case", case]
        with open(f"{scratch}/stderr", "w+") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                       text=True, env=env, cwd=ROOT)
            try:
                if case == "http":
                    _drive(process, count, turns)
                else:
                    assert process.stdout is not None
                    process.stdout.read()
                returncode = process.wait(3600)
            finally:
                if process.poll() is None:
                    process.kill()
            stderr.seek(0)
            err = stderr.read()
    found = re.search(r"Collected : (\d+)", err)
    if returncode != 0 or found is None:
        raise SystemExit(f"the measured process failed ({returncode}):\n{err[-2000:]}")
    return int(found.group(1))


def per_turn(src: Path, warmup: int, conversations: int, turns: int, synchronous: str,
             pool: ThreadPoolExecutor, case: str = "turn") -> float:
    """Instructions per turn (or served request) of the checkout whose package is at
    ``src``."""
    low = pool.submit(_instructions, src, warmup, turns, synchronous, case)
    high = pool.submit(_instructions, src, warmup + conversations, turns, synchronous, case)
    return (high.result() - low.result()) / (conversations * turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--synchronous", choices=("normal", "full"), default="normal")
    parser.add_argument("--turns", type=int, default=25, help="turns of each conversation")
    parser.add_argument("--warmup", type=int, default=2,
                        help="conversations run in both processes (they cancel out)")
    parser.add_argument("--conversations", type=int, default=4,
                        help="conversations counted: the difference between the processes")
    parser.add_argument("--against", type=Path, metavar="SRC",
                        help="another checkout's src directory: measured too, and compared")
    parser.add_argument("--case", choices=("turn", "served", "http"), default="turn",
                        help="turn: Agent.run's durable turn; served: a POST /api/runs "
                             "answered by `cogency serve`'s app in process (no socket); "
                             "http: the same over loopback HTTP to a `cogency serve` process")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        import cogency

        given = Path(os.environ["COGENCY_BENCH_SRC"]).resolve()
        if Path(cogency.__file__).resolve().parents[1] != given:  # an install took precedence
            raise SystemExit(f"measured {cogency.__file__}, not the package in {given}")
        if args.case == "http":
            _serving(args.synchronous)
        (_served if args.case == "served" else _conversations)(
            args.child, args.turns, args.synchronous)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if args.against is not None and not (args.against / "cogency" / "__init__.py").is_file():
        raise SystemExit(f"{args.against} holds no cogency package: pass a checkout's src")
    what = {"turn": "durable turn", "served": "served POST /api/runs",
            "http": "POST /api/runs over HTTP (the server's)"}[args.case]
    with ThreadPoolExecutor(2) as pool:
        mine = per_turn(SRC, args.warmup, args.conversations, args.turns, args.synchronous,
                        pool, args.case)
        print(f"instructions per {what} (valgrind; synchronous={args.synchronous}, "
              f"{args.turns}-turn conversations):")
        print(f"  {mine / 1e6:7.3f} M  this checkout ({SRC})")
        if args.against is not None:
            theirs = per_turn(args.against, args.warmup, args.conversations, args.turns,
                              args.synchronous, pool, args.case)
            print(f"  {theirs / 1e6:7.3f} M  {args.against}")
            print(f"  this checkout ÷ that one: {mine / theirs:.3f} "
                  f"({(mine / theirs - 1) * 100:+.1f}%)")

if __name__ == "__main__":
    main()
