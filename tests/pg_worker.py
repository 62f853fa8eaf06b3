"""A worker process for the multi-process PostgreSQL tests (run as a script, not collected).

    python tests/pg_worker.py DSN WORKER TASKS [--block N --block-dir DIR]

Runs TASKS agent tasks, a few at a time, each one tool call and an answer with a ScriptedLLM,
on the conversations ``conv-u{k}-{j}`` of users ``u0``/``u1``; after each it bumps the user's
``interaction_count``. Prints one JSON line per finished task. With ``--block N`` it then starts
N more tasks whose tool writes ``DIR/<marker>.started`` and blocks forever (to be SIGKILLed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from cogency import Agent, tool
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

USERS = ("u0", "u1")
CONVERSATIONS_PER_USER = 2
CONCURRENCY = 4


def plan(worker: int, index: int, prefix: str = "") -> tuple[str, str, str]:
    """(marker, user, conversation) of one task."""
    marker = f"{prefix}w{worker}t{index}"
    user = USERS[index % len(USERS)]
    conversation = f"conv-{user}-{(index // len(USERS)) % CONVERSATIONS_PER_USER}"
    return marker, user, conversation


def script(marker: str) -> list[dict]:
    return [
        {"secure": True, "objective": f"note {marker}", "response": None,
         "actions": [{"name": "note", "args": {"marker": marker}}]},
        {"response": f"done {marker}", "actions": []},
    ]


def make_note(block_dir: Path | None):
    @tool(timeout=600)
    async def note(marker: str) -> str:
        """Note a marker."""
        if block_dir is not None and marker.startswith("block"):
            (block_dir / f"{marker}.started").write_text("started")
            await asyncio.Event().wait()  # until the process is killed
        return f"noted {marker}"

    return note


def bump(profile) -> None:
    profile.interaction_count += 1


async def main(args: argparse.Namespace) -> None:
    store = PostgresStore(args.dsn, max_size=CONCURRENCY + 1)
    note = make_note(Path(args.block_dir) if args.block_dir else None)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int, prefix: str = "") -> None:
        marker, user, conversation = plan(args.worker, index, prefix)
        async with gate:
            agent = Agent(llm=ScriptedLLM(script(marker)), tools=[note], store=store)
            result = await agent.run(f"task {marker}", user_id=user, conversation_id=conversation)
            if result.stop_reason != "completed":
                raise SystemExit(f"task {marker} stopped with {result.stop_reason}: {result}")
            await store.update_profile(user, bump)
        print(json.dumps({"marker": marker, "task_id": result.task_id, "user": user,
                          "conversation": conversation}), flush=True)

    try:
        await asyncio.gather(*(one(i) for i in range(args.tasks)))
        if args.block:
            await asyncio.gather(*(one(i, "block") for i in range(args.block)))
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("worker", type=int)
    parser.add_argument("tasks", type=int)
    parser.add_argument("--block", type=int, default=0)
    parser.add_argument("--block-dir")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
