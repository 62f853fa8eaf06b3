"""Hostile input: the reply parser, the tool argument validator and the stores, fuzzed.

Only Cogency's own errors (``CogencyError``) may come out. CI runs about 5k cases in all;
``COGENCY_FUZZ_SCALE=10`` gives the published full run (50k cases; docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cogency import tool
from cogency.errors import CogencyError
from cogency.memory import Profile
from cogency.reason import extract_json, parse_step
from cogency.state import State, add_message, autosave
from cogency.storage import SQLiteStore

SCALE = float(os.environ.get("COGENCY_FUZZ_SCALE", "1"))


def _settings(examples: int):
    return settings(
        max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
        suppress_health_check=list(HealthCheck),
    )


# -- strategies ------------------------------------------------------------------------------

# Every code point, lone surrogates and NUL included.
any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
nasty_text = st.one_of(
    st.text(any_char, max_size=30),
    st.sampled_from(["", "\x00", "\ud800", "\udfff", "a\x00b", "\ufeff{}", "'", '"', "\\", "{",
                     "}", "```", "null", "NaN", "-Infinity", "1e999", "\u202e", "💥" * 3]),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "{", "[", "\ud800", "é"]),
              st.integers(1000, 100_000)),
)
small_text = st.one_of(st.text(any_char, max_size=12), st.sampled_from(["\x00", "\ud800", "{", '"']))
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), small_text,
)
# Huge strings come at the top (nasty_text); inside structures they only slow generation.
json_values = st.one_of(nasty_text, st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(small_text, inner, max_size=4)),
    max_leaves=8,
))
python_junk = st.one_of(
    st.binary(max_size=20), st.sets(st.integers(), max_size=3), st.tuples(st.integers()),
    st.just(object()), st.just(b"\x00"), st.just(math.nan), st.just(print), st.complex_numbers(),
)


def _deep(depth: int, leaf: Any = 1, kind: str = "list") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


deep_values = st.builds(_deep, st.integers(50, 2_500), json_scalars, st.sampled_from(["list", "dict"]))
anything = st.one_of(json_values, python_junk, deep_values)


def _contract_reply(draw_value: Any) -> str:
    return json.dumps(draw_value, ensure_ascii=False, default=str)


shallow = st.one_of(json_values, python_junk)
reply_objects = st.fixed_dictionaries(
    {},
    optional={
        "secure": shallow, "objective": shallow, "understanding": shallow,
        "approach": shallow, "discoveries": shallow, "response": shallow,
        "actions": st.one_of(shallow, st.lists(st.fixed_dictionaries(
            {"name": st.one_of(st.sampled_from(["lookup", "nested", "choose"]), shallow)},
            optional={"args": st.one_of(shallow, st.dictionaries(
                st.sampled_from(["q", "n", "items", "table", "mode", "color", "extra"]), shallow,
                max_size=4))},
        ), max_size=20)),
    },
)


@st.composite
def replies(draw: st.DrawFn) -> str:
    """A model reply: raw junk, a JSON object with hostile fields, wrapped in prose or fences."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(nasty_text)
    if kind == 5:  # deeply nested, valid or not
        depth = draw(st.integers(100, 50_000))
        return '{"actions": [{"name": "nested", "args": {"items": ' + "[" * depth + "]" * depth + "}}]}"
    body = json.dumps(draw(reply_objects), ensure_ascii=draw(st.booleans()), default=str)
    if kind == 2:
        body = f"Sure! Here it is:\n```json\n{body}\n```\nanything else?"
    elif kind == 3:
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.sampled_from(["", ",}", ",]}", "}}}}", "\x00"]))
    elif kind == 4:
        body = "{" * draw(st.integers(1, 20_000)) + body
    return body


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def lookup(q: str, n: int = 3, scale: float = 1.0, exact: bool | None = None) -> str:
    """Look something up."""
    return q


@tool
def nested(items: list[list[str]], table: dict[str, float]) -> str:
    """Take nested arguments."""
    return "ok"


@tool
def choose(mode: Literal["a", "b"], color: Color, extra: list[int] | None = None) -> str:
    """Choose."""
    return "ok"


TOOLS = {t.name: t for t in (lookup, nested, choose)}


# -- the parser and the validator --------------------------------------------------------------


@_settings(1250)
@given(replies())
def test_the_reply_parser_raises_only_its_own_errors(text: str) -> None:
    try:
        step = parse_step(text, TOOLS)
    except CogencyError:
        return
    # A step that parsed is well formed: strings where strings belong, known tools, valid args.
    assert isinstance(step.secure, bool)
    assert all(isinstance(v, str) for v in step.workspace.values())
    assert step.response is None or isinstance(step.response, str)
    for action in step.actions:
        assert action["name"] in TOOLS
        TOOLS[action["name"]].validate(action["args"])


@_settings(1000)
@given(st.one_of(anything, nasty_text))
def test_extract_json_takes_anything(value: Any) -> None:
    try:
        assert isinstance(extract_json(value), dict)
    except CogencyError:
        pass


@_settings(1500)
@given(st.sampled_from(sorted(TOOLS)), st.one_of(anything, st.dictionaries(
    st.one_of(st.sampled_from(["q", "n", "scale", "exact", "items", "table", "mode", "color",
                               "extra"]), nasty_text, st.integers()), anything, max_size=5)))
def test_the_argument_validator_raises_only_its_own_errors(name: str, args: Any) -> None:
    try:
        checked = TOOLS[name].validate(args)
    except CogencyError:
        return
    assert isinstance(checked, dict)
    json.dumps(checked)  # what passed is plain JSON the tool can take


# -- the stores, through the public API -------------------------------------------------------


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


ids = st.one_of(st.text(any_char, min_size=0, max_size=40), nasty_text,
                st.sampled_from(["alice", "bob"]), python_junk, st.integers())


@_settings(500)
@given(user=ids, conversation=st.one_of(st.none(), ids), query=st.one_of(nasty_text, python_junk),
       contents=st.lists(st.one_of(nasty_text, python_junk), max_size=4),
       roles=st.lists(st.one_of(st.sampled_from(["user", "assistant", "tool"]), nasty_text), max_size=4))
def test_the_store_takes_hostile_ids_and_messages(user, conversation, query, contents, roles) -> None:
    async def scenario(store: SQLiteStore, path: Path) -> None:
        try:
            state = await State.start_task(query, user, conversation, store)
        except CogencyError:
            return
        stored = []
        for role, content in zip(roles, contents):
            try:
                add_message(state, role, content)
                stored.append(content)
            except CogencyError:
                continue
        try:
            await autosave(state)
        except CogencyError:
            return
        again = await State.continue_task(state.task_id, user, store, history_tokens=10**9)
        loaded = [m["content"] for m in again.conversation.messages
                  if m.get("task_id") == state.task_id]
        assert len(loaded) == len(stored)
        for before, after in zip(stored, loaded):
            # Text round-trips exactly; lone surrogates (unstorable as UTF-8) become U+FFFD.
            assert after == before.encode("utf-8", "surrogatepass").decode("utf-8", "replace") or \
                after == before
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        db.close()

    _with_store(scenario)


profile_values = st.one_of(json_scalars, st.lists(nasty_text, max_size=12), python_junk, deep_values,
                          st.dictionaries(small_text, json_scalars, max_size=12))
profile_fields = st.fixed_dictionaries({}, optional={
    name: profile_values for name in (
        "user_id", "preferences", "goals", "expertise_areas", "communication_style", "projects",
        "interests", "constraints", "success_patterns", "failure_patterns", "created_at",
        "last_updated", "interaction_count", "synthesis_version", "unknown_field")
})


@_settings(750)
@given(user=st.one_of(st.sampled_from(["alice"]), ids), data=profile_fields,
       raw=st.one_of(st.none(), nasty_text))
def test_profiles_take_hostile_json(user, data, raw) -> None:
    async def scenario(store: SQLiteStore, path: Path) -> None:
        try:
            Profile.from_dict(data)
        except CogencyError:
            pass

        def apply(profile: Profile) -> None:
            for key, value in data.items():
                if hasattr(profile, key) and key != "user_id":
                    setattr(profile, key, value)

        try:
            await store.update_profile(user, apply)
        except CogencyError:
            pass
        if raw is not None and isinstance(user, str):
            # A corrupt row written by something else is reported, never a crash.
            db = sqlite3.connect(path)
            try:
                db.execute("INSERT OR REPLACE INTO user_profiles (user_id, profile_data) VALUES (?, ?)",
                           (user, raw))
                db.commit()
            except (sqlite3.Error, UnicodeEncodeError):
                pass
            finally:
                db.close()
        try:
            profile = await store.load_profile(user)
        except CogencyError:
            return
        if profile is not None:
            json.dumps(profile.to_dict(), default=str)
            profile.compress()

    _with_store(scenario)


_STORES: dict[str, tuple[SQLiteStore, Path]] = {}


def _with_store(scenario: Any) -> None:
    """Run ``scenario`` on the store of the calling test (one file per test, reused by its
    examples: every example writes under its own random ids)."""
    name = os.environ.get("PYTEST_CURRENT_TEST", "fuzz").split(" ")[0]
    if name not in _STORES:
        path = Path(tempfile.mkdtemp(prefix="cogency-fuzz-")) / "fuzz.db"
        _STORES[name] = (SQLiteStore(path), path)
    store, path = _STORES[name]

    async def main() -> None:
        await store.list_tasks()  # creates the schema for the raw writes
        await scenario(store, path)

    _run(main())
