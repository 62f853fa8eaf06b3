"""`cogency serve` on SQLite, through a real server process and an HTTP client (SSE too)."""

from __future__ import annotations

import threading
import uuid

import pytest

from cogency.tools.rooms import user_directory
from serverutil import Server, create_key, rows, sse_events, wait_for

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")

SECRET_QUERY = "the-secret-query-7c1f"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    (tmp / "root").mkdir()
    alice = user_directory(tmp / "root", "alice")  # each user's tools work in their own
    alice.mkdir()
    (alice / "notes.txt").write_text("hello\n")
    db = str(tmp / "service.db")
    keys = {user: create_key(db, user) for user in ("alice", "bob")}
    server = Server(db, tmp, "--tools", "files", "--root", str(tmp / "root"),
                    "--max-runs-per-key", "2",
                    "--max-body", "20000", "--max-query", "1000")
    yield server, keys, db, tmp
    server.stop()


def run(client, query, **fields):
    response = client.post("/api/runs", json={"query": query, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_run_answers_and_is_stored_for_its_keys_user(service):
    server, keys, db, _ = service
    with server.client(keys["alice"]) as alice:
        result = run(alice, "hello there")
    assert result["response"] == "echo: hello there"
    assert result["stop_reason"] == "completed" and result["iterations"] == 1
    stored = rows(db, "SELECT c.user_id, m.role, m.content FROM conversation_messages m "
                      "JOIN conversations c USING (conversation_id) WHERE conversation_id = ? "
                      "ORDER BY m.seq", result["conversation_id"])
    assert stored == [("alice", "user", "hello there"), ("alice", "assistant", "echo: hello there")]


def test_the_service_learns_each_users_profile_by_default(service):
    server, _, db, _ = service
    key = create_key(db, "dana")

    def style(client):
        profile = client.get("/api/profile").json()["profile"] or {}
        return profile.get("communication_style")

    with server.client(key) as dana:
        assert not style(dana)
        run(dana, "hello from dana")
        wait_for(lambda: style(dana) == "brief answers")  # learned in the background
    (stored,) = rows(db, "SELECT profile_data FROM user_profiles WHERE user_id = 'dana'")
    assert "brief answers" in stored[0]


def test_sse_carries_the_events_of_agent_stream(service):
    server, keys, _, tmp = service
    with server.client(keys["alice"]) as alice:
        with alice.stream("POST", "/api/runs", json={"query": "tool please", "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = list(sse_events(r))
    types = [event["type"] for event in events]
    assert types == ["start", "reason", "action", "result", "reason", "response", "end"]
    assert events[2]["name"] == "file_list" and events[3]["ok"] is True
    assert "notes.txt" in events[3]["output"]
    assert events[5]["text"] == "listed: tool please"
    assert events[-1]["stop_reason"] == "completed"
    assert len({event["task_id"] for event in events}) == 1

    # The same run through Agent.stream directly yields the same events (ids aside).
    import asyncio

    from cogency import Agent
    from server_models import agent as model

    async def direct():
        from cogency.tools import files_tools

        tools = files_tools(user_directory(tmp / "root", "alice"))
        async with Agent(llm=model(), tools=tools, store=str(tmp / "direct.db")) as a:
            return [e.to_dict() async for e in a.stream("tool please", user_id="alice")]

    expected = asyncio.run(direct())
    # Tokens depend on each agent's prompt (its root, what it knows of alice): compared apart.
    assert events[-1]["usage"]["calls"] == expected[-1]["usage"]["calls"] == 2
    assert events[-1]["usage"]["input_tokens"] > 0
    strip = {"task_id", "conversation_id", "usage"}
    assert [{k: v for k, v in e.items() if k not in strip} for e in events] == \
        [{k: v for k, v in e.items() if k not in strip} for e in expected]


def test_a_conversation_runs_once_at_a_time_others_go_on(service):
    server, keys, db, tmp = service
    gate = tmp / f"gate-{uuid.uuid4().hex}"
    # The requests made while the run is held use another key of alice's: this key's two
    # slots may both be taken then (the held run, and learning from the first run).
    with server.client(keys["alice"]) as alice, \
            server.client(create_key(db, "alice")) as also_alice:
        first = run(alice, "start a conversation")
        conversation = first["conversation_id"]
        with alice.stream("POST", "/api/runs", json={
            "query": f"gate:{gate} waits", "conversation_id": conversation, "stream": True,
        }) as held:
            events = sse_events(held)
            assert next(events)["type"] == "start"
            busy = also_alice.post("/api/runs", json={"query": "me too",
                                                      "conversation_id": conversation})
            assert busy.status_code == 409
            assert busy.json()["error"]["type"] == "conflict"
            assert "has a run in flight" in busy.json()["error"]["message"]
            # another conversation of the same user runs meanwhile
            assert run(also_alice, "elsewhere")["response"] == "echo: elsewhere"
            gate.touch()
            rest = [event["type"] for event in events]
            assert rest[-1] == "end"
        after = run(alice, "and now", conversation_id=conversation)
    assert after["response"] == "echo: and now"
    contents = [c for (c,) in rows(db, "SELECT content FROM conversation_messages WHERE "
                                       "conversation_id = ? ORDER BY seq", conversation)]
    assert "me too" not in contents  # the refused request stored nothing
    assert contents[-2:] == ["and now", "echo: and now"]


def test_resume_continues_an_unfinished_task(service):
    server, keys, db, tmp = service
    nudge = tmp / f"nudge-{uuid.uuid4().hex}"
    with server.client(keys["alice"]) as alice:
        stuck = run(alice, f"nudge:{nudge} please")
        assert stuck["stop_reason"] == "no_progress"
        task_id = stuck["task_id"]
        listed = alice.get("/api/tasks").json()
        assert task_id in [task["task_id"] for task in listed]
        assert alice.get(f"/api/tasks/{task_id}").json()["query"] == f"nudge:{nudge} please"
        nudge.touch()
        with alice.stream("POST", f"/api/tasks/{task_id}/resume", json={"stream": True}) as r:
            events = list(sse_events(r))
        assert events[0]["type"] == "start" and events[0]["resumed"] is True
        assert events[-1]["stop_reason"] == "completed"
        assert task_id not in [task["task_id"] for task in alice.get("/api/tasks").json()]
        gone = alice.post(f"/api/tasks/{task_id}/resume")
        assert gone.status_code == 404
    stored = rows(db, "SELECT role, content FROM conversation_messages WHERE conversation_id = ? "
                      "ORDER BY seq", stuck["conversation_id"])
    assert stored == [("user", f"nudge:{nudge} please"),
                      ("assistant", f"nudged: nudge:{nudge} please")]
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces WHERE task_id = ?", task_id) == [(0,)]


def test_conversations_and_messages_are_the_users_own(service):
    server, keys, _, _ = service
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        mine = run(alice, "alice speaks")["conversation_id"]
        theirs = run(bob, "bob speaks")["conversation_id"]
        listed = [c["conversation_id"] for c in alice.get("/api/conversations").json()]
        assert mine in listed and theirs not in listed
        messages = alice.get(f"/api/conversations/{mine}/messages").json()
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "alice speaks"), ("assistant", "echo: alice speaks")]
        last = alice.get(f"/api/conversations/{mine}/messages", params={"limit": 1}).json()
        assert [m["content"] for m in last] == ["echo: alice speaks"]


def _isolation_calls(conversation, task, entry):
    """Every route that takes an id, called with another user's id."""
    return {
        ("delete", "/api/profile/entries/{entry_id}"): dict(url=f"/api/profile/entries/{entry}"),
        ("post", "/api/runs"): dict(json={"query": "intrude", "conversation_id": conversation}),
        ("post", "/api/tasks/{task_id}/resume"): dict(url=f"/api/tasks/{task}/resume"),
        ("get", "/api/tasks/{task_id}"): dict(url=f"/api/tasks/{task}"),
        ("get", "/api/conversations/{conversation_id}/messages"):
            dict(url=f"/api/conversations/{conversation}/messages"),
        ("get", "/api/tasks/{task_id}/approvals"): dict(url=f"/api/tasks/{task}/approvals"),
        ("post", "/api/tasks/{task_id}/approvals"):
            dict(url=f"/api/tasks/{task}/approvals", json={"decisions": {"call": True}}),
    }


def test_every_route_keeps_users_apart(service):
    server, keys, db, tmp = service
    nudge = tmp / f"never-{uuid.uuid4().hex}"
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        stuck = run(alice, f"nudge:{nudge} alice's task")
        conversation, task = stuck["conversation_id"], stuck["task_id"]
        entry = alice.post("/api/profile/entries",
                           json={"field": "goals", "value": "alice's own goal"}).json()
        before = rows(db, "SELECT COUNT(*) FROM conversation_messages")
        calls = _isolation_calls(conversation, task, entry["entry_id"])
        document = server.client().get("/openapi.json").json()
        routes = {(method, path) for path, item in document["paths"].items()
                  for method in item if path.startswith("/api/")}
        with_ids = {route for route in routes if "{" in route[1]} | {("post", "/api/runs")}
        assert with_ids == set(calls), "a route with an id has no isolation check here"
        for (method, path), call in calls.items():
            call = dict(call)
            answer = bob.request(method.upper(), call.pop("url", path), **call)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"]["type"] == "not_found"
            assert "alice" not in answer.text
        # the lists and the profile show bob only his own
        assert task not in [t["task_id"] for t in bob.get("/api/tasks").json()]
        assert conversation not in [c["conversation_id"]
                                    for c in bob.get("/api/conversations").json()]
        assert bob.get("/api/profile").json()["user_id"] == "bob"
        assert rows(db, "SELECT COUNT(*) FROM conversation_messages") == before
        # bob forgetting himself leaves alice whole
        forgotten = bob.delete("/api/profile").json()
        assert (forgotten["user_id"], forgotten["forgotten"]) == ("bob", True)
        assert alice.get(f"/api/tasks/{task}").status_code == 200
        assert rows(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'bob'") == [(0,)]
        assert rows(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'alice'") != [(0,)]
        assert rows(db, "SELECT superseded_at FROM profile_entries WHERE entry_id = ?",
                    entry["entry_id"]) == [(None,)]
        untouched = {(m, p) for m, p in routes} - {("delete", "/api/profile")}
        assert untouched  # every other route was called above or in the listing checks


def test_every_api_route_needs_a_live_key(service):
    server, keys, db, _ = service
    document = server.client().get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    routes = [(method, path.replace("{task_id}", "t").replace("{conversation_id}", "c"))
              for path, item in document["paths"].items() for method in item
              if path != "/health"]
    assert len(routes) >= 11 and any(path.startswith("/v1/") for _, path in routes)
    revoked_key = create_key(db, "carol")
    import asyncio

    from cogency.storage import open_store

    async def revoke():
        store = open_store(db)
        try:
            await store.revoke_api_key(revoked_key.split("_")[1])
        finally:
            await store.close()

    asyncio.run(revoke())
    wrong_secret = keys["alice"][:-4] + "AAAA"
    for key in (None, "not-a-key", wrong_secret, revoked_key):
        with server.client(key) as client:
            for method, path in routes:
                answer = client.request(method.upper(), path, json={"query": "x"})
                assert answer.status_code == 401, (key, method, path)
                assert answer.headers["www-authenticate"] == "Bearer"
                error = answer.json()["error"]
                assert (error["type"] == "unauthorized" if path.startswith("/api/")
                        else error["code"] == "unauthorized")  # OpenAI's shape under /v1
    # the key counts only as a bearer token; the scheme's name in any case (RFC 9110)
    with server.client() as client:
        for header, status in ((f"Basic {keys['alice']}", 401), (keys["alice"], 401),
                               ("Bearer", 401), (f"bearer {keys['alice']}", 200),
                               (f"BEARER {keys['alice']}", 200)):
            answer = client.get("/api/tasks", headers={"Authorization": header})
            assert answer.status_code == status, header
    assert server.client().get("/health").json()["status"] == "ok"


def test_limits_and_errors_are_json(service):
    server, keys, _, tmp = service
    with server.client(keys["alice"]) as alice:
        big = alice.post("/api/runs", content=b'{"query": "' + b"x" * 30000 + b'"}',
                         headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["type"] == "too_large"
        long = alice.post("/api/runs", json={"query": "y" * 1001})
        assert long.status_code == 413 and "at most 1000" in long.json()["error"]["message"]
        bad = alice.post("/api/runs", json={"querry": "typo"})
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
        bad_id = alice.post("/api/runs", json={"query": "x", "conversation_id": "a\x00b"})
        assert bad_id.status_code == 400 and "not a valid id" in bad_id.json()["error"]["message"]
        assert alice.get("/api/nowhere").json()["error"]["type"] == "not_found"
        # two runs in flight per key at most (--max-runs-per-key 2); the third gets 429
        gate = tmp / f"gate-{uuid.uuid4().hex}"
        started = threading.Barrier(3)
        answers = []

        def hold():
            with server.client(keys["alice"]) as client:
                with client.stream("POST", "/api/runs", json={
                        "query": f"gate:{gate}", "stream": True}) as r:
                    events = sse_events(r)
                    next(events)
                    started.wait()
                    answers.append([e["type"] for e in events][-1])

        threads = [threading.Thread(target=hold) for _ in range(2)]
        for thread in threads:
            thread.start()
        started.wait()
        third = alice.post("/api/runs", json={"query": "third"})
        assert third.status_code == 429 and third.json()["error"]["type"] == "too_many_runs"
        with server.client(keys["bob"]) as bob:  # the limit is per key
            assert run(bob, "bob is not limited")["stop_reason"] == "completed"
        gate.touch()
        for thread in threads:
            thread.join(10)
        assert answers == ["end", "end"]
        assert run(alice, "free again")["response"] == "echo: free again"
    with server.client() as anonymous:  # CORS is off unless --cors-origin is given
        preflight = anonymous.options("/api/runs", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers
        plain = anonymous.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in plain.headers


def test_the_log_holds_no_key_query_or_answer(service):
    server, keys, _, _ = service
    with server.client(keys["alice"]) as alice:
        run(alice, SECRET_QUERY)
    log = server.log()
    assert "POST /api/runs 200" in log
    for user, key in keys.items():
        assert key not in log and key.split("_", 2)[2] not in log
    assert SECRET_QUERY not in log
    assert "echo:" not in log


def test_a_client_that_leaves_does_not_stop_its_run(service):
    server, keys, db, tmp = service
    gate = tmp / f"gate-{uuid.uuid4().hex}"
    with server.client(keys["alice"]) as alice:
        with alice.stream("POST", "/api/runs", json={"query": f"gate:{gate} left",
                                                     "stream": True}) as r:
            start = next(sse_events(r))
        # the connection is closed; the run goes on and its answer is stored
        gate.touch()
        conversation = start["conversation_id"]

        wait_for(lambda: len(alice.get(f"/api/conversations/{conversation}/messages").json()) == 2)
        answer = alice.get(f"/api/conversations/{conversation}/messages").json()[-1]
    assert answer["content"] == f"opened: gate:{gate} left"
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces WHERE task_id = ?",
                start["task_id"]) == [(0,)]


def test_a_tool_call_waits_for_its_users_decision(service):
    server, keys, db, tmp = service
    root = user_directory(tmp / "root", "alice")
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        paused = run(alice, "write allowed.txt")
        assert paused["stop_reason"] == "awaiting_approval"
        [call] = paused["pending_approvals"]
        assert call["name"] == "file_write" and call["args"]["path"] == "allowed.txt"
        task = paused["task_id"]
        assert not (root / "allowed.txt").exists()
        assert alice.get(f"/api/tasks/{task}/approvals").json() == [call]
        listed = {t["task_id"]: t for t in alice.get("/api/tasks").json()}
        assert listed[task]["pending_approvals"] == [call]
        # another user neither sees nor decides it
        assert bob.get(f"/api/tasks/{task}/approvals").status_code == 404
        refused = bob.post(f"/api/tasks/{task}/approvals",
                           json={"decisions": {call["id"]: True}})
        assert refused.status_code == 404 and not (root / "allowed.txt").exists()
        unknown = alice.post(f"/api/tasks/{task}/approvals", json={"decisions": {"nope": True}})
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["message"]
        with alice.stream("POST", f"/api/tasks/{task}/approvals",
                          json={"decisions": {call["id"]: True}, "stream": True}) as r:
            events = list(sse_events(r))
        assert [e["type"] for e in events if e["type"] in ("result", "response", "end")] == [
            "result", "response", "end"]
        assert events[-1]["stop_reason"] == "completed"
        assert (root / "allowed.txt").read_text() == "written"
        assert alice.post(f"/api/tasks/{task}/approvals",
                          json={"decisions": {call["id"]: True}}).status_code == 404
        # denied: the file is never written, the model is told
        waiting = run(alice, "write denied.txt")
        [call] = waiting["pending_approvals"]
        done = alice.post(f"/api/tasks/{waiting['task_id']}/approvals",
                          json={"decisions": {call["id"]: False}}).json()
        assert done["stop_reason"] == "completed" and "denied" in done["response"]
        assert not (root / "denied.txt").exists()
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces WHERE task_id IN (?, ?)",
                task, waiting["task_id"]) == [(0,)]


def test_a_conversation_a_client_makes_up_is_not_found_and_not_held(service):
    # New conversations get ids the service makes: a named one must already be the user's.
    # Its hold checks that as it is taken (no read before it), and takes none.
    server, keys, db, _ = service
    made_up = f"made-up-{uuid.uuid4().hex}"
    with server.client(keys["alice"]) as alice:
        for body in ({"query": "hi", "conversation_id": made_up},
                     {"query": "hi", "conversation_id": made_up, "store": False}):
            answer = alice.post("/api/runs", json=body)
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["type"] == "not_found"
            assert "among yours" in answer.json()["error"]["message"]
        mine = run(alice, "a real one")["conversation_id"]
        assert run(alice, "again", conversation_id=mine)["response"] == "echo: again"
    assert rows(db, "SELECT COUNT(*) FROM conversations WHERE conversation_id = ?",
                made_up) == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM conversation_runs WHERE conversation_id = ?",
                made_up) == [(0,)]
    assert rows(db, "SELECT runner FROM conversation_runs WHERE conversation_id = ?",
                mine) == [(None,)]  # held for each run, let go after it
