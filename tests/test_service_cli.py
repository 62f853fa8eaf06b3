"""`cogency keys` and `cogency serve` as commands: keys shown once, clear start-up errors, and a
SIGTERM that finishes or saves the runs in flight."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from serverutil import LLM, Server, create_key, env, rows, sse_events, wait_for

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")


def cogency(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "cogency.cli", *args], capture_output=True,
                          text=True, env=env(), timeout=timeout)


def test_keys_create_list_revoke(tmp_path):
    db = str(tmp_path / "keys.db")
    made = cogency("keys", "create", "--user", "alice", "--name", "laptop", "--db", db)
    assert made.returncode == 0, made.stderr
    key = made.stdout.splitlines()[-1]
    assert made.stdout == key + "\n"  # the key alone on the last line (notes go to stderr)
    assert key.startswith("cog_") and "shown only now" in made.stderr
    [(key_id, user, key_hash)] = rows(db, "SELECT key_id, user_id, key_hash FROM api_keys")
    assert user == "alice" and key_id in key
    assert key not in key_hash and key.split("_", 2)[2] not in key_hash
    listed = cogency("keys", "list", "--db", db, "--json")
    entry = json.loads(listed.stdout)
    assert entry["key_id"] == key_id and entry["state"] == "active" and entry["name"] == "laptop"
    assert key.split("_", 2)[2] not in listed.stdout
    revoked = cogency("keys", "revoke", key, "--db", db)  # a whole key works as well as its id
    assert revoked.returncode == 0 and f"revoked key {key_id}" in revoked.stdout
    assert json.loads(cogency("keys", "list", "--db", db, "--json").stdout)["state"] == "revoked"
    missing = cogency("keys", "revoke", "nope", "--db", db)
    assert missing.returncode == 1 and "no API key 'nope'" in missing.stderr


def test_serve_says_what_is_wrong(tmp_path):
    bad_db = cogency("serve", "--db", "mysql://x/y", "--llm", LLM, "--port", "0")
    assert bad_db.returncode == 1 and "unknown database URL" in bad_db.stderr
    assert "Traceback" not in bad_db.stderr
    unknown = cogency("serve", "--db", str(tmp_path / "a.db"), "--llm", "nosuchprovider:x",
                      "--port", "0")
    assert unknown.returncode == 1 and unknown.stderr.startswith("error: ")
    assert "nosuchprovider" in unknown.stderr and "Traceback" not in unknown.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cogency("serve", "--db", str(tmp_path / "a.db"), "--llm", LLM,
                       "--port", str(port))
    assert busy.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in busy.stderr and "--port" in busy.stderr


def _start_gated_run(server, key, gate):
    """A streaming run held at `gate`, in a thread; returns (thread, events seen)."""
    seen = []
    began = threading.Event()

    def follow():
        try:
            with server.client(key) as client:
                with client.stream("POST", "/api/runs", json={
                        "query": f"gate:{gate}", "stream": True}) as response:
                    for event in sse_events(response):
                        seen.append(event)
                        began.set()
        except Exception as exc:  # noqa: BLE001 - the connection may end with the server
            seen.append({"type": "disconnected", "error": str(exc)})
            began.set()

    thread = threading.Thread(target=follow)
    thread.start()
    assert began.wait(20)
    return thread, seen


def test_sigterm_finishes_runs_in_flight(tmp_path):
    db = str(tmp_path / "term.db")
    key = create_key(db, "alice")
    server = Server(db, tmp_path, "--grace", "20")
    gate = tmp_path / f"gate-{uuid.uuid4().hex}"
    thread, seen = _start_gated_run(server, key, gate)
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "waiting up to 20s for 1 runs in flight" in server.log())
    gate.touch()
    assert server.stop() == 0
    thread.join(10)
    assert [e["type"] for e in seen][-2:] == ["response", "end"]
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces") == [(0,)]
    assert rows(db, "SELECT role FROM conversation_messages ORDER BY seq") == [
        ("user",), ("assistant",)]


def test_sigterm_saves_a_run_that_outlasts_the_grace(tmp_path):
    db = str(tmp_path / "term.db")
    key = create_key(db, "alice")
    server = Server(db, tmp_path, "--grace", "1")
    gate = tmp_path / f"gate-{uuid.uuid4().hex}"
    thread, seen = _start_gated_run(server, key, gate)
    assert server.stop() == 0
    thread.join(10)
    [(task_id, query)] = rows(db, "SELECT task_id, query FROM task_workspaces")
    assert query == f"gate:{gate}" and seen[0]["task_id"] == task_id
    # its follower was told, in its last event, that the task was saved and how to resume it
    # (it was cut off at --grace with no such event, and the shutdown then waited --grace
    # again: one budget now, the runs' first)
    last = seen[-1]
    assert last["type"] == "error" and last["fatal"] and last["status"] == 503, seen
    assert f"its task {task_id} was saved: resume it with POST /api/tasks/{task_id}/resume" \
        in last["message"]
    log = server.log()
    assert log.count("waiting up to 1s for 1 runs in flight") == 1
    assert "timeout graceful shutdown exceeded" not in log
    # its conversation is let go (the row stays, its epoch kept for the next hold)
    assert rows(db, "SELECT COUNT(*) FROM conversation_runs WHERE runner IS NOT NULL") == [(0,)]
    # it can be resumed to its end (here by an agent in this process)
    gate.touch()
    import asyncio

    from cogency import Agent
    from server_models import agent as model

    async def resume():
        async with Agent(llm=model(), store=db) as agent:
            return await agent.resume(task_id, user_id="alice")

    done = asyncio.run(resume())
    assert done.stop_reason == "completed" and done.response.startswith("opened:")
    assert rows(db, "SELECT role FROM conversation_messages ORDER BY seq") == [
        ("user",), ("assistant",)]
