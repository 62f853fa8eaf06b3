"""A process whose disk flushes a test counts under strace (run as a script, not collected).

    python tests/fsync_worker.py PATH MODE TURNS

Opens ``SQLiteStore(PATH, synchronous="full")`` and runs one warm-up turn, then TURNS more on
the same conversation, each between two markers strace sees (``access`` of
``/cogency-turn-N-start`` and ``-end``, paths that do not exist). MODE is what a turn is:
``run`` (a one-step ``Agent.run``), ``tool`` (one tool step, then the answer), ``served`` (``POST /api/runs`` through the service's app,
in this process), ``served-key`` (the same with an ``Idempotency-Key``) or ``concurrent``
(five one-step runs at once, on five conversations, whose completions reach the store's
worker together: it is held, by its private ``_hand``, until all five wait for it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import threading
import uuid
from typing import Any

from cogency import Agent, tool
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def mark(turn: int, edge: str) -> None:
    os.access(f"/cogency-turn-{turn}-{edge}", os.F_OK)


async def main(path: str, mode: str, turns: int) -> None:
    store = SQLiteStore(path, synchronous="full")
    replies: Any = itertools.repeat({"response": "ok"})
    if mode == "tool":
        replies = itertools.cycle([{"actions": [{"name": "echo", "args": {"text": "hi"}}]},
                                   {"response": "ok"}])
    agent = Agent(ScriptedLLM(replies), tools=[echo], store=store)
    if mode == "concurrent":
        await concurrent(store, turns)
    elif mode in ("run", "tool"):
        conversation = (await agent.run("hello", "alice")).conversation_id
        for turn in range(turns):
            mark(turn, "start")
            await agent.run("hello again", "alice", conversation)
            mark(turn, "end")
    else:
        import httpx

        from cogency.server import create_app
        from cogency.server.keys import create_key

        key = (await create_key(store, "alice"))[1]
        app = create_app(agent)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://app",
                                     headers={"Authorization": f"Bearer {key}"}) as client:

            async def ask(body: dict[str, Any]) -> str:
                headers = ({"Idempotency-Key": uuid.uuid4().hex} if mode == "served-key"
                           else {})
                answer = await client.post("/api/runs", json=body, headers=headers)
                answer.raise_for_status()
                return str(answer.json()["conversation_id"])

            conversation = await ask({"query": "hello"})
            for turn in range(turns):
                mark(turn, "start")
                await ask({"query": "hello again", "conversation_id": conversation})
                mark(turn, "end")
    await agent.close()
    await store.close()


async def concurrent(store: SQLiteStore, turns: int, runs: int = 5) -> None:
    gate = asyncio.Event()
    arrived: list[int] = []

    async def answer(messages: list[dict[str, str]]) -> dict[str, str]:
        arrived.append(1)
        await gate.wait()
        return {"response": "ok"}

    agent = Agent(ScriptedLLM(itertools.repeat(answer)), store=store)
    gate.set()  # the first turns, one at a time
    conversations = [(await agent.run("hello", f"user{n}")).conversation_id
                     for n in range(runs)]
    for turn in range(turns):
        gate.clear()
        arrived.clear()
        mark(turn, "start")
        started = [asyncio.create_task(agent.run("again", f"user{n}", conversation))
                   for n, conversation in enumerate(conversations)]
        while len(arrived) < runs:  # every task begun, every model call waiting
            await asyncio.sleep(0.001)
        free = threading.Event()
        store._hand(lambda db: free.wait(30))
        gate.set()
        while store._handed - store._finished < runs + 1:  # the hold, and each completion
            await asyncio.sleep(0.001)
        free.set()
        for run in await asyncio.gather(*started):
            assert run.response == "ok", run
        mark(turn, "end")
    await agent.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
