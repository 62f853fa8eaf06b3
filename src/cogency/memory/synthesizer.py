"""Learning a user from their interactions: one LLM call per batch of interactions, a second
every few.

The v1.0 ``ImpressionSynthesizer``: extraction turns interactions into insights that a
:class:`~cogency.memory.entries.ProfileBook` applies as entries citing their sources (the
tasks and messages they came from) within the bounds; every ``synthesis_threshold``
interactions a consolidation call rewrites the learned fields so that newer facts replace
contradicting older ones (the user's own entries stay as they are). Model calls happen outside
any transaction; each write is one atomic change through :meth:`Store.change_profile`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from collections.abc import Sequence

from .. import _telemetry
from .._fence import DATA_NOTE, fence
from ..errors import ConflictError, ForgottenError, InvalidResponseError, UsageError
from ..tokens import truncate_tokens
from .entries import ProfileBook, ProfileEntry, source_of
from .profile import _MAP_BOUNDS, MAX_TEXT, SYNTHESIS_FIELDS, Profile

if TYPE_CHECKING:
    from ..llm.base import LLM
    from ..storage.base import LearningClaim, Store

logger = logging.getLogger("cogency.memory")

EXCERPT_TOKENS = 1500
"""Bound on the conversation excerpt an extraction call sees (shared by the interactions it
learns together, each at least :data:`MIN_EXCERPT_TOKENS`)."""
MIN_EXCERPT_TOKENS = 100

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

EXTRACT_PROMPT = """You learn about a user from their interactions with an AI agent, so that \
future answers fit them. Extract only what this interaction shows about the user; leave a \
field empty ("" or []) when it shows nothing. Never invent, never copy these instructions.

Fields: "preferences" (settings they want, as key/value pairs), "goals" (what they are trying \
to achieve), "expertise" (areas they know well), "communication_style" (how they like answers: \
concise, detailed, technical…), "project_context" (their projects, as name/description pairs), \
"interests", "constraints" (limits they work under), "success_pattern" (what worked for them), \
"failure_pattern" (what did not). Pairs are objects with "key" and "value".

{blocks}

<profile>
{known}
</profile>

{interactions}

Reply with exactly one JSON object with these fields (all empty here):
{{"preferences": [], "goals": [], "expertise": [], "communication_style": "", \
"project_context": [], "interests": [], "constraints": [], "success_pattern": "", \
"failure_pattern": ""}}"""

ONE_INTERACTION = (
    "The two blocks below are quoted {note}. The profile block holds what was learned about "
    "the user before; the interaction block is the interaction to learn from."
)
SEVERAL_INTERACTIONS = (
    "The blocks below are quoted {note}. The profile block holds what was learned about the "
    "user before; the {count} interaction blocks are the interactions to learn from, oldest "
    "first (where they disagree, the newer one holds)."
)
INTERACTION_BLOCK = """<interaction>
Query: {query}
Success: {success}
Final response: {response}
Conversation of the task:
{conversation}
</interaction>"""

SYNTHESIZE_PROMPT = """You consolidate what an AI agent has learned about one user into a \
coherent, current profile. In the profile below every list and every set of pairs runs from \
oldest to newest. Merge duplicates, keep what still holds, and where two entries contradict \
each other keep only the newer one (a user who "prefers Python" and later "switched to Rust" \
now uses Rust). Drop what is stale. Keep it short; never invent.

The profile block below is quoted {note}.{mine}

<profile>
{profile}
</profile>

Reply with exactly one JSON object holding the whole consolidated profile, with these fields \
(pairs are objects with "key" and "value"):
{{"preferences": [], "goals": [], "expertise_areas": [], "communication_style": "", \
"projects": [], "interests": [], "constraints": [], "success_patterns": [], \
"failure_patterns": []}}"""

USER_SET = (
    " Its \"set_by_user\" part holds what the user set themselves: it stays as it is (leave "
    "it out of your reply), and learned entries that contradict it are dropped."
)


class _Superseded(ConflictError):
    """Raised inside a profile transaction to abandon a write that no longer applies.

    A Cogency error, so stores roll back and pass it through unchanged.
    """


class ImpressionSynthesizer:
    """Learns a user's profile with ``llm`` and keeps it in ``store``.

    :meth:`update_impression` raises when the extraction call fails or replies with no JSON
    object, and then nothing is written: the caller decides whether to retry (the agent's
    background learning retries, then keeps the tasks queued; it never lets a learning
    failure reach a run).
    """

    def __init__(self, llm: LLM, store: Store, synthesis_threshold: int = 3) -> None:
        if not isinstance(synthesis_threshold, int) or synthesis_threshold < 1:
            raise UsageError("synthesis_threshold must be a positive integer")
        self.llm = llm
        self.store = store
        self.synthesis_threshold = synthesis_threshold

    @property
    def model(self) -> str:
        """The name recorded as the model that learned an entry."""
        return str(getattr(self.llm, "name", "") or type(self.llm).__name__)[:300]

    async def update_impression(
        self, user_id: str, interaction: dict[str, Any], *, generation: int | None = None
    ) -> Profile:
        """Learn from one interaction (``query``, ``response``, ``success``, ``conversation``;
        ``task_id``, ``conversation_id`` and ``message_ids`` become the entries' source).

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
        return await self.learn(user_id, [interaction], generation=generation)

    async def learn(
        self, user_id: str, interactions: Sequence[dict[str, Any]], *,
        generation: int | None = None, claim: LearningClaim | None = None,
    ) -> Profile:
        """Learn from ``interactions`` together (one extraction call; none for none), then
        consolidate when due. With ``claim``, its tasks leave the learning queue in the
        transaction that stores what was learned (``ClaimLostError`` and nothing stored if
        the claim was taken over). Its spans link to the runs of the interactions (their
        ``trace``)."""
        with _telemetry.learning(interactions):  # not part of any run: linked to them
            return await self._learn(user_id, interactions, generation, claim)

    async def _learn(
        self, user_id: str, interactions: Sequence[dict[str, Any]],
        generation: int | None, claim: LearningClaim | None,
    ) -> Profile:
        known = await self.store.load_profile(user_id)
        insights = await self.extract(list(interactions), known) if interactions else {}
        sources = [_source(item, self.model) for item in interactions]
        count = len(interactions)
        book = await self.store.change_profile(
            user_id, lambda book: book.learn(insights, sources, self.model, interactions=count),
            generation=generation, claim=claim,
        )
        profile = book.profile
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

    async def extract(
        self, interaction: dict[str, Any] | Sequence[dict[str, Any]],
        known: Profile | None = None,
    ) -> dict[str, Any]:
        """One model call: the insights that one interaction (or several, learned together)
        shows, in the v1.0 shape."""
        items = [interaction] if isinstance(interaction, dict) else list(interaction)
        if len(items) == 1:
            blocks = ONE_INTERACTION.format(note=DATA_NOTE)
        else:
            blocks = SEVERAL_INTERACTIONS.format(note=DATA_NOTE, count=len(items))
        share = max(EXCERPT_TOKENS // len(items), MIN_EXCERPT_TOKENS)
        prompt = EXTRACT_PROMPT.format(
            note=DATA_NOTE,
            blocks=blocks,
            known=fence((known.compress() if known is not None else "") or "(nothing yet)"),
            interactions="\n\n".join(
                INTERACTION_BLOCK.format(
                    query=fence(truncate_tokens(_field(item, "query"), share)),
                    success=bool(item.get("success", True)),
                    response=fence(truncate_tokens(_field(item, "response"), share)),
                    conversation=fence(truncate_tokens(_field(item, "conversation"), share)),
                )
                for item in items
            ),
        )
        return await self._ask(prompt, INSIGHT_SCHEMA, "extraction")

    async def synthesize(
        self, user_id: str, profile: Profile, *, generation: int | None = None
    ) -> Profile:
        """One model call that consolidates ``profile``; saved unless it changed meanwhile.

        If another writer added insights (or consolidated) since ``profile`` was read, the
        consolidation is dropped rather than allowed to erase them; it stays owed.
        ``generation`` is as in :meth:`update_impression`. The user's own entries are shown
        apart and kept whatever the reply says.
        """
        seen = (profile.interaction_count, profile.synthesis_version)
        learned, mine = split_fields(await self.store.load_entries(user_id), profile)
        shown: dict[str, Any] = dict(learned)
        if mine:
            shown["set_by_user"] = mine
        prompt = SYNTHESIZE_PROMPT.format(
            note=DATA_NOTE,
            mine=USER_SET if mine else "",
            profile=fence(json.dumps(shown, ensure_ascii=False, indent=1)),
        )
        synthesis = await self._ask(prompt, SYNTHESIS_SCHEMA, "consolidation")

        def apply(book: ProfileBook) -> None:
            if (book.profile.interaction_count, book.profile.synthesis_version) != seen:
                raise _Superseded
            if not book.consolidate(synthesis, self.model):
                raise InvalidResponseError("the consolidation reply holds no usable field")

        try:
            book = await self.store.change_profile(user_id, apply, generation=generation)
        except _Superseded:
            return await self.store.load_profile(user_id) or profile
        return book.profile

    async def _ask(self, prompt: str, schema: dict[str, Any], phase: str) -> dict[str, Any]:
        completion = await _telemetry.learn(
            self.llm, [{"role": "user", "content": prompt}], schema, phase
        )
        # Imported here: cogency.reason imports the state, which imports this package.
        from ..reason import extract_json

        return extract_json(completion.text)


def split_fields(entries: Sequence[ProfileEntry], profile: Profile
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The learned fields as consolidation sees them (``profile.learned()``'s shape, without
    the user's entries), and the user's entries by field (only fields that have some)."""
    mine: dict[str, Any] = {}
    for entry in entries:
        if entry.origin != "user":
            continue
        if entry.field in _MAP_BOUNDS:
            mine.setdefault(entry.field, {})[entry.key] = entry.value
        elif entry.field == "communication_style":
            mine[entry.field] = entry.value
        else:
            mine.setdefault(entry.field, []).append(entry.value)
    learned = profile.learned()
    if not mine:
        return learned, mine
    for name in SYNTHESIS_FIELDS:
        theirs = mine.get(name)
        value = learned[name]
        if theirs is None:
            continue
        if isinstance(value, dict):
            learned[name] = {k: v for k, v in value.items() if k not in theirs}
        elif isinstance(value, list):
            learned[name] = [v for v in value if v not in theirs]
        else:
            learned[name] = ""
    return learned, mine


def _source(interaction: dict[str, Any], model: str) -> dict[str, Any]:
    ids = interaction.get("message_ids")
    return source_of(
        _id(interaction.get("task_id")), _id(interaction.get("conversation_id")),
        [str(i)[:256] for i in ids] if isinstance(ids, list) else [], model,
    )


def _id(value: Any) -> str | None:
    return value[:256] if isinstance(value, str) and value else None


def _field(interaction: dict[str, Any], key: str) -> str:
    value = interaction.get(key)
    return "" if value is None else str(value)


__all__ = ["INSIGHT_SCHEMA", "SYNTHESIS_SCHEMA", "ImpressionSynthesizer"]
