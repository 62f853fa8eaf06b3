"""A client's retry never runs the agent again: the official `openai` client with its default
retries against a real `cogency serve`, `Idempotency-Key`, and the SDKs' own retry header;
the same key gets the same run's outcome on another replica and after a restart."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from serverutil import Server, create_key, rows, sse_events, wait_for

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retries")
    (tmp / "root").mkdir()
    db = str(tmp / "retries.db")
    server = Server(db, tmp, "--tools", "files", "--root", str(tmp / "root"))
    yield server, db, tmp
    server.stop()


def counts(db, user):
    """(tasks, conversations) of ``user`` in the database."""
    tasks = rows(db, "SELECT COUNT(*) FROM task_workspaces WHERE user_id = ?", user)[0][0]
    conversations = rows(db, "SELECT COUNT(*) FROM conversations WHERE user_id = ?", user)[0][0]
    return tasks, conversations


def test_the_openai_client_never_runs_a_paused_or_failed_run_again(served):
    server, db, _ = served
    user = f"sdk-{uuid.uuid4().hex[:8]}"
    ai = openai.OpenAI(base_url=server.url + "/v1", api_key=create_key(db, user), timeout=60)
    assert ai.max_retries == 2  # the client as it comes: it retries 409 and 5xx twice
    with pytest.raises(openai.ConflictError) as paused:
        ai.chat.completions.create(model="cogency",
                                   messages=[{"role": "user", "content": "write x.txt"}])
    assert paused.value.response.headers["x-should-retry"] == "false"
    assert paused.value.body["code"] == "awaiting_approval"
    assert counts(db, user) == (1, 1)  # was (3, 3): three runs, three paused calls
    assert rows(db, "SELECT COUNT(*) FROM task_approvals WHERE user_id = ?", user) == [(1,)]
    with pytest.raises(openai.APIStatusError) as failed:
        ai.responses.create(model="cogency", input="fail")
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert counts(db, user) == (2, 2)  # the failed run once, its task kept to resume
    assert "can be resumed" in failed.value.body["message"]
    with pytest.raises(openai.APIStatusError) as gone:  # keeping nothing: nothing to resume
        ai.chat.completions.create(model="cogency", store=False,
                                   messages=[{"role": "user", "content": "fail"}])
    assert gone.value.status_code == 502
    assert counts(db, user) == (2, 2)  # its task and conversation deleted with it
    assert "resume" not in gone.value.body["message"]
    assert "nothing of it was kept (store: false)" in gone.value.body["message"]


def test_a_store_false_task_that_fails_when_continued_says_nothing_was_kept(served):
    """A store: false chat paused on a client's tool is kept until the request that continues
    it; when that continuation fails, the task is gone with its conversation, and the error
    says so (not that it can be resumed)."""
    server, db, _ = served
    user = f"once-{uuid.uuid4().hex[:8]}"
    ai = openai.OpenAI(base_url=server.url + "/v1", api_key=create_key(db, user), timeout=60)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    asked = [{"role": "user", "content": "weather then fail Oslo"}]
    first = ai.chat.completions.create(model="cogency", store=False, tools=tools, messages=asked)
    [call] = first.choices[0].message.tool_calls
    assert counts(db, user) == (1, 1)  # paused: kept until the continuation
    with pytest.raises(openai.APIStatusError) as failed:
        ai.chat.completions.create(model="cogency", store=False, tools=tools, messages=[
            *asked, first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}])
    assert failed.value.status_code == 502
    assert counts(db, user) == (0, 0)  # the task and its conversation deleted with it
    assert "resume" not in failed.value.body["message"]
    assert "nothing of it was kept (store: false)" in failed.value.body["message"]


def test_an_idempotency_key_gets_the_first_runs_outcome(served):
    server, db, tmp = served
    user = f"key-{uuid.uuid4().hex[:8]}"
    key = create_key(db, user)
    with server.client(key) as client:
        def send(query, idempotency, stream=False, path="/api/runs"):
            return client.post(path, json={"query": query, "stream": stream},
                               headers={"Idempotency-Key": idempotency})

        first = send("hello once", "k-1")
        assert first.status_code == 200
        again = send("hello once", "k-1")
        assert again.json() == first.json()  # the same run's outcome, not a second run
        assert counts(db, user) == (0, 1)
        assert rows(db, "SELECT COUNT(*) FROM conversation_messages m JOIN conversations c "
                        "USING (conversation_id) WHERE c.user_id = ?", user) == [(2,)]
        with client.stream("POST", "/api/runs", json={"query": "hello once", "stream": True},
                           headers={"Idempotency-Key": "k-1"}) as streamed:
            assert streamed.status_code == 422  # another request (stream: true) ...
        reused = send("hello twice", "k-1")
        assert reused.status_code == 422  # ... or another query: not this key's request
        assert reused.json()["error"]["type"] == "idempotency_key_reused"
        # a paused run: the same 409 again, still one task
        paused = send("write y.txt", "k-2")
        assert paused.status_code == 200 and paused.json()["stop_reason"] == "awaiting_approval"
        assert send("write y.txt", "k-2").json() == paused.json()
        assert counts(db, user) == (1, 2)
        # a run in flight: a retry follows that run, it does not start one
        gate = tmp / f"gate-{uuid.uuid4().hex}"
        with client.stream("POST", "/api/runs", json={"query": f"gate:{gate}", "stream": True},
                           headers={"Idempotency-Key": "k-3"}) as held:
            events = sse_events(held)
            start = next(events)
            answers = []
            retry = threading.Thread(target=lambda: answers.append(
                send(f"gate:{gate}", "k-3", stream=True)))
            retry.start()
            wait_for(lambda: len(rows(db, "SELECT 1 FROM idempotency_keys WHERE task_id = ?",
                                      start["task_id"])) == 1)
            gate.touch()
            assert [e["type"] for e in events][-1] == "end"
            retry.join(20)
        followed = [line for line in answers[0].text.splitlines() if line.startswith("data: ")]
        assert start["task_id"] in followed[0] and "opened: gate:" in answers[0].text
        assert counts(db, user) == (1, 3)
        with pytest.raises(Exception):
            send("x", "\u00e9" * 3)  # not ASCII: refused (httpx cannot even send it)
        bad = client.post("/api/runs", json={"query": "x"},
                          headers={"Idempotency-Key": "x" * 300})
        assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]


def test_an_sdks_retry_header_makes_its_retries_idempotent(served):
    """The OpenAI SDKs send no idempotency key, but number their attempts
    (`x-stainless-retry-count`): a retry (a connection lost, a time-out) of a request gets the
    run its first attempt started."""
    server, db, tmp = served
    user = f"stainless-{uuid.uuid4().hex[:8]}"
    body = {"model": "cogency", "messages": [{"role": "user", "content": "hello sdk"}]}
    with server.client(create_key(db, user)) as client:
        def attempt(number):
            return client.post("/v1/chat/completions", json=body,
                               headers={"x-stainless-retry-count": str(number)})

        first = attempt(0)
        time.sleep(1.05)  # a retry a second later is answered as the first was, `created` too
        assert attempt(1).json() == attempt(2).json() == first.json()
        assert counts(db, user) == (0, 1)
        again = attempt(0)  # a new call of the client (its first attempt): a new run
        assert again.json()["id"] != first.json()["id"]
        assert counts(db, user) == (0, 2)
        assert attempt(1).json() == again.json()


def test_the_same_key_gets_the_same_outcome_on_another_replica_and_after_a_restart(tmp_path):
    db = str(tmp_path / "replicas.db")
    key = create_key(db, "alice")
    tools = ("--tools", "files")
    one, two = (Server(db, tmp_path, *tools, name=name) for name in ("one", "two"))
    try:
        with one.client(key) as first, two.client(key) as second:
            answer = first.post("/api/runs", json={"query": "hi"},
                                headers={"Idempotency-Key": "shared"}).json()
            assert second.post("/api/runs", json={"query": "hi"},
                               headers={"Idempotency-Key": "shared"}).json() == answer
            paused = second.post("/v1/chat/completions", json={
                "model": "cogency", "messages": [{"role": "user", "content": "write z.txt"}]},
                headers={"Idempotency-Key": "pause"})
            assert paused.status_code == 409 and paused.headers["x-should-retry"] == "false"
    finally:
        one.stop()
    restarted = Server(db, tmp_path, *tools, name="restarted")
    try:
        with restarted.client(key) as client:
            assert client.post("/api/runs", json={"query": "hi"},
                               headers={"Idempotency-Key": "shared"}).json() == answer
            again = client.post("/v1/chat/completions", json={
                "model": "cogency", "messages": [{"role": "user", "content": "write z.txt"}]},
                headers={"Idempotency-Key": "pause"})
            assert again.status_code == 409 and again.json() == paused.json()
    finally:
        restarted.stop()
        two.stop()
    assert counts(db, "alice") == (1, 2)  # two runs in all, each once
