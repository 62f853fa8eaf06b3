"""Whatever a learning model replies, the profile stays within its bounds and stays storable."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from memory_replies import consolidate_into, learn_into

from cogency.memory import Profile
from cogency.memory.profile import (
    _LIST_BOUNDS,
    _MAP_BOUNDS,
    MAX_TEXT,
    SYNTHESIS_FIELDS,
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=12) | st.just("x" * 600)
)
json_values = (
    scalars
    | st.lists(scalars | st.lists(scalars, max_size=3), max_size=30)
    | st.dictionaries(st.text(max_size=12), scalars, max_size=30)
    | st.lists(st.fixed_dictionaries({"key": scalars, "value": scalars}), max_size=25)
)
insight_keys = st.sampled_from([
    "preferences", "goals", "expertise", "communication_style", "project_context",
    "interests", "constraints", "success_pattern", "failure_pattern", *SYNTHESIS_FIELDS,
])
replies = st.dictionaries(insight_keys, json_values, max_size=12) | json_values


def _assert_bounded(profile: Profile) -> None:
    for name, bound in {**_LIST_BOUNDS, **_MAP_BOUNDS}.items():
        value = getattr(profile, name)
        assert isinstance(value, list if name in _LIST_BOUNDS else dict)
        assert len(value) <= bound, name
        texts = value if isinstance(value, list) else [*value, *value.values()]
        assert all(isinstance(t, str) and 0 < len(t) <= MAX_TEXT for t in texts)
    assert isinstance(profile.communication_style, str)
    assert len(profile.communication_style) <= MAX_TEXT


@settings(max_examples=60, deadline=None)
@given(st.lists(replies, min_size=1, max_size=3), replies)
def test_any_reply_leaves_a_bounded_storable_profile(extractions, synthesis) -> None:
    profile = Profile("alice")
    for reply in extractions:
        learn_into(profile, reply)
        _assert_bounded(profile)
    version = profile.synthesis_version
    used = consolidate_into(profile, synthesis)
    assert profile.synthesis_version == version + (1 if used else 0)
    _assert_bounded(profile)
    assert profile.interaction_count == len(extractions)
    stored = json.loads(json.dumps(profile.to_dict()))
    assert Profile.from_dict(stored) == profile


def test_newest_entries_survive_the_bounds() -> None:
    profile = Profile("alice")
    learn_into(profile, {"goals": [f"g{i}" for i in range(50)]})
    learn_into(profile, {"goals": ["g45"]})  # re-mentioned: now the newest
    assert profile.goals == [*(f"g{i}" for i in range(40, 50) if i != 45), "g45"]
