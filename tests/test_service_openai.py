"""The official `openai` client against a real `cogency serve`: both endpoints, streaming and
not, conversations continued across requests and after a restart, OpenAI-shaped 400s."""

from __future__ import annotations

import sqlite3

import pytest

from serverutil import Server, create_key

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai")
    db = str(tmp / "openai.db")
    keys = {user: create_key(db, user) for user in ("alice", "bob")}
    (tmp / "root").mkdir()
    state = {"server": Server(db, tmp, "--tools", "files", "--root", str(tmp / "root"))}
    yield state, keys, db, tmp
    state["server"].stop()


def client(server, key):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def messages(db, conversation):
    connection = sqlite3.connect(db)
    try:
        return connection.execute(
            "SELECT c.user_id, m.role, m.content FROM conversation_messages m JOIN "
            "conversations c USING (conversation_id) WHERE conversation_id = ? ORDER BY m.seq",
            (conversation,)).fetchall()
    finally:
        connection.close()


def test_models_and_chat_completions(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    assert [model.id for model in ai.models.list()] == ["cogency"]
    first = ai.chat.completions.create(model="cogency",
                                       messages=[{"role": "user", "content": "my name is Ada"}])
    assert first.choices[0].message.content == "echo: my name is Ada"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    conversation = first.model_extra["conversation_id"]
    # continued: the client names the conversation; the history is Cogency's
    again = ai.chat.completions.create(
        model="cogency", metadata={"conversation_id": conversation},
        messages=[{"role": "user", "content": "my name is Ada"},
                  {"role": "assistant", "content": "echo: my name is Ada"},
                  {"role": "user", "content": "recall"}])
    assert again.choices[0].message.content == "you said: my name is Ada"
    assert messages(db, conversation) == [
        ("alice", "user", "my name is Ada"), ("alice", "assistant", "echo: my name is Ada"),
        ("alice", "user", "recall"), ("alice", "assistant", "you said: my name is Ada")]
    # streaming, with usage
    chunks = list(ai.chat.completions.create(
        model="cogency", stream=True, stream_options={"include_usage": True},
        metadata={"conversation_id": conversation},
        messages=[{"role": "user", "content": "stream this"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream this"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.total_tokens > 0
    assert messages(db, conversation)[-1] == ("alice", "assistant", "echo: stream this")


def test_responses_chain_and_survive_a_restart(served, tmp_path):
    state, keys, db, tmp = served
    ai = client(state["server"], keys["alice"])
    first = ai.responses.create(model="cogency", input="I live in Lisbon")
    assert first.output_text == "echo: I live in Lisbon" and first.status == "completed"
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    second = ai.responses.create(model="cogency", input="recall",
                                 previous_response_id=first.id)
    assert second.output_text == "you said: I live in Lisbon"
    assert second.metadata["conversation_id"] == first.metadata["conversation_id"]
    with ai.responses.stream(model="cogency", input="streamed", previous_response_id=second.id) \
            as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert final.output_text == "echo: streamed"
    # bob cannot continue alice's conversation by naming her response
    bob = client(state["server"], keys["bob"])
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="cogency", input="recall", previous_response_id=final.id)
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.create(
            model="cogency", metadata={"conversation_id": final.metadata["conversation_id"]},
            messages=[{"role": "user", "content": "recall"}])
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="cogency", input="hi", previous_response_id="resp_garbage")
    # a restart: the chain goes on from the stored conversation
    state["server"].stop()
    state["server"] = Server(db, tmp, "--tools", "files", "--root", str(tmp / "root"),
                             name="restarted")
    after = client(state["server"], keys["alice"]).responses.create(
        model="cogency", input="recall", previous_response_id=final.id)
    assert after.output_text == "you said: I live in Lisbon"
    stored = messages(db, first.metadata["conversation_id"])
    assert [content for _, role, content in stored if role == "user"] == [
        "I live in Lisbon", "recall", "streamed", "recall"]


def test_what_cannot_be_honoured_is_a_400(served):
    state, keys, _, _ = served
    ai = client(state["server"], keys["alice"])
    hello = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(messages=hello, tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (dict(messages=hello, n=2), "n"),
        (dict(messages=hello, temperature=0.2), "temperature"),
        (dict(messages=[{"role": "system", "content": "be terse"}, *hello]), "messages"),
        (dict(messages=[{"role": "user", "content": "x"}] * 501), "messages"),  # bounded
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            ai.chat.completions.create(model="cogency", **fields)
        error = caught.value.body
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        ai.responses.create(model="cogency", input="hi", instructions="be terse")
    assert caught.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as caught:
        ai.responses.create(model="cogency", input=[
            *hello, {"role": "assistant", "content": "echo: hi"}, *hello])
    assert caught.value.body["param"] == "input"
    assert "previous_response_id" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        ai.chat.completions.create(model="gpt-4o", messages=hello)
    with pytest.raises(openai.AuthenticationError):
        client(state["server"], "cog_wrong").models.list()


def test_a_call_waiting_for_approval_is_a_409_that_says_where_to_decide(served):
    state, keys, _, tmp = served
    ai = client(state["server"], keys["alice"])
    with pytest.raises(openai.ConflictError) as caught:
        ai.chat.completions.create(model="cogency",
                                   messages=[{"role": "user", "content": "write x.txt"}])
    error = caught.value.body
    assert error["code"] == "awaiting_approval" and "file_write" in error["message"]
    assert "/approvals" in error["message"]
    assert not (tmp / "root" / "x.txt").exists()


def conversations_of(db, user):
    connection = sqlite3.connect(db)
    try:
        return {row[0] for row in connection.execute(
            "SELECT conversation_id FROM conversations WHERE user_id = ?", (user,))}
    finally:
        connection.close()


def test_a_chat_ui_resending_the_history_continues_its_conversation_or_starts_one_with_it(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    before = conversations_of(db, "alice")
    history = [{"role": "user", "content": "tool first"}]
    first = ai.chat.completions.create(model="cogency", messages=history)
    assert first.choices[0].message.content == "listed: tool first"  # after a tool call
    conversation = first.model_extra["conversation_id"]
    history += [{"role": "assistant", "content": "listed: tool first"},
                {"role": "user", "content": "my name is Ada"}]
    second = ai.chat.completions.create(model="cogency", messages=history)
    assert second.choices[0].message.content == "echo: my name is Ada"
    assert second.model_extra["conversation_id"] == conversation
    history += [{"role": "assistant", "content": "echo: my name is Ada\n"},  # a UI's newline
                {"role": "user", "content": "recall"}]
    chunks = list(ai.chat.completions.create(model="cogency", messages=history, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "you said: tool first"  # the model had the history: Cogency's, not resent
    assert {c.model_extra["conversation_id"] for c in chunks} == {conversation}
    assert conversations_of(db, "alice") == before | {conversation}
    stored = messages(db, conversation)
    assert [(role, content) for _, role, content in stored if role != "tool"
            and not content.startswith('{"actions"')] == [
        ("user", "tool first"), ("assistant", "listed: tool first"),
        ("user", "my name is Ada"), ("assistant", "echo: my name is Ada"),
        ("user", "recall"), ("assistant", "you said: tool first")]
    assert [role for _, role, _ in stored].count("tool") == 1
    assert {user for user, _, _ in stored} == {"alice"}
    history[3]["content"] = "echo: my name is Ada"
    whole = [*history, {"role": "assistant", "content": "you said: tool first"}]

    # bob resending alice's history word for word does not reach her conversation: he gets
    # his own, which starts with those turns (the model has them)
    bob = client(state["server"], keys["bob"])
    theirs = bob.chat.completions.create(
        model="cogency", messages=[*whole, {"role": "user", "content": "recall"}])
    assert theirs.choices[0].message.content == "you said: tool first"
    assert theirs.model_extra["conversation_id"] != conversation
    assert theirs.model_extra["conversation_id"] in conversations_of(db, "bob")
    assert conversation not in conversations_of(db, "bob")
    assert messages(db, conversation) == stored

    # a history that matches none (edited, a regenerated answer, or a prefix dropped) starts
    # a new conversation holding exactly the turns the client shows, then the query
    edited = [{**whole[0], "content": "tool second"}, *whole[1:]]
    seen = set()
    for changed in (edited, whole[:-2] + whole[-1:], whole[2:]):
        fresh = ai.chat.completions.create(
            model="cogency", messages=[*changed, {"role": "user", "content": "recall"}])
        assert fresh.choices[0].message.content == f"you said: {changed[0]['content']}"
        new = fresh.model_extra["conversation_id"]
        assert new not in seen | {conversation}
        seen.add(new)
        assert messages(db, new) == [
            ("alice", m["role"], m["content"]) for m in changed] + [
            ("alice", "user", "recall"), ("alice", "assistant", fresh.choices[0].message.content)]
    assert messages(db, conversation) == stored
    assert conversations_of(db, "alice") == before | {conversation} | seen

    # the whole history, unchanged, still continues the first; a grown copy continues a copy
    again = ai.chat.completions.create(
        model="cogency", messages=[*whole, {"role": "user", "content": "go on"}])
    assert again.model_extra["conversation_id"] == conversation
    assert messages(db, conversation)[-2:] == [("alice", "user", "go on"),
                                               ("alice", "assistant", "echo: go on")]
    copy = [*edited, {"role": "user", "content": "recall"},
            {"role": "assistant", "content": "you said: tool second"}]
    grown = ai.chat.completions.create(
        model="cogency", messages=[*copy, {"role": "user", "content": "more"}])
    assert grown.model_extra["conversation_id"] in seen
    assert conversations_of(db, "alice") == before | {conversation} | seen


def test_a_resent_history_continues_the_newest_conversation_with_those_turns(served):
    state, _, db, _ = served
    ai = client(state["server"], create_key(db, "carol"))

    def chat(*texts):
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                 for i, text in enumerate(texts)]
        return ai.chat.completions.create(model="cogency", messages=turns).model_extra[
            "conversation_id"]

    old = chat("old times")
    twins = [chat("same"), chat("same")]
    assert chat("same", "echo: same", "again") == twins[1]  # the newest match
    for number in range(60):
        chat(f"filler {number}")
    # "old times" is now the 63rd newest conversation: still found (was: only the 50 newest
    # were searched, so it started a new conversation)
    assert chat("old times", "echo: old times", "recall") == old
    assert messages(db, old) == [("carol", "user", "old times"),
                                 ("carol", "assistant", "echo: old times"),
                                 ("carol", "user", "recall"),
                                 ("carol", "assistant", "you said: old times")]
