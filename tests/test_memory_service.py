"""The profile over HTTP (`cogency serve`, a real server process): why each entry is
believed, corrections, history, export, import and forget's receipt, all scoped to the key's
user; and background learning bounded and counted in the per-key run limit."""

from __future__ import annotations

import json

import pytest

from serverutil import Server, create_key, rows, wait_for

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")

LLM = ("--llm", "memory_models:agent")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory-service")
    db = str(tmp / "service.db")
    keys = {user: create_key(db, user) for user in ("alice", "bob")}
    server = Server(db, tmp, *LLM)
    yield server, keys, db
    server.stop()


def run(client, query):
    response = client.post("/api/runs", json={"query": query})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_profile_routes_explain_correct_export_import_and_forget(service):
    server, keys, db = service
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        first = run(alice, "remember: ship v2")
        wait_for(lambda: alice.get("/api/profile").json()["profile"]["goals"] == ["ship v2"])
        (entry,) = alice.get("/api/profile/why").json()
        assert entry["field"] == "goals" and entry["value"] == "ship v2"
        (source,) = entry["sources"]
        assert source["task_id"] == first["task_id"]
        assert [q["content"] for q in source["quotes"]] == ["remember: ship v2"]
        ids = {r[0] for r in rows(db, "SELECT message_id FROM conversation_messages "
                                      "WHERE conversation_id = ?", first["conversation_id"])}
        assert set(source["message_ids"]) <= ids

        # bob sees nothing of alice's, and cannot touch it
        assert bob.get("/api/profile/why").json() == []
        gone = bob.delete(f"/api/profile/entries/{entry['entry_id']}")
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found"
        assert rows(db, "SELECT superseded_at FROM profile_entries WHERE entry_id = ?",
                    entry["entry_id"]) == [(None,)]

        made = alice.post("/api/profile/entries",
                          json={"field": "preferences", "key": "language", "value": "Rust"})
        assert made.status_code == 201 and made.json()["origin"] == "user"
        bad = alice.post("/api/profile/entries", json={"field": "nope", "value": "x"})
        assert bad.status_code == 400 and "field must be one of" in bad.json()["error"]["message"]
        removed = alice.delete(f"/api/profile/entries/{entry['entry_id']}")
        assert removed.status_code == 200 and removed.json()["reason"] == "removed"
        (old,) = alice.get("/api/profile/history").json()
        assert old["entry_id"] == entry["entry_id"] and old["superseded_at"]
        profile = alice.get("/api/profile").json()["profile"]
        assert profile["goals"] == [] and profile["preferences"] == {"language": "Rust"}

        document = alice.get("/api/profile/export").json()
        assert document["user_id"] == "alice" and len(document["entries"]) == 2
        forgotten = alice.delete("/api/profile").json()
        assert forgotten["erased"] == {
            "profiles": 1, "entries": 1, "history": 1, "conversations": 1, "messages": 2,
            "tasks": 0, "approvals": 0, "pending_learning": 0}
        assert forgotten["generation"] == 1 and forgotten["forgotten"] is True
        assert rows(db, "SELECT COUNT(*) FROM profile_entries WHERE user_id = 'alice'") == [(0,)]

        document["user_id"] = "bob"  # whoever it names, it is restored as the key's user
        restored = alice.post("/api/profile/import", json=document)
        assert restored.status_code == 201, restored.text
        assert restored.json()["messages"] == 2
        assert alice.get("/api/profile").json()["profile"] == profile
        assert rows(db, "SELECT user_id FROM conversations WHERE conversation_id = ?",
                    first["conversation_id"]) == [("alice",)]
        again = alice.post("/api/profile/import", json=document)
        assert again.status_code == 409
        malformed = bob.post("/api/profile/import", json={"format": "cogency.user/1",
                                                          "conversations": [{"x": 1}]})
        assert malformed.status_code == 400
        assert malformed.json()["error"]["message"].startswith("the export cannot be imported")


def test_background_learning_counts_in_the_keys_run_limit(tmp_path):
    db = str(tmp_path / "limit.db")
    key = create_key(db, "carol")
    gate = tmp_path / "learn"
    server = Server(db, tmp_path, *LLM, "--max-runs-per-key", "1",
                    extra_env={"COGENCY_TEST_LEARN_GATE": str(gate)})
    try:
        with server.client(key) as carol:
            run(carol, "remember: one")
            # the run is over, its learning is not: it holds the key's one slot
            busy = carol.post("/api/runs", json={"query": "remember: two"})
            assert busy.status_code == 429, busy.text
            assert "learning from finished ones counts as one" in busy.json()["error"]["message"]
            assert carol.get("/api/profile").json()["learning"]["claimed"] is True
            assert rows(db, "SELECT COUNT(*) FROM learning_queue") == [(1,)]
            gate.touch()
            wait_for(lambda: carol.get("/api/profile").json()["learning"] is None)
            answers = []  # the slot comes back as the learning worker ends (just after)
            wait_for(lambda: answers.append(carol.post("/api/runs", json={
                "query": "remember: two"})) or answers[-1].status_code != 429)
            assert answers[-1].status_code == 200, answers[-1].text
            wait_for(lambda: carol.get("/api/profile").json()["profile"]["goals"]
                     == ["one", "two"])
    finally:
        server.stop()
    data = json.loads(rows(db, "SELECT profile_data FROM user_profiles")[0][0])
    assert data["interaction_count"] == 2


def test_a_replica_learns_what_was_left_queued_without_any_run(tmp_path):
    import asyncio

    from cogency.state import State
    from cogency.storage import open_store

    db = str(tmp_path / "queued.db")
    key = create_key(db, "dave")

    async def leave_a_task_queued() -> None:  # as a process killed after its answer leaves it
        store = open_store(db)
        try:
            state = await State.start_task("remember: be kind", "dave", store=store,
                                           record_query=True)
            await state.complete_task(learn=True)
        finally:
            await store.close()

    asyncio.run(leave_a_task_queued())
    assert rows(db, "SELECT COUNT(*) FROM learning_queue") == [(1,)]
    server = Server(db, tmp_path, *LLM)
    try:
        with server.client(key) as dave:
            wait_for(lambda: (dave.get("/api/profile").json()["profile"] or {}).get("goals")
                     == ["be kind"])
    finally:
        server.stop()
    assert rows(db, "SELECT COUNT(*) FROM learning_queue") == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM conversations") == [(1,)]  # no run was needed
