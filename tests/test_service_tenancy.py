"""`cogency serve` keeps users apart on disk and in ids: each user's tools work in their own
directory, conversation ids are made by the server, `run`'s options are honoured, and nothing
a run produced (an id, a model's text) turns its answer into a 500."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from urllib.parse import unquote

import pytest

from cogency.tools.rooms import user_directory
from serverutil import LLM, Server, create_key, env, rows, sse_events

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with the files and shell tools that allows every call (`--yes`)."""
    tmp = tmp_path_factory.mktemp("tenancy")
    root = tmp / "root"
    root.mkdir()
    db = str(tmp / "tenancy.db")
    keys = {user: create_key(db, user) for user in ("alice", "bob", "a/b", "a_b")}
    server = Server(db, tmp, "--tools", "files,shell", "--root", str(root), "--yes")
    yield server, keys, db, root
    server.stop()


def output(said):
    """The tool's output in an answer of the `read`/`sh` models (not the call they echo)."""
    return said.partition("<tool_output>")[2]


def ask(client, query, **fields):
    answer = client.post("/api/runs", json={"query": query, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_each_users_tools_work_in_their_own_directory(served):
    server, keys, db, root = served
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        written = ask(alice, "write secret.txt")  # --yes: the call runs, no pause
        assert written["stop_reason"] == "completed" and not written["pending_approvals"]
        mine = user_directory(root, "alice")
        assert (mine / "secret.txt").read_text() == "written"
        assert not (root / "secret.txt").exists()
        assert "written" in ask(alice, "read secret.txt")["response"]
        # bob reaches none of it, by any path or command
        for query in ("read secret.txt", f"read ../{mine.name}/secret.txt",
                      f"read {mine}/secret.txt", f"sh cat ../*/secret.txt {mine}/secret.txt",
                      "sh ls -a .. && pwd"):
            said = output(ask(bob, query)["response"])
            assert said and "written" not in said, said
            assert mine.name not in said or said.count(mine.name) == said.count(
                f"{mine.name}/secret.txt"), said  # only in the refusal of the path it asked
        pwd = output(ask(bob, "sh pwd")["response"]).replace("</tool_output>", "").strip()
        assert pwd.endswith(user_directory(root, "bob").name)
    # two ids that read alike ("a/b", "a_b") get two directories
    for user in ("a/b", "a_b"):
        with server.client(keys[user]) as client:
            ask(client, "write mine.txt")
    assert user_directory(root, "a/b") != user_directory(root, "a_b")
    assert all((user_directory(root, user) / "mine.txt").exists() for user in ("a/b", "a_b"))
    # forgetting alice deletes her directory, and the receipt says so; bob's stays
    held = sum(len(dirs) + len(files) for _, dirs, files in os.walk(mine))
    assert held >= 1  # secret.txt
    with server.client(keys["alice"]) as alice:
        forgotten = alice.delete("/api/profile")
        assert forgotten.status_code == 200
        receipt = forgotten.json()
    assert (receipt["tool_directory"], receipt["tool_files"]) == (str(mine), held)
    assert receipt["erased"]["conversations"] >= 2
    assert not mine.exists() and user_directory(root, "bob").exists()
    assert rows(db, "SELECT COUNT(*) FROM conversations WHERE user_id = 'alice'") == [(0,)]


def test_clients_never_choose_a_conversations_id(served):
    server, keys, db, _ = served
    with server.client(keys["alice"]) as alice, server.client(keys["bob"]) as bob:
        taken = bob.post("/api/runs", json={"query": "squat", "conversation_id": "chat-1"})
        assert taken.status_code == 404, taken.text  # was 200: bob took the id "chat-1"
        assert rows(db, "SELECT COUNT(*) FROM conversations WHERE conversation_id = 'chat-1'") \
            == [(0,)]
        theirs = ask(alice, "hello")["conversation_id"]
        assert len(theirs) == 36  # made by the server
        missing = bob.post("/api/runs", json={"query": "x", "conversation_id": "nope-404"})
        foreign = bob.post("/api/runs", json={"query": "x", "conversation_id": theirs})
        assert missing.status_code == foreign.status_code == 404
        assert missing.json()["error"]["message"].replace("nope-404", "ID") == \
            foreign.json()["error"]["message"].replace(theirs, "ID")  # the same answer
        # over the OpenAI endpoints too
        chat = bob.post("/v1/chat/completions", json={
            "model": "cogency", "metadata": {"conversation_id": "chat-2"},
            "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "not_found"
        forged = "resp_" + __import__("base64").urlsafe_b64encode(b"chat-3").decode() + ".x"
        response = bob.post("/v1/responses", json={
            "model": "cogency", "input": "hi", "previous_response_id": forged})
        assert response.status_code == 404
        assert rows(db, "SELECT COUNT(*) FROM conversations WHERE conversation_id IN "
                        "('chat-2', 'chat-3')") == [(0,)]


def test_any_stored_conversation_id_fits_the_header_and_any_answer_the_json(served):
    server, keys, db, _ = served
    odd = "café ☕ 会話 / 1"  # an id the library allows (made by Agent.run, not the server)

    async def made_by_the_library():
        from cogency import Agent
        from server_models import agent as model

        async with Agent(llm=model(), store=db) as agent:
            await agent.run("first", user_id="alice", conversation_id=odd)

    asyncio.run(made_by_the_library())
    with server.client(keys["alice"]) as alice:
        chat = alice.post("/v1/chat/completions", json={
            "model": "cogency", "metadata": {"conversation_id": odd},
            "messages": [{"role": "user", "content": "recall"}]})
        assert chat.status_code == 200, chat.text  # was 500, after the run ran
        assert unquote(chat.headers["x-cogency-conversation-id"]) == odd
        assert chat.json()["choices"][0]["message"]["content"] == "you said: first"
        with alice.stream("POST", "/v1/responses", json={
                "model": "cogency", "input": "again", "stream": True,
                "metadata": {"conversation_id": odd}}) as streamed:
            assert streamed.status_code == 200
            assert unquote(streamed.headers["x-cogency-conversation-id"]) == odd
        # a model's lone surrogate: a JSON escape, never a 500
        answer = alice.post("/api/runs", json={"query": "surrogate"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["response"] == "half of a pair: \ud800 (from the model)"
        assert b"\\ud800" in answer.content
        with alice.stream("POST", "/api/runs", json={"query": "surrogate",
                                                     "stream": True}) as streamed:
            events = list(sse_events(streamed))
        assert events[-2]["text"] == "half of a pair: \ud800 (from the model)"
        chat = alice.post("/v1/chat/completions", json={
            "model": "cogency", "messages": [{"role": "user", "content": "surrogate"}]})
        assert chat.status_code == 200, chat.text


def test_a_resent_first_turn_too_long_for_the_window_never_reaches_the_model_in_part(served):
    server, keys, _, _ = served
    long_turn = "word " * 12_000  # more than the history window (8,000 tokens)
    with server.client(keys["bob"]) as bob:
        chat = bob.post("/v1/chat/completions", json={"model": "cogency", "messages": [
            {"role": "user", "content": long_turn}, {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "short"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "roles"}]})
        assert chat.status_code == 200, chat.text
        # the newest whole turns that fit: never "fine" without the question it answered
        assert chat.json()["choices"][0]["message"]["content"] == "user assistant user"


def _serve(tmp_path, *args, **extra_env):
    return subprocess.run(
        [sys.executable, "-m", "cogency.cli", "serve", "--db", str(tmp_path / "o.db"),
         "--llm", LLM, "--port", "0", "--root", str(tmp_path), *args],
        capture_output=True, text=True, env=env(**extra_env), timeout=60)


def test_serve_refuses_the_shell_without_its_sandbox(tmp_path):
    # no bwrap on the PATH: the shell would run unconfined, so every user's files are open
    refused = _serve(tmp_path, "--tools", "shell", PATH="/nonexistent")
    assert refused.returncode == 1, refused.stdout
    assert "serving the shell tool to many users needs its bubblewrap sandbox" in refused.stderr


def test_serve_honours_read_only(tmp_path):
    for args, word in ((("--tools", "shell"), "shell"), (("--mcp", "some-server"), "--mcp")):
        refused = _serve(tmp_path, *args, "--read-only")
        assert refused.returncode == 1, refused.stdout  # was: served, --read-only ignored
        assert refused.stderr.startswith("error: --read-only cannot include") and word in \
            refused.stderr
    db = str(tmp_path / "ro.db")
    key = create_key(db, "alice")
    server = Server(db, tmp_path, "--tools", "files", "--read-only", "--yes", name="ro")
    try:
        with server.client(key) as alice:
            tried = alice.post("/api/runs", json={"query": "write x.txt"}).json()
        # file_write is not among the tools (the model is told so), nothing paused or written
        assert "unknown tool 'file_write' (available tools: file_read, file_list, " \
            "file_search)" in tried["response"]
        assert not tried["pending_approvals"]
        assert not any(tmp_path.rglob("x.txt"))
    finally:
        server.stop()
