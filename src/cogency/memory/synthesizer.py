"""Learning a user from their interactions: one LLM call per interaction, a second every few.

The v1.0 ``ImpressionSynthesizer``: extraction turns one interaction into insights that
:meth:`Profile.update_from_interaction` applies within the bounds; every
``synthesis_threshold`` interactions a consolidation call rewrites the learned fields so that
newer facts replace contradicting older ones. Model calls happen outside any transaction; each
write is one atomic read-modify-write through :meth:`Store.update_profile`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from .. import _telemetry
from .._fence import DATA_NOTE, fence
from ..errors import ConflictError, ForgottenError, InvalidResponseError, UsageError
from ..tokens import truncate_tokens
from .profile import MAX_TEXT, Profile

if TYPE_CHECKING:
    from ..llm.base import LLM
    from ..storage.base import Store

logger = logging.getLogger("cogency.memory")

EXCERPT_TOKENS = 1500
"""Bound on the conversation excerpt an extraction call sees."""

_TEXT = {"type": "string", "maxLength": MAX_TEXT}
_TEXTS = {"type": "array", "items": _TEXT, "maxItems": 20}
# Maps travel as lists of {key, value} pairs: strict structured-output modes (OpenAI's) accept
# no free-form objects. Replies with plain objects are read too.
_PAIRS = {
    "type": "array",
    "maxItems": 20,
    "items": {
        "type": "object",
        "properties": {"key": _TEXT, "value": _TEXT},
        "required": ["key", "value"],
        "additionalProperties": False,
    },
}


def _strict(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


INSIGHT_SCHEMA = _strict({
    "preferences": _PAIRS,
    "goals": _TEXTS,
    "expertise": _TEXTS,
    "communication_style": _TEXT,
    "project_context": _PAIRS,
    "interests": _TEXTS,
    "constraints": _TEXTS,
    "success_pattern": _TEXT,
    "failure_pattern": _TEXT,
})
"""JSON schema of an extraction reply (the v1.0 insight keys)."""

SYNTHESIS_SCHEMA = _strict({
    "preferences": _PAIRS,
    "goals": _TEXTS,
    "expertise_areas": _TEXTS,
    "communication_style": _TEXT,
    "projects": _PAIRS,
    "interests": _TEXTS,
    "constraints": _TEXTS,
    "success_patterns": _TEXTS,
    "failure_patterns": _TEXTS,
})
"""JSON schema of a consolidation reply (the profile's learned fields)."""

_MAP_KEYS = ("preferences", "project_context", "projects")

EXTRACT_PROMPT = """You learn about a user from their interactions with an AI agent, so that \
future answers fit them. Extract only what this interaction shows about the user; leave a \
field empty ("" or []) when it shows nothing. Never invent, never copy these instructions.

Fields: "preferences" (settings they want, as key/value pairs), "goals" (what they are trying \
to achieve), "expertise" (areas they know well), "communication_style" (how they like answers: \
concise, detailed, technical…), "project_context" (their projects, as name/description pairs), \
"interests", "constraints" (limits they work under), "success_pattern" (what worked for them), \
"failure_pattern" (what did not). Pairs are objects with "key" and "value".

The two blocks below are quoted {note}. The profile block holds what was learned about \
the user before; the interaction block is the interaction to learn from.

<profile>
{known}
</profile>

<interaction>
Query: {query}
Success: {success}
Final response: {response}
Conversation of the task:
{conversation}
</interaction>

Reply with exactly one JSON object with these fields (all empty here):
{{"preferences": [], "goals": [], "expertise": [], "communication_style": "", \
"project_context": [], "interests": [], "constraints": [], "success_pattern": "", \
"failure_pattern": ""}}"""

SYNTHESIZE_PROMPT = """You consolidate what an AI agent has learned about one user into a \
coherent, current profile. In the profile below every list and every set of pairs runs from \
oldest to newest. Merge duplicates, keep what still holds, and where two entries contradict \
each other keep only the newer one (a user who "prefers Python" and later "switched to Rust" \
now uses Rust). Drop what is stale. Keep it short; never invent.

The profile block below is quoted {note}.

<profile>
{profile}
</profile>

Reply with exactly one JSON object holding the whole consolidated profile, with these fields \
(pairs are objects with "key" and "value"):
{{"preferences": [], "goals": [], "expertise_areas": [], "communication_style": "", \
"projects": [], "interests": [], "constraints": [], "success_patterns": [], \
"failure_patterns": []}}"""


class _Superseded(ConflictError):
    """Raised inside a profile transaction to abandon a write that no longer applies.

    A Cogency error, so stores roll back and pass it through unchanged.
    """


class ImpressionSynthesizer:
    """Learns a user's profile with ``llm`` and keeps it in ``store``.

    :meth:`update_impression` raises when the extraction call fails or replies with no JSON
    object, and then nothing is written: the caller decides whether to retry (the agent's
    background learning retries and logs; it never lets a learning failure reach a run).
    """

    def __init__(self, llm: LLM, store: Store, synthesis_threshold: int = 3) -> None:
        if not isinstance(synthesis_threshold, int) or synthesis_threshold < 1:
            raise UsageError("synthesis_threshold must be a positive integer")
        self.llm = llm
        self.store = store
        self.synthesis_threshold = synthesis_threshold

    async def update_impression(
        self, user_id: str, interaction: dict[str, Any], *, generation: int | None = None
    ) -> Profile:
        """Learn from one interaction (``query``, ``response``, ``success``, ``conversation``).

        Returns the saved profile. ``generation`` is the user's generation when the interaction
        began (read now when not given); every write checks it inside its transaction, so if
        the user was forgotten meanwhile nothing is written and
        :class:`~cogency.errors.ForgottenError` is raised (before any model call when the
        forget is already visible). A failed extraction (the model raised, or replied without
        a JSON object: :class:`~cogency.errors.InvalidResponseError`) raises with nothing
        written, so retrying is safe. A failed consolidation is logged and stays owed; the
        insights are kept.
        """
        current = await self.store.user_generation(user_id)
        if generation is None:
            generation = current
        elif generation != current:
            raise ForgottenError(user_id)
        known = await self.store.load_profile(user_id)
        insights = await self.extract(interaction, known)
        profile = await self.store.update_profile(
            user_id, lambda profile: profile.update_from_interaction(insights),
            generation=generation,
        )
        if not self.synthesis_due(profile):
            return profile
        try:
            return await self.synthesize(user_id, profile, generation=generation)
        except ForgottenError:
            raise
        except Exception as exc:
            # The insights are saved; raising would invite a retry that applies them twice.
            # The consolidation stays owed (see synthesis_due) and the next interaction makes it.
            logger.warning(
                "consolidating the profile of user %r failed; it is retried with their next "
                "interaction: %s: %s", user_id, type(exc).__name__, exc,
            )
            return profile

    def synthesis_due(self, profile: Profile) -> bool:
        """Whether consolidation is owed: one per ``synthesis_threshold`` interactions.

        Counted from the stored profile (``synthesis_version`` starts at 1), so a consolidation
        that failed is made up by the next interaction, in this process or another.
        """
        owed = profile.interaction_count // self.synthesis_threshold
        return profile.synthesis_version - 1 < owed

    async def extract(self, interaction: dict[str, Any], known: Profile | None = None) -> dict:
        """One model call: the insights an interaction shows, in the v1.0 shape."""
        prompt = EXTRACT_PROMPT.format(
            note=DATA_NOTE,
            known=fence((known.compress() if known is not None else "") or "(nothing yet)"),
            query=fence(_field(interaction, "query")),
            success=bool(interaction.get("success", True)),
            response=fence(_field(interaction, "response")),
            conversation=fence(
                truncate_tokens(_field(interaction, "conversation"), EXCERPT_TOKENS)
            ),
        )
        return await self._ask(prompt, INSIGHT_SCHEMA, "extraction")

    async def synthesize(
        self, user_id: str, profile: Profile, *, generation: int | None = None
    ) -> Profile:
        """One model call that consolidates ``profile``; saved unless it changed meanwhile.

        If another writer added insights since ``profile`` was read, the consolidation (made
        without them) is dropped rather than allowed to erase them; it stays owed.
        ``generation`` is as in :meth:`update_impression`.
        """
        seen = profile.interaction_count
        prompt = SYNTHESIZE_PROMPT.format(
            note=DATA_NOTE,
            profile=fence(json.dumps(profile.learned(), ensure_ascii=False, indent=1)),
        )
        synthesis = await self._ask(prompt, SYNTHESIS_SCHEMA, "consolidation")

        def apply(current: Profile) -> None:
            if current.interaction_count != seen:
                raise _Superseded
            if not current.apply_synthesis(synthesis):
                raise InvalidResponseError("the consolidation reply holds no usable field")

        try:
            return await self.store.update_profile(user_id, apply, generation=generation)
        except _Superseded:
            return await self.store.load_profile(user_id) or profile

    async def _ask(self, prompt: str, schema: dict[str, Any], phase: str) -> dict[str, Any]:
        completion = await _telemetry.learn(
            self.llm, [{"role": "user", "content": prompt}], schema, phase
        )
        # Imported here: cogency.reason imports the state, which imports this package.
        from ..reason import extract_json

        data = extract_json(completion.text)
        return {key: _unpair(value) if key in _MAP_KEYS else value for key, value in data.items()}


def _field(interaction: dict[str, Any], key: str) -> str:
    value = interaction.get(key)
    return "" if value is None else str(value)


def _unpair(value: Any) -> Any:
    """``[{"key": k, "value": v}, …]`` as ``{k: v, …}``; anything else unchanged."""
    if not isinstance(value, list):
        return value
    pairs = {}
    for item in value:
        if isinstance(item, dict):
            key, text = item.get("key"), item.get("value")
        elif isinstance(item, list) and len(item) == 2:
            key, text = item
        else:
            continue  # malformed entries are skipped, like every malformed insight
        if isinstance(key, (str, int, float)):
            pairs[str(key)] = text
    return pairs


__all__ = ["INSIGHT_SCHEMA", "SYNTHESIS_SCHEMA", "ImpressionSynthesizer"]
