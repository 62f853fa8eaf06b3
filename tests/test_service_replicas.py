"""Scale-out: three `cogency serve` replicas on one PostgreSQL database, clients spread over
them; one run per conversation across replicas; a replica SIGKILLed mid-run leaves its task
resumable from another, with no message lost or doubled."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid

import pytest

import pgutil
from serverutil import Server, create_key, sse_events, wait_for

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")


def _admin(sql: str) -> None:
    async def work() -> None:
        admin = await pgutil.admin_connect()
        try:
            await admin.execute(sql)
        finally:
            await admin.close()

    asyncio.run(work())


@pytest.fixture
def pg_url():
    name = f"cogency_test_{uuid.uuid4().hex[:16]}"
    _admin(f'CREATE DATABASE "{name}"')
    yield pgutil.dsn_for(name)
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(client, query, **fields):
    response = client.post("/api/runs", json={"query": query, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def roles(client, conversation):
    answer = client.get(f"/api/conversations/{conversation}/messages")
    assert answer.status_code == 200, answer.text
    return [(m["role"], m["content"]) for m in answer.json()]


def test_three_replicas_on_one_database(tmp_path, pg_url):
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("hi\n")
    alice, bob = create_key(pg_url, "alice"), create_key(pg_url, "bob")
    common = ("--tools", "files", "--root", str(root))
    replicas = [Server(pg_url, tmp_path, *common, name=f"replica{i}") for i in range(2)]
    doomed = Server(pg_url, tmp_path, *common, name="doomed",
                    extra_env={"COGENCY_TEST_HANG_AFTER_TOOL": "1"})
    try:
        one, two, three = (server.client(alice) for server in (*replicas, doomed))
        # a conversation carried across replicas, read from a third
        first = run(one, "hello from one")
        conversation = first["conversation_id"]
        assert run(two, "and from two", conversation_id=conversation)["response"] == \
            "echo: and from two"
        assert roles(three, conversation) == [
            ("user", "hello from one"), ("assistant", "echo: hello from one"),
            ("user", "and from two"), ("assistant", "echo: and from two")]
        for server in (*replicas, doomed):
            with server.client(bob) as intruder:
                assert intruder.get(f"/api/conversations/{conversation}/messages").status_code \
                    == 404

        # clients spread over the replicas at once, each on its own conversation
        answers: list[str] = []

        def client_of(server, n):
            with server.client(alice) as client:
                answers.append(run(client, f"burst {n}")["response"])

        threads = [threading.Thread(target=client_of, args=(server, n))
                   for n, server in enumerate([*replicas, doomed] * 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(answers) == sorted(f"echo: burst {n}" for n in range(6))

        # one run per conversation, whichever replica is asked
        gate = tmp_path / "gate"
        with one.stream("POST", "/api/runs", json={
                "query": f"gate:{gate}", "conversation_id": conversation, "stream": True}) as r:
            events = sse_events(r)
            assert next(events)["type"] == "start"
            busy = two.post("/api/runs", json={"query": "me too", "conversation_id": conversation})
            assert busy.status_code == 409 and busy.json()["error"]["type"] == "conflict"
            gate.touch()
            assert [e["type"] for e in events][-1] == "end"

        # a replica killed mid-run: its task is resumed from another, nothing lost or doubled
        with three.stream("POST", "/api/runs", json={"query": "tool then die",
                                                     "stream": True}) as r:
            seen = []
            for event in sse_events(r):
                seen.append(event)
                if event["type"] == "result":
                    break
            victim_conversation, task_id = seen[0]["conversation_id"], seen[0]["task_id"]
            wait_for(lambda: len(roles(one, victim_conversation)) == 3)  # the tool result saved
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait(10)
        assert task_id in [task["task_id"] for task in one.get("/api/tasks").json()]
        resumed = two.post(f"/api/tasks/{task_id}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["response"] == "listed: tool then die"
        stored = roles(one, victim_conversation)
        assert [role for role, _ in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[0] == ("user", "tool then die")
        assert stored[-1] == ("assistant", "listed: tool then die")
        assert task_id not in [task["task_id"] for task in one.get("/api/tasks").json()]
        # the killed replica's hold died with it: the conversation takes new runs
        assert run(one, "after the crash", conversation_id=victim_conversation)["response"] == \
            "echo: after the crash"
    finally:
        for server in (*replicas, doomed):
            server.stop()
