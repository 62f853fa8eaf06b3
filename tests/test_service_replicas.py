"""Scale-out: three `cogency serve` replicas on one PostgreSQL database (directly, and through
PgBouncer in transaction mode), clients spread over them; one run per conversation across
replicas; approvals decided on another replica; a run whose task is released by force stops
writing and frees its conversation at once; a replica SIGKILLed mid-run leaves its task
resumable from another, with no message lost or doubled. The replicas connect as an
ordinary role, so row-level security holds."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
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


@pytest.fixture(params=["direct", "pgbouncer"])
def pg_url(request):
    name = f"cogency_test_{uuid.uuid4().hex[:16]}"

    async def make() -> None:
        admin = await pgutil.admin_connect()
        try:
            await pgutil.ensure_app_role(admin)
            await admin.execute(f'CREATE DATABASE "{name}" OWNER {pgutil.APP_ROLE}')
        finally:
            await admin.close()

    asyncio.run(make())
    port = pgutil.pgbouncer("transaction").port if request.param == "pgbouncer" else None
    yield pgutil.dsn_for(name, user=pgutil.APP_ROLE, port=port)
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

        # a call waiting for approval, decided on another replica, runs there once
        paused = run(one, "write approved.txt")
        assert paused["stop_reason"] == "awaiting_approval"
        [call] = paused["pending_approvals"]
        assert [c["id"] for c in three.get(f"/api/tasks/{paused['task_id']}/approvals").json()] \
            == [call["id"]]
        decided = two.post(f"/api/tasks/{paused['task_id']}/approvals",
                           json={"decisions": {call["id"]: True}})
        assert decided.status_code == 200, decided.text
        assert decided.json()["stop_reason"] == "completed"
        assert decided.json()["response"].startswith("the tool said:")
        assert two.post(f"/api/tasks/{paused['task_id']}/approvals",
                        json={"decisions": {call["id"]: True}}).status_code == 404

        # a run whose task is released by force (its runner taken for dead) writes nothing
        # more, and its conversation takes a new run at once on any replica
        held = tmp_path / "held"
        with one.stream("POST", "/api/runs", json={
                "query": f"gate:{held}", "conversation_id": conversation, "stream": True}) as r:
            events = sse_events(r)
            started = next(events)
            assert started["type"] == "start"
            assert two.post("/api/runs", json={"query": "busy?", "conversation_id":
                                               conversation}).status_code == 409
            released = subprocess.run(
                [sys.executable, "-m", "cogency.cli", "tasks", "release", started["task_id"],
                 "--user", "alice", "--db", pg_url],
                capture_output=True, text=True, timeout=60)
            assert released.returncode == 0, released.stderr
            assert run(two, "after the release", conversation_id=conversation)["response"] \
                == "echo: after the release"
            held.touch()
            last = list(events)[-1]
        assert last["type"] == "error" and "no longer holds" in last["message"], last
        stored = roles(three, conversation)
        assert stored[-3:] == [("user", f"gate:{held}"), ("user", "after the release"),
                               ("assistant", "echo: after the release")]

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


def test_a_dead_servers_conversation_on_a_renamed_host_is_freed_by_force_release(tmp_path):
    """A server on one SQLite file dies mid-run in a container that comes back under another
    host name: its runs cannot be judged dead from here, so the conversation stays held until
    its lease lapses, or at once by `cogency tasks release` of its task."""
    db = str(tmp_path / "agents.db")
    alice = create_key(db, "alice")
    gone = Server(db, tmp_path, name="gone",
                  extra_env={"COGENCY_TEST_HOSTNAME": "a-host-that-is-gone"})
    try:
        with gone.client(alice) as client, client.stream(
                "POST", "/api/runs",
                json={"query": f"gate:{tmp_path / 'never'}", "stream": True}) as r:
            started = next(sse_events(r))
            gone.proc.send_signal(signal.SIGKILL)
            gone.proc.wait(10)
    finally:
        gone.stop()
    live = Server(db, tmp_path, name="live")
    try:
        with live.client(alice) as client:
            conversation = started["conversation_id"]
            busy = client.post("/api/runs", json={"query": "hello",
                                                  "conversation_id": conversation})
            assert busy.status_code == 409, busy.text
            released = subprocess.run(
                [sys.executable, "-m", "cogency.cli", "tasks", "release", started["task_id"],
                 "--user", "alice", "--db", db],
                capture_output=True, text=True, timeout=60)
            assert released.returncode == 0, released.stderr
            assert run(client, "hello", conversation_id=conversation)["response"] == \
                "echo: hello"
    finally:
        live.stop()
