"""The official `openai` client against a real `cogency serve`: both endpoints, streaming and
not, conversations continued across requests and after a restart, OpenAI-shaped 400s."""

from __future__ import annotations

import json
import sqlite3

import pytest

from serverutil import Server, create_key, rows

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


def test_what_cannot_be_honoured_is_a_400_naming_the_field(served):
    """Only what would change the answer's meaning and cannot be honoured is refused; the
    defaults and settings that change nothing are accepted (test_fields_that_change_nothing)."""
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    hello = [{"role": "user", "content": "hi"}]
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    chat_cases = [
        (dict(n=2), "n"),
        (dict(logprobs=True), "logprobs"),
        (dict(top_logprobs=3), "top_logprobs"),
        (dict(logit_bias={"1234": 5}), "logit_bias"),
        (dict(modalities=["text", "audio"]), "modalities"),
        (dict(web_search_options={}), "web_search_options"),
        (dict(functions=[{"name": "f", "parameters": {}}]), "functions"),
        (dict(tools=[{"type": "custom", "custom": {"name": "grammar"}}]), "tools[0]"),
        (dict(tool_choice={"type": "function", "function": {"name": "absent"}},
              tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),
        (dict(response_format={"type": "xml"}), "response_format"),
        (dict(temperature=3.5), "temperature"),  # out of OpenAI's range, not unsupported
        (dict(metadata={"conversation_id": "x"}, store=False), "store"),
        (dict(extra_body={"made_up": 1}), "made_up"),
    ]
    before = rows(db, "SELECT COUNT(*) FROM task_workspaces")
    for fields, param in [*chat_cases, (dict(messages=image), "messages"),
                          (dict(messages=[{"role": "user", "content": "x"}] * 501), "messages")]:
        with pytest.raises(openai.BadRequestError) as caught:
            ai.chat.completions.create(model="cogency", **{"messages": hello, **fields})
        error = caught.value.body
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), fields
        assert error["message"]
    responses_cases = [
        (dict(tools=[{"type": "web_search"}]), "tools[0]"),
        (dict(include=["message.output_text.logprobs"]), "include"),
        (dict(background=True), "background"),
        (dict(prompt={"id": "pmpt_1"}), "prompt"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         "input"),
        (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input"),
    ]
    for fields, param in responses_cases:
        with pytest.raises(openai.BadRequestError) as caught:
            ai.responses.create(model="cogency", **{"input": "hi", **fields})
        assert caught.value.body["param"] == param, fields
    assert rows(db, "SELECT COUNT(*) FROM task_workspaces") == before  # nothing ran
    with pytest.raises(openai.NotFoundError):
        ai.chat.completions.create(model="gpt-4o", messages=hello)
    with pytest.raises(openai.NotFoundError):
        ai.models.retrieve("gpt-4o")
    assert ai.models.retrieve("cogency").id == "cogency"
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


def tasks_in(db, conversation):
    """The distinct tasks whose messages the conversation holds, in order (one per request
    that asked something; a continuation with a tool's results adds none)."""
    found = rows(db, "SELECT task_id FROM conversation_messages WHERE conversation_id = ? "
                     "AND task_id IS NOT NULL ORDER BY seq", conversation)
    return list(dict.fromkeys(task for (task,) in found))


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_sampling_settings_are_honoured_and_what_changes_nothing_is_accepted(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    raw = ai.chat.completions.with_raw_response.create(
        model="cogency", messages=[{"role": "user", "content": "options"}],
        temperature=0.2, top_p=0.9, seed=7, max_tokens=200, stop=["\n\n"], user="u-1",
        logprobs=False, n=1, parallel_tool_calls=True, store=True, tools=[],
        tool_choice="none", service_tier="auto", prompt_cache_key="k", safety_identifier="s",
        metadata={"app": "tests"}, frequency_penalty=0.5, presence_penalty=0,
        response_format={"type": "text"}, stream_options=None, modalities=["text"],
        extra_body={"top_k": 40})
    completion = raw.parse()
    assert json.loads(completion.choices[0].message.content) == {
        "seed": 7, "temperature": 0.2, "top_p": 0.9}  # what the model was called with
    assert completion.service_tier == "default"
    # accepted, not applied (the agent's model takes no penalty, and no top_k): said so
    assert raw.headers["x-cogency-not-applied"] == "frequency_penalty, top_k"
    serial = ai.chat.completions.with_raw_response.create(
        model="cogency", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
        parallel_tool_calls=False)
    assert serial.headers["x-cogency-not-applied"] == "parallel_tool_calls"
    assert "x-cogency-not-applied" not in ai.chat.completions.with_raw_response.create(
        model="cogency", messages=[{"role": "user", "content": "hi"}]).headers

    response = ai.responses.create(
        model="cogency", input="options", temperature=0.3, top_p=0.5, include=[],
        truncation="disabled", text={"format": {"type": "text"}}, tool_choice="auto",
        tools=[], parallel_tool_calls=True, max_output_tokens=300, store=True,
        reasoning={"effort": "low"}, user="u-1", prompt_cache_key="k", metadata={"a": "b"})
    assert json.loads(response.output_text) == {
        "reasoning_effort": "low", "temperature": 0.3, "top_p": 0.5}
    # what was asked is reported back, as OpenAI does
    assert (response.temperature, response.top_p, response.tool_choice, response.tools,
            response.parallel_tool_calls, response.max_output_tokens, response.truncation) == (
        0.3, 0.5, "auto", [], True, 300, "disabled")
    assert response.metadata["a"] == "b" and response.reasoning.effort == "low"
    conversation = response.metadata["conversation_id"]
    assert len(tasks_in(db, conversation)) == 1


def test_system_messages_and_instructions_reach_the_model_as_the_applications(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    chat = ai.chat.completions.create(model="cogency", messages=[
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
        {"role": "user", "content": "instructions"}])
    assert chat.choices[0].message.content == "instructions: Be terse.\n\nAnswer in French."
    response = ai.responses.create(model="cogency", instructions="Be kind.", input=[
        {"role": "developer", "content": "Use metric units."},
        {"role": "user", "content": "instructions"}])
    assert response.output_text == "instructions: Be kind.\n\nUse metric units."
    assert response.instructions == "Be kind."
    for conversation in (chat.model_extra["conversation_id"],
                         response.metadata["conversation_id"]):
        # the instructions are the task's, not turns of the conversation
        assert [role for _, role, _ in messages(db, conversation)] == ["user", "assistant"]


def test_an_answer_schema_makes_the_answer_json(served):
    state, keys, _, _ = served
    ai = client(state["server"], keys["alice"])
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "degrees": {"type": "integer"}},
              "required": ["city", "degrees"], "additionalProperties": False}
    chat = ai.chat.completions.create(
        model="cogency", messages=[{"role": "user", "content": "structured"}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "weather", "schema": schema, "strict": True}})
    assert json.loads(chat.choices[0].message.content) == {"city": "Oslo", "degrees": 12}
    response = ai.responses.create(model="cogency", input="structured", text={"format": {
        "type": "json_schema", "name": "weather", "schema": schema, "strict": True}})
    assert json.loads(response.output_text) == {"city": "Oslo", "degrees": 12}
    assert response.text.format.type == "json_schema"  # reported back
    # an answer the schema refuses is asked again, then a clear error (the task is kept)
    with pytest.raises(openai.APIStatusError) as caught:
        ai.chat.completions.create(
            model="cogency", messages=[{"role": "user", "content": "structured"}],
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "required": ["name"]}}})
    assert caught.value.status_code == 502 and "schema" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_max_tokens_cuts_the_answer_and_says_so(served):
    state, keys, _, _ = served
    ai = client(state["server"], keys["alice"])
    cut = ai.chat.completions.create(
        model="cogency", max_completion_tokens=2,
        messages=[{"role": "user", "content": "a long story about the sea"}])
    assert cut.choices[0].finish_reason == "length"
    assert "echo: a long story about the sea".startswith(cut.choices[0].message.content)
    assert len(cut.choices[0].message.content) < len("echo: a long story")
    short = ai.responses.create(model="cogency", input="a long story about the sea",
                                max_output_tokens=2)
    assert short.status == "incomplete"
    assert short.incomplete_details.reason == "max_output_tokens"


def test_client_tools_pause_the_task_and_its_results_continue_it_on_another_replica(served):
    """The official client's function calling, on both endpoints: the model calls the
    client's function, the reply carries the call, the client's next request with the result
    continues the same task (on a second server process on the same database: any replica),
    and a tool the model never calls costs nothing."""
    state, keys, db, tmp = served
    ai = client(state["server"], keys["alice"])
    ask = [{"role": "user", "content": "weather Oslo"}]
    paused = ai.chat.completions.create(model="cogency", messages=ask, tools=[WEATHER])
    choice = paused.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "get_weather", {"city": "Oslo"})
    conversation = paused.model_extra["conversation_id"]
    assert rows(db, "SELECT call_id, status, decider FROM task_approvals WHERE call_id = ?",
                call.id) == [(call.id, "pending", "client")]

    replica = Server(db, tmp, "--tools", "files", "--root", str(tmp / "root"), name="replica")
    try:
        other = client(replica, keys["alice"])
        done = other.chat.completions.create(model="cogency", tools=[WEATHER], messages=[
            *ask, choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "12 °C, clear"}])
        assert done.choices[0].message.content == "the weather in Oslo: 12 °C, clear"
        assert done.choices[0].finish_reason == "stop"
        assert done.model_extra["conversation_id"] == conversation
        # sending the results again finds no task waiting for them: a clear 404, no new run
        with pytest.raises(openai.NotFoundError, match="no task of yours waits"):
            other.chat.completions.create(model="cogency", tools=[WEATHER], messages=[
                *ask, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "12 °C, clear"}])
    finally:
        replica.stop()
    assert len(tasks_in(db, conversation)) == 1  # one logical request, one task
    stored = messages(db, conversation)
    assert [role for _, role, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(stored[2][2])["output"] == "12 °C, clear"
    assert rows(db, "SELECT COUNT(*) FROM task_approvals WHERE call_id = ?", call.id) == [(0,)]

    # two calls in one step, streamed: each in the chunk shape OpenAI documents
    chunks = list(ai.chat.completions.create(
        model="cogency", stream=True, tools=[WEATHER, TIME],
        messages=[{"role": "user", "content": "weather and time Rome"}]))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Rome"}), (1, "get_time", {"city": "Rome"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    both = [{"role": "tool", "tool_call_id": d.id, "content": text}
            for d, text in zip(deltas, ("sunny", "noon"))]
    calls = [{"id": d.id, "type": "function", "function": {
        "name": d.function.name, "arguments": d.function.arguments}} for d in deltas]
    with pytest.raises(openai.BadRequestError, match="get_time"):  # one result is missing
        ai.chat.completions.create(model="cogency", messages=[
            {"role": "user", "content": "weather and time Rome"},
            {"role": "assistant", "tool_calls": calls}, both[0]])
    finished = ai.chat.completions.create(model="cogency", messages=[
        {"role": "user", "content": "weather and time Rome"},
        {"role": "assistant", "tool_calls": calls}, *both])
    assert finished.choices[0].message.content == "the weather in Rome: sunny; noon"

    # tool_choice: a named function (or allowed_tools) is the only one offered, and a call
    # is asked for in the application's instructions; "required" asks for one of them
    named = ai.chat.completions.create(
        model="cogency", tools=[WEATHER, TIME], messages=[
            {"role": "user", "content": "instructions"}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.content == (
        "instructions: Before your final answer, call get_weather once (the application "
        "requires a call to it)")
    required = ai.chat.completions.create(
        model="cogency", tools=[WEATHER, TIME], tool_choice="required", messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "instructions"}])
    assert required.choices[0].message.content == (
        "instructions: Be brief.\n\nBefore your final answer, call at least one of get_weather, "
        "get_time (the application requires it)")
    allowed = ai.chat.completions.create(
        model="cogency", tools=[WEATHER, TIME], messages=ask,
        tool_choice={"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_time"}}]}})
    assert allowed.choices[0].message.content == "I have no weather tool"
    # tool_choice "none": the client's tools are not offered; a tool never called costs nothing
    none = ai.chat.completions.create(model="cogency", messages=ask, tools=[WEATHER],
                                      tool_choice="none")
    assert none.choices[0].message.content == "I have no weather tool"
    idle = ai.chat.completions.create(model="cogency", tools=[WEATHER],
                                      messages=[{"role": "user", "content": "hello"}])
    assert idle.choices[0].message.content == "echo: hello"
    assert rows(db, "SELECT COUNT(*) FROM task_approvals WHERE decider = 'client'") == [(0,)]


def test_responses_function_calls_continue_by_previous_response_id_and_are_retrievable(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    tool = {"type": "function", "name": "get_weather", "description": "The weather now.",
            "parameters": WEATHER["function"]["parameters"], "strict": True}
    with ai.responses.stream(model="cogency", input="weather Lisbon", tools=[tool]) as stream:
        kinds = [event.type for event in stream]
        paused = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed" and paused.status == "completed"
    [call] = paused.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call", "get_weather", {"city": "Lisbon"})
    assert paused.tools[0].name == "get_weather"  # what was asked, reported back
    waiting = ai.responses.retrieve(paused.id)  # while it waits: the call it asked for
    assert [(o.type, o.call_id) for o in waiting.output] == [("function_call", call.call_id)]
    answer = ai.responses.create(
        model="cogency", previous_response_id=paused.id, tools=[tool],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 °C"}])
    assert answer.output_text == "the weather in Lisbon: 21 °C"
    assert answer.id != paused.id
    conversation = answer.metadata["conversation_id"]
    assert conversation == paused.metadata["conversation_id"]
    assert len(tasks_in(db, conversation)) == 1

    # both responses, as stored, for their user only
    again = ai.responses.retrieve(paused.id)
    assert [(o.type, o.call_id, o.name) for o in again.output] == [
        ("function_call", call.call_id, "get_weather")]
    assert ai.responses.retrieve(answer.id).output_text == "the weather in Lisbon: 21 °C"
    with pytest.raises(openai.NotFoundError):
        client(state["server"], keys["bob"]).responses.retrieve(answer.id)
    with pytest.raises(openai.NotFoundError):
        ai.responses.retrieve("resp_garbage")


def test_responses_input_that_resends_earlier_turns_continues_their_conversation(served):
    state, keys, db, _ = served
    ai = client(state["server"], keys["alice"])
    first = ai.responses.create(model="cogency", input="my name is Grace")
    conversation = first.metadata["conversation_id"]
    again = ai.responses.create(model="cogency", input=[
        {"role": "user", "content": "my name is Grace"},
        {"type": "message", "role": "assistant", "id": first.output[0].id, "status": "completed",
         "content": [{"type": "output_text", "text": first.output_text, "annotations": []}]},
        {"role": "user", "content": "recall"}])
    assert again.output_text == "you said: my name is Grace"
    assert again.metadata["conversation_id"] == conversation
    assert [content for _, role, content in messages(db, conversation) if role == "user"] == [
        "my name is Grace", "recall"]
