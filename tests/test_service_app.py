"""The service's app in this process (no server process): CORS when configured, bodies
sent in chunks held to the size limit as well, the per-key limit, the reads a resent chat
history costs (counted by a store), and a KeyboardInterrupt during a run."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")

from cogency import Agent  # noqa: E402
from cogency.server import Settings, create_app  # noqa: E402
from cogency.server.keys import create_key  # noqa: E402
from cogency.storage import SQLiteStore  # noqa: E402
from server_models import agent as model  # noqa: E402


@pytest.fixture
async def app_client(store):
    key = (await create_key(store, "alice"))[1]

    async def make(settings: Settings) -> httpx.AsyncClient:
        app = create_app(Agent(llm=model(), store=store), settings)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app",
                                 headers={"Authorization": f"Bearer {key}"})

    return make


async def test_cors_only_for_the_configured_origin(app_client):
    async with await app_client(Settings(cors_origins=("https://app.example",))) as client:
        allowed = await client.options("/api/runs", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        other = await client.options("/api/runs", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers


async def test_a_chunked_body_over_the_limit_is_refused(app_client, db):
    async def chunks():
        yield b'{"query": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    async with await app_client(Settings(max_body=5000)) as client:
        answer = await client.post("/api/runs", content=chunks(),
                                   headers={"content-type": "application/json"})
        assert answer.status_code == 413
        assert answer.json()["error"]["type"] == "too_large"
        small = await client.post("/api/runs", json={"query": "small"})
        assert small.json()["response"] == "echo: small"
    assert db.execute("SELECT content FROM conversation_messages ORDER BY seq").fetchall() == [
        ("small",), ("echo: small",)]


async def test_concurrent_resumes_never_pass_the_per_key_limit(store):
    from cogency.server.errors import TooManyRuns
    from cogency.server.runs import Runs
    from cogency.testing import ScriptedLLM

    # No answer in one iteration: each task stays unfinished, to be resumed.
    agent = Agent(llm=ScriptedLLM([{"understanding": "not yet"}] * 5), store=store,
                  max_iterations=1)
    tasks = [(await agent.run(f"task {n}", user_id="alice")).task_id for n in range(5)]
    held = asyncio.Event()

    async def slow(messages):
        await held.wait()  # every resumed run stays in flight
        return {"response": "done"}

    agent.llm = ScriptedLLM([slow] * 1000)
    runs = Runs(agent, max_per_key=2)
    outcomes = await asyncio.gather(
        *(runs.start("alice", "key", task_id=task) for task in tasks), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, TooManyRuns)]
    assert len(refused) == 3 and len(runs) == 2, outcomes  # was 5 in flight: the check raced
    held.set()
    await runs.shutdown(10)
    await agent.close()
    finished = await store.list_tasks("alice")
    assert len(finished) == 3  # the two that ran completed; the three refused are untouched


class CountingStore(SQLiteStore):
    """A store that notes each read a resent chat history could be matched with."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.reads: list[tuple[str, str, int]] = []  # (method, conversation or user, rows)

    async def list_conversations(self, user_id, *, limit=None):
        found = await super().list_conversations(user_id, limit=limit)
        self.reads.append(("list_conversations", user_id, len(found)))
        return found

    async def load_messages(self, conversation_id, user_id, **window):
        found = await super().load_messages(conversation_id, user_id, **window)
        self.reads.append(("load_messages", conversation_id, len(found)))
        return found

    async def find_conversation_by_turns(self, user_id, digest):
        found = await super().find_conversation_by_turns(user_id, digest)
        self.reads.append(("find_conversation_by_turns", user_id, int(found is not None)))
        return found


@pytest.fixture
async def counting(db_path):
    counted = CountingStore(db_path)
    key = (await create_key(counted, "alice"))[1]
    agent = Agent(llm=model(), store=counted)
    app = create_app(agent, Settings(max_runs_per_key=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app",
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, counted, agent
    await agent.close()
    await counted.close()


def chat(*texts: str) -> dict:
    return {"model": "cogency", "messages": [
        {"role": "user" if n % 2 == 0 else "assistant", "content": text}
        for n, text in enumerate(texts)]}


async def test_a_key_at_its_limit_is_refused_before_its_resent_history_is_read(
        counting, tmp_path):
    client, store, _ = counting
    first = await client.post("/v1/chat/completions", json=chat("hello"))
    conversation = first.json()["conversation_id"]
    gate = tmp_path / "gate"
    held = asyncio.create_task(client.post("/api/runs", json={"query": f"gate:{gate} hold"}))
    while (await client.get("/health")).json()["runs"] < 1:
        await asyncio.sleep(0.02)

    store.reads.clear()
    busy = await client.post("/v1/chat/completions", json=chat("hello", "echo: hello", "again"))
    assert busy.status_code == 429
    assert busy.json()["error"]["code"] == "too_many_runs"
    assert store.reads == []  # refused first: no conversation listed, no message read

    gate.touch()
    assert (await held).json()["response"] == f"opened: gate:{gate} hold"
    again = await client.post("/v1/chat/completions", json=chat("hello", "echo: hello", "again"))
    assert again.json()["conversation_id"] == conversation  # matched, now the slot is free
    assert again.json()["choices"][0]["message"]["content"] == "echo: again"
    assert store.reads[0] == ("find_conversation_by_turns", "alice", 1)  # what the 429 skipped


async def test_a_resent_history_is_matched_by_one_lookup_reading_no_message(counting, db):
    client, store, agent = counting
    # A long conversation: its turns are matched by their digest, without reading a message
    # (the match used to read each candidate conversation whole, up to 2,000 messages).
    turns = [("user", f"question {n}") if n % 2 == 0 else ("assistant", f"answer {n}")
             for n in range(490)]
    async for _ in agent.stream("hi", "alice", history=turns):
        pass
    (long,) = [row[0] for row in db.execute("SELECT conversation_id FROM conversations")]
    resent = [text for _, text in turns] + ["hi", "echo: hi", "more"]
    store.reads.clear()
    answer = await client.post("/v1/chat/completions", json=chat(*resent))
    assert answer.json()["choices"][0]["message"]["content"] == "echo: more"
    assert answer.json()["conversation_id"] == long
    assert store.reads == [("find_conversation_by_turns", "alice", 1)]  # no message read
    # one turn changed: no conversation matches, a new one starts with the resent turns
    store.reads.clear()
    edited = await client.post("/v1/chat/completions", json=chat("edited", *resent[1:]))
    fresh = edited.json()["conversation_id"]
    assert fresh != long and store.reads == [("find_conversation_by_turns", "alice", 0)]
    assert db.execute("SELECT COUNT(*) FROM conversation_messages WHERE conversation_id = ?",
                      (fresh,)).fetchone() == (len(resent) + 1,)


# Run in a process of its own: CPython 3.11 miscounts its recursion depth after a
# KeyboardInterrupt leaves an asyncio task, which breaks pytest's own parsing later on.
_INTERRUPTED = """
import asyncio, json, sys
from cogency import Agent
from cogency.server.runs import Runs
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM

loop = asyncio.new_event_loop()
store = SQLiteStore(sys.argv[1])
agent = Agent(llm=ScriptedLLM([KeyboardInterrupt()]), store=store)
runs = Runs(agent, max_per_key=1)

async def follow():
    run = await runs.start("alice", "key", query="hello")
    return [event async for event in run.follow() if event is not None], run

followed = loop.create_task(follow())
interrupts = 0
while not followed.done():
    try:
        loop.run_until_complete(followed)
    except KeyboardInterrupt:  # the loop stops for it; go on to see what became of the run
        interrupts += 1
# What the interrupted loop left queued (a run ending in the step a KeyboardInterrupt cut
# short leaves run_until_complete's stop behind): run it now, not in the next call.
loop.call_soon(loop.stop)
loop.run_forever()
events, run = followed.result()
in_flight = len(runs)
task = loop.run_until_complete(store.list_tasks("alice"))[0].task_id
agent.llm = ScriptedLLM([{"response": "resumed"}])
resumed = loop.run_until_complete(runs.start("alice", "key", task_id=task))  # slot, hold free
loop.run_until_complete(resumed.task)
loop.run_until_complete(agent.close())
loop.run_until_complete(store.close())
print(json.dumps({"interrupts": interrupts, "events": events, "in_flight": in_flight,
                  "resumed": resumed.summary()["response"],
                  "conversation": run.conversation_id}))
"""


def test_a_keyboard_interrupt_in_a_run_goes_on_up_and_its_task_is_saved(db_path, db):
    """Ctrl-C (or SystemExit) during a run stops the process, as it does in `Agent`: the run
    does not swallow it as its own error. Its followers are told the task was saved, and it
    was: resumable, its conversation and the key's slot let go."""
    import json
    import subprocess
    import sys

    from serverutil import env

    done = subprocess.run([sys.executable, "-c", _INTERRUPTED, str(db_path)], env=env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["interrupts"] == 2  # the agent's, then the run's (was 1: the run swallowed it)
    assert [event["type"] for event in seen["events"]] == ["start", "error"]
    fatal = seen["events"][-1]
    assert fatal["fatal"] and fatal["status"] == 503  # was 500, "internal server error"
    task = seen["events"][0]["task_id"]
    assert f"its task {task} was saved: resume it with POST /api/tasks/{task}/resume" in \
        fatal["message"]
    assert seen["in_flight"] == 0 and seen["resumed"] == "resumed"
    assert db.execute("SELECT role, content FROM conversation_messages WHERE conversation_id "
                      "= ? ORDER BY seq", (seen["conversation"],)).fetchall() == [
        ("user", "hello"), ("assistant", "resumed")]
