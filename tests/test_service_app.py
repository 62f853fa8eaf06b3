"""The service's app in this process (no server process): CORS when configured, and bodies
sent in chunks are held to the size limit as well."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")

from cogency import Agent  # noqa: E402
from cogency.server import Settings, create_app  # noqa: E402
from cogency.server.keys import create_key  # noqa: E402
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
    import asyncio

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
