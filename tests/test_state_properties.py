"""Property tests: every stored part of the state survives JSON and the database unchanged.

Profile, Workspace and Conversation through their ``to_dict``/``from_dict`` and the storage
JSON codec; workspaces, profiles and messages through the SQLite store and back (checked on
the rows too). Text is arbitrary unicode without surrogates (which UTF-8 cannot hold),
including NUL and other control characters, and sometimes large; datetimes are
timezone-aware with arbitrary offsets and zones. (Execution is never stored.)
"""

from __future__ import annotations

import json
import unicodedata
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cogency._json import dumps, loads
from cogency.memory import Profile
from cogency.memory.profile import _LIST_BOUNDS, _MAP_BOUNDS
from cogency.state import Conversation, State, Workspace, add_message, autosave

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
STORE_SETTINGS = settings(
    max_examples=30, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.text()  # any code point but surrogates: NUL, controls, astral planes included
large_texts = st.builds(lambda piece, times: piece * times, st.text(min_size=1, max_size=12),
                        st.integers(1_000, 10_000))
any_text = st.one_of(texts, texts, texts, large_texts)  # a large string now and then
ids = st.text(  # valid ids: NFKC, no controls or invisible format characters (check_id)
    st.characters(min_codepoint=33, exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp")),
    min_size=1, max_size=40,
).map(lambda text: unicodedata.normalize("NFKC", text)).filter(lambda text: text.strip() and len(text) <= 256)

# Whole-second offsets: real zones have nothing finer (historical LMT offsets have seconds),
# and Python 3.11's fromisoformat drops a fractional-second offset.
fixed_offsets = st.builds(
    lambda seconds: timezone(timedelta(seconds=seconds)), st.integers(-86_399, 86_399)
)
aware_datetimes = st.datetimes(timezones=st.one_of(fixed_offsets, st.timezones()))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


def same_moment_and_offset(a: datetime, b: datetime) -> bool:
    # Aware datetimes in a DST fold or gap never compare equal across zones (PEP 495), so
    # compare what is stored: the wall time and the offset.
    return a.isoformat() == b.isoformat() and a.utcoffset() == b.utcoffset()


@st.composite
def profiles(draw: st.DrawFn, user_id: st.SearchStrategy[str] = texts) -> Profile:
    values: dict[str, Any] = {
        name: draw(st.lists(texts, max_size=bound)) for name, bound in _LIST_BOUNDS.items()
    }
    if values["goals"]:
        values["goals"][-1] = draw(any_text)
    values["preferences"] = draw(st.dictionaries(texts, json_values,
                                                 max_size=_MAP_BOUNDS["preferences"]))
    values["projects"] = draw(st.dictionaries(texts, texts, max_size=_MAP_BOUNDS["projects"]))
    return Profile(
        user_id=draw(user_id),
        communication_style=draw(any_text),
        created_at=draw(aware_datetimes),
        last_updated=draw(aware_datetimes),
        interaction_count=draw(st.integers(0, 2**31)),
        synthesis_version=draw(st.integers(1, 1000)),
        **values,
    )


def assert_same_profile(loaded: Profile, original: Profile) -> None:
    for name in ("created_at", "last_updated"):
        assert same_moment_and_offset(getattr(loaded, name), getattr(original, name))
    moments = {"created_at": None, "last_updated": None}
    assert {**vars(loaded), **moments} == {**vars(original), **moments}


workspaces = st.builds(Workspace, any_text, any_text, any_text, any_text)


# -- pure JSON round trips ----------------------------------------------------------------------


@SETTINGS
@given(profiles())
def test_profile_json_round_trip(profile: Profile) -> None:
    text = dumps(profile.to_dict())
    assert isinstance(json.loads(text), dict)  # plain JSON: no pickle, no custom types
    assert_same_profile(Profile.from_dict(loads(text)), profile)


@SETTINGS
@given(profiles(), st.dictionaries(st.sampled_from(sorted(_LIST_BOUNDS)),
                                    st.lists(texts, min_size=0, max_size=25)))
def test_profile_collections_stay_bounded_keeping_the_newest(profile, overfull) -> None:
    for name, items in overfull.items():
        setattr(profile, name, items)
    loaded = Profile.from_dict(loads(dumps(profile.to_dict())))
    for name, items in overfull.items():
        assert getattr(loaded, name) == items[-_LIST_BOUNDS[name]:]


@SETTINGS
@given(workspaces)
def test_workspace_json_round_trip(workspace: Workspace) -> None:
    assert Workspace.from_dict(loads(dumps(workspace.to_dict()))) == workspace


@SETTINGS
@given(ids, ids, aware_datetimes)
def test_conversation_json_round_trip(conversation_id, user_id, created_at) -> None:
    conversation = Conversation(conversation_id=conversation_id, user_id=user_id,
                                created_at=created_at)
    loaded = Conversation.from_dict(loads(dumps(conversation.to_dict())))
    assert (loaded.conversation_id, loaded.user_id) == (conversation_id, user_id)
    assert same_moment_and_offset(loaded.created_at, created_at)
    assert loaded.messages == []


@SETTINGS
@given(json_values)
def test_storage_json_codec_round_trip(value: Any) -> None:
    assert loads(dumps(value)) == value


# -- through the store ------------------------------------------------------------------------


@STORE_SETTINGS
@given(query=any_text, workspace=workspaces, user_id=ids)
async def test_workspace_round_trips_through_the_store(store, db, query, workspace, user_id):
    state = await State.start_task(query, user_id, store=store)
    assert state.workspace.objective == query
    state.workspace = Workspace(**workspace.to_dict())
    await autosave(state)

    resumed = await State.continue_task(state.task_id, user_id, store=store)
    assert resumed.workspace == workspace
    assert resumed.query == query
    (data,) = db.execute(
        "SELECT workspace_data FROM task_workspaces WHERE task_id = ?", (state.task_id,)
    ).fetchone()
    assert json.loads(data) == workspace.to_dict()


@STORE_SETTINGS
@given(profile=profiles(user_id=ids))
async def test_profile_round_trips_through_the_store(store, db, profile):
    state = await State.start_task("q", profile.user_id, store=store)
    await state.complete_task(profile)
    assert_same_profile(await store.load_profile(profile.user_id), profile)
    (data,) = db.execute(
        "SELECT profile_data FROM user_profiles WHERE user_id = ?", (profile.user_id,)
    ).fetchone()
    assert json.loads(data) == profile.to_dict()


messages = st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]),
                              any_text), min_size=1, max_size=8)


@STORE_SETTINGS
@given(first=messages, second=messages, user_id=ids)
async def test_messages_round_trip_through_the_store(store, db, first, second, user_id):
    conversation_id = str(uuid.uuid4())
    state = await State.start_task("q", user_id, conversation_id, store=store)
    for role, content in first:
        add_message(state, role, content)
    await autosave(state)
    for role, content in second:
        add_message(state, role, content)
    await state.complete_task()

    everything = first + second
    rows = db.execute(
        "SELECT seq, role, content FROM conversation_messages WHERE conversation_id = ? "
        "ORDER BY seq", (conversation_id,),
    ).fetchall()
    assert rows == [(i + 1, role, content) for i, (role, content) in enumerate(everything)]
    later = await State.start_task("next", user_id, conversation_id, store=store,
                                   history_tokens=10**9)
    assert [(m["role"], m["content"]) for m in later.execution.messages] == everything


async def test_the_ids_a_turn_makes_are_random_version_4_uuids():
    """Task and conversation ids are UUID4 text as ``str(uuid.uuid4())`` writes it; runners
    and message ids carry 128 random bits in hexadecimal; none repeats."""
    from cogency import Agent
    from cogency.testing import ScriptedLLM

    tasks, conversations, messages = set(), set(), set()
    async with Agent(ScriptedLLM([{"response": "ok"}] * 40), store=":memory:") as agent:
        for _ in range(40):
            result = await agent.run("hello", "alice")
            tasks.add(result.task_id)
            conversations.add(result.conversation_id)
            stored = await agent.store.load_messages(result.conversation_id, "alice", limit=10)
            messages.update(m["id"] for m in stored)
    assert len(tasks) == len(conversations) == 40 and len(messages) == 80
    for text in tasks | conversations:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    assert all(len(m) == 32 and int(m, 16) >= 0 for m in messages)
    # Every variant digit appears: the two random bits under the variant are not fixed.
    assert {text[19] for text in tasks | conversations} == set("89ab")
