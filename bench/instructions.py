"""``python -m bench.instructions``: the instructions a durable turn executes, counted by
valgrind, a figure that does not move with the machine's speed (for an A/B of two checkouts).

Wall and CPU times on a shared virtual machine drift by up to 25% from one run to the next,
more than most single changes to a turn save. Instructions do not drift: this runs
``python -m bench``'s durable case (Cogency's adapter: 25-turn conversations on fresh files)
under valgrind's callgrind, once with ``--warmup`` conversations and once with
``--conversations`` more, and reports the difference per turn: start-up, imports and the first
conversations (where the exact encoding loads) cancel out. With ``--against SRC`` (another
checkout's ``src``), the same there, and the change. Hash seeds are fixed
(``PYTHONHASHSEED=0``); the counts repeat to within 0.1%.

Instructions are not time: a system call (a disk flush, a thread's wake-up) counts for a few,
and so the figure leaves out the kernel's part of a turn. It says whether the user-space work
of a turn grew or shrank, not by how much the turn's time did.

    python -m bench.instructions --synchronous normal
    python -m bench.instructions --against /tmp/base/src      # A/B: a checkout made with
                                                              # git worktree add /tmp/base main
Needs valgrind (``apt-get install valgrind``); about 25 s per checkout on two cores.
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

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


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
    asyncio.run(run())


def _instructions(src: Path, count: int, turns: int, synchronous: str) -> int:
    """Instructions (callgrind's ``Ir``) of a process running ``count`` conversations with
    the package at ``src``."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONMALLOC": "malloc",
           "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch}/out",
             sys.executable, "-m", "bench.instructions", "--child", str(count), "--turns",
             str(turns), "--synchronous", synchronous],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the measured process failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_turn(src: Path, warmup: int, conversations: int, turns: int, synchronous: str,
             pool: ThreadPoolExecutor) -> float:
    """Instructions per turn of the checkout whose package is at ``src``."""
    low = pool.submit(_instructions, src, warmup, turns, synchronous)
    high = pool.submit(_instructions, src, warmup + conversations, turns, synchronous)
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
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _conversations(args.child, args.turns, args.synchronous)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    if args.against is not None and not (args.against / "cogency" / "__init__.py").is_file():
        raise SystemExit(f"{args.against} holds no cogency package: pass a checkout's src")
    with ThreadPoolExecutor(2) as pool:
        mine = per_turn(SRC, args.warmup, args.conversations, args.turns, args.synchronous, pool)
        print(f"instructions per durable turn (valgrind; synchronous={args.synchronous}, "
              f"{args.turns}-turn conversations):")
        print(f"  {mine / 1e6:7.3f} M  this checkout ({SRC})")
        if args.against is not None:
            theirs = per_turn(args.against, args.warmup, args.conversations, args.turns,
                              args.synchronous, pool)
            print(f"  {theirs / 1e6:7.3f} M  {args.against}")
            print(f"  this checkout ÷ that one: {mine / theirs:.3f} "
                  f"({(mine / theirs - 1) * 100:+.1f}%)")

if __name__ == "__main__":
    main()
