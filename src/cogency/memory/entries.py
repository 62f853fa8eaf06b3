"""Profile entries: each fact of a profile, where it came from, and what became of it.

A :class:`~cogency.memory.Profile` is the *projection* of its user's current entries: the
prompt and ``profile_data`` see only values. Each value is a :class:`ProfileEntry` row of
``profile_entries`` that also records its sources (the tasks and message ids it was learned
from, when, and with which model), who set it (``learned``, ``consolidated`` or ``user``), and
once it no longer holds, when and why it was superseded (and by which entry). Superseded
entries are history: out of the projection, out of the bounds, kept until the retention
setting prunes them.

A :class:`ProfileBook` changes one user's current entries inside one store transaction and
says what to write: every way a profile changes (learning, consolidation, a user's
correction, a raw :meth:`Store.update_profile` edit) is one of its methods, so the rules live
in one place:

- a learned value for a key (a preference, a project, the communication style) that differs
  from the current one replaces it; the old entry is superseded by the new one;
- an entry set by the user is never replaced, rewritten or dropped by learning or
  consolidation (a contradicting learned value becomes history at once), and comes last (the
  newest, always quoted) in its field;
- consolidation keeps provenance: an entry it writes anew inherits the sources of the entries
  of that field it dropped (what it was merged from);
- a field over its bound loses its oldest learned entries to history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from .. import _time
from .._ids import new_hex
from .._json import dumps
from ..errors import NotFoundError, UsageError
from .profile import _LIST_BOUNDS, _MAP_BOUNDS, MAX_TEXT, SYNTHESIS_FIELDS, Profile, _text

BOUNDS: dict[str, int] = {**_LIST_BOUNDS, **_MAP_BOUNDS, "communication_style": 1}
"""How many current entries each field holds (v1.0 bounds; one communication style)."""
KEYED = (*_MAP_BOUNDS, "communication_style")
"""Fields whose entries are found by key: a new value for a key replaces the old one."""
INSIGHT_FIELDS = {
    "preferences": "preferences", "goals": "goals", "expertise": "expertise_areas",
    "communication_style": "communication_style", "project_context": "projects",
    "interests": "interests", "constraints": "constraints",
    "success_pattern": "success_patterns", "failure_pattern": "failure_patterns",
}
"""The v1.0 insight keys an extraction replies with, and the field each one feeds."""
ORIGINS = ("learned", "consolidated", "user")
REASONS = {
    "replaced": "a newer learned value replaced it",
    "consolidated": "consolidation merged or dropped it",
    "bounds": "newer entries pushed it out of the field's bound",
    "overridden": "learned, but you set this yourself and your entry wins",
    "changed": "you changed it",
    "removed": "you removed it",
    "confirmed": "you set the same value yourself",
    "edited": "the profile was edited without it",
}
"""Why an entry became history (``ProfileEntry.reason``), as shown to people."""
MAX_SOURCES = 50
"""Sources kept per entry: the first and the newest; ``sources_omitted`` counts the rest."""
MAX_SOURCE_MESSAGES = 32
"""Message ids kept per source (the newest of the interaction's excerpt)."""


@dataclass
class ProfileEntry:
    """One fact of a user's profile: ``field`` (a :class:`Profile` field), ``key`` (a
    preference's or project's name; ``""`` elsewhere) and ``value``.

    ``sources`` are dicts with ``task_id``, ``conversation_id``, ``message_ids`` (ids of
    ``conversation_messages`` rows of that user), ``at`` (ISO time learned) and ``model``.
    ``model`` is the model that wrote the value (``None`` when a person did). An entry with
    ``superseded_at`` set is history: ``reason`` (see :data:`REASONS`) and ``superseded_by``
    (the entry that replaced it, if one did) say what became of it.
    """

    entry_id: str
    user_id: str
    field: str
    key: str
    value: str
    origin: str
    sources: list[dict[str, Any]]
    rank: int
    created_at: datetime
    updated_at: datetime
    model: str | None = None
    sources_omitted: int = 0
    superseded_at: datetime | None = None
    superseded_by: str | None = None
    reason: str | None = None

    @property
    def current(self) -> bool:
        return self.superseded_at is None

    def label(self) -> str:
        """``field: value``, or ``field.key: value`` for a keyed entry."""
        name = f"{self.field}.{self.key}" if self.key else self.field
        return f"{name}: {self.value}"

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("created_at", "updated_at", "superseded_at"):
            moment = data[name]
            data[name] = None if moment is None else moment.isoformat()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfileEntry:
        """An entry from :meth:`to_dict`'s shape (an export, a row); ``UsageError`` if malformed."""
        if not isinstance(data, dict):
            raise UsageError("a profile entry must be a JSON object")
        try:
            entry = cls(
                entry_id=_plain(data["entry_id"], "entry_id", 64),
                user_id=_plain(data["user_id"], "user_id", 256),
                field=data["field"], key=data.get("key") or "", value=data["value"],
                origin=data["origin"], sources=list(data.get("sources") or []),
                rank=data["rank"],
                created_at=_time.parse(data["created_at"]),
                updated_at=_time.parse(data["updated_at"]),
                model=data.get("model"),
                sources_omitted=data.get("sources_omitted") or 0,
                superseded_at=(_time.parse(data["superseded_at"])
                               if data.get("superseded_at") else None),
                superseded_by=data.get("superseded_by"),
                reason=data.get("reason"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"a profile entry is malformed ({type(exc).__name__}: {exc})") from exc
        entry.check()
        return entry

    def check(self) -> None:
        """Raise ``UsageError`` unless every column holds what it may."""
        problems = []
        if self.field not in BOUNDS:
            problems.append(f"field {str(self.field)[:40]!r} is not a profile field")
        if not isinstance(self.key, str) or len(self.key) > MAX_TEXT \
                or bool(self.key) != (self.field in _MAP_BOUNDS):
            problems.append("key must be text in preferences and projects, empty elsewhere")
        if not isinstance(self.value, str) or not self.value or len(self.value) > MAX_TEXT:
            problems.append(f"value must be text of 1 to {MAX_TEXT} characters")
        if self.origin not in ORIGINS:
            problems.append(f"origin must be one of {', '.join(ORIGINS)}")
        if not storable_int(self.rank, -2**31):
            problems.append("rank must be an integer")
        if not storable_int(self.sources_omitted, 0):
            problems.append("sources_omitted must be a count")
        if self.model is not None and (not isinstance(self.model, str) or len(self.model) > 300):
            problems.append("model must be a name")
        if self.reason is not None and self.reason not in REASONS:
            problems.append(f"reason must be one of {', '.join(REASONS)}")
        if self.superseded_by is not None and not isinstance(self.superseded_by, str):
            problems.append("superseded_by must be an entry id")
        if len(self.sources) > MAX_SOURCES or not all(_is_source(s) for s in self.sources):
            problems.append(f"sources must be at most {MAX_SOURCES} source objects")
        if problems:
            raise UsageError(f"profile entry {self.entry_id!r}: " + "; ".join(problems))


def source_of(
    task_id: str | None, conversation_id: str | None, message_ids: Iterable[str | None],
    model: str | None, at: datetime | None = None,
) -> dict[str, Any]:
    """A source: the interaction an entry was learned from (its newest message ids kept)."""
    ids = [str(i) for i in message_ids if i][-MAX_SOURCE_MESSAGES:]
    return {"task_id": task_id, "conversation_id": conversation_id, "message_ids": ids,
            "at": (at or _time.now()).isoformat(), "model": model}


def _is_source(value: Any) -> bool:
    return (isinstance(value, dict)
            and all(isinstance(value.get(k), (str, type(None)))
                    for k in ("task_id", "conversation_id", "at", "model"))
            and isinstance(value.get("message_ids", []), list)
            and len(value.get("message_ids", [])) <= MAX_SOURCE_MESSAGES
            and all(isinstance(i, str) and len(i) <= 256 for i in value.get("message_ids", [])))


def storable_int(value: Any, low: int) -> bool:
    """Whether ``value`` is an integer every store can keep (a 32-bit column)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**31


def _plain(value: Any, name: str, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValueError(f"{name} must be a non-empty string of at most {limit} characters")
    return value


class ProfileBook:
    """One user's profile and current entries while one transaction changes them.

    Stores build it from what they read (``profile`` and the current ``entries``), call
    the change, then :meth:`finish` and write :attr:`added` (new rows, with their final
    state) and :attr:`changed` (rows to update: sources, rank, superseded) and the
    projection :attr:`profile`.
    """

    def __init__(self, profile: Profile, entries: Sequence[ProfileEntry] = (), *,
                 now: datetime | None = None) -> None:
        self.profile = profile
        self.now = now or _time.now()
        self._current = {e.entry_id: e for e in entries if e.current}
        self._rank = max((e.rank for e in entries), default=0)
        self.added: list[ProfileEntry] = []
        self.changed: dict[str, ProfileEntry] = {}
        self._new_ids: set[str] = set()
        self._exact: Profile | None = None
        """A raw edit's profile, stored as it was given (see :meth:`edit`)."""

    @classmethod
    def adopt(cls, profile: Profile, *, now: datetime | None = None) -> ProfileBook:
        """A book whose entries are ``profile``'s values (learned, with no sources), in order."""
        book = cls(replace(profile), now=now)
        book._sync(profile)
        return book

    # -- reading ---------------------------------------------------------------------------

    def current(self, field_name: str | None = None) -> list[ProfileEntry]:
        """Current entries (of one field), oldest first; a person's after everything learned."""
        entries = [e for e in self._current.values()
                   if field_name is None or e.field == field_name]
        return sorted(entries, key=lambda e: (e.origin == "user", e.rank))

    def entry(self, entry_id: str) -> ProfileEntry:
        found = self._current.get(entry_id)
        if found is None:
            raise NotFoundError(
                f"no current profile entry {str(entry_id)[:80]!r} for user "
                f"{self.profile.user_id!r} (`cogency profile show --why` lists them)"
            )
        return found

    # -- learning --------------------------------------------------------------------------

    def learn(self, insights: Any, sources: Sequence[dict[str, Any]] = (),
              model: str | None = None, interactions: int = 1) -> None:
        """Apply an extraction reply (v1.0 insight keys) learned from ``interactions``
        interactions, each value citing ``sources``; malformed values are skipped."""
        self._exact = None
        self.profile.interaction_count += interactions
        self.profile.last_updated = self.now
        if not isinstance(insights, dict):
            return
        for key, name in INSIGHT_FIELDS.items():
            value = insights.get(key)
            if key in ("success_pattern", "failure_pattern"):
                value = [value]  # one per interaction (a list here is malformed: skipped)
            for item_key, text in _items(name, value):
                self._learned(name, item_key, text, list(sources), model)

    def _learned(self, name: str, key: str, value: str, sources: list[dict[str, Any]],
                 model: str | None) -> None:
        same = self._find(name, key, None if name in KEYED else value)
        if same is None:
            self._new(name, key, value, "learned", sources, model)
        elif same.value == value:
            if same.origin != "user":  # re-mentioned: now the newest, with one more source
                self._touch(same, sources)
        elif same.origin == "user":
            # The user said otherwise: keep what was learned as history, never current.
            ignored = self._new(name, key, value, "learned", sources, model)
            self._supersede(ignored, "overridden", same)
        else:
            self._supersede(same, "replaced", self._new(name, key, value, "learned",
                                                        sources, model))

    def consolidate(self, synthesis: Any, model: str | None = None) -> bool:
        """Apply a consolidation reply (the learned fields, whole); ``True`` if usable.

        A field with a usable value becomes that value, in that order, except for the
        user's entries, which stay as they are. Entries it keeps stay (same id and
        sources); entries it writes anew inherit the sources of the entries it dropped
        from that field (what they were merged from) and supersede them. Absent, empty or
        malformed fields keep what they hold, so a lazy or broken reply never wipes the
        profile.
        """
        if not isinstance(synthesis, dict):
            return False
        self._exact = None
        usable = False
        for name in SYNTHESIS_FIELDS:
            items = _items(name, synthesis.get(name))
            if items:
                usable = True
                self._consolidate_field(name, items, model)
        if usable:
            self.profile.synthesis_version += 1
            self.profile.last_updated = self.now
        return usable

    def _consolidate_field(self, name: str, items: list[tuple[str, str]],
                           model: str | None) -> None:
        mine = [e for e in self.current(name) if e.origin == "user"]
        before = [e for e in self.current(name) if e.origin != "user"]
        order: list[ProfileEntry] = []
        fresh: list[ProfileEntry] = []
        for key, value in items:
            if any((e.key == key) if name in KEYED else (e.value == value) for e in mine):
                continue  # the user's entry wins
            same = next((e for e in [*before, *fresh] if e.key == key and e.value == value),
                        None)
            if same is None:
                same = self._new(name, key, value, "consolidated", [], model)
                fresh.append(same)
            order.append(same)
        self._in_order(order)  # the reply's order is the field's order
        held = {e.entry_id for e in order}
        dropped = [e for e in before if e.entry_id not in held]
        keys = {key for key, _ in items}
        for new in fresh:
            parents = [e for e in dropped
                       if name not in _MAP_BOUNDS or e.key == new.key or e.key not in keys]
            parents = parents or before  # made from the field as a whole
            new.sources, new.sources_omitted = _merged(
                [], [s for e in parents for s in e.sources],
                sum(e.sources_omitted for e in parents))
        for old in dropped:
            heir = next((n for n in fresh if name in _MAP_BOUNDS and n.key == old.key), None)
            self._supersede(old, "consolidated", heir or (fresh[0] if len(fresh) == 1 else None))

    # -- a person's corrections ------------------------------------------------------------

    def set(self, field_name: str, value: str, key: str | None = None,
            replaces: str | None = None) -> ProfileEntry:
        """Add or change an entry as the user: it wins over learning from now on.

        ``key`` names a preference or project (required there, refused elsewhere);
        ``replaces`` is the id of a current entry of the same field that this one replaces
        (a keyed field's entry of the same key, or the communication style, is replaced
        anyway). Returns the user's entry.
        """
        if field_name not in BOUNDS:
            raise UsageError(f"field must be one of {', '.join(SYNTHESIS_FIELDS)}, "
                             f"not {str(field_name)[:40]!r}")
        text = _user_text(value, "value")
        self._exact = None
        if field_name in _MAP_BOUNDS:
            if key is None:
                raise UsageError(f"{field_name} entries need a key (a name for the value), "
                                 f"e.g. {field_name}.language")
            key = _user_text(key, "key")
        elif key:
            raise UsageError(f"{field_name} entries have no key; give only the value")
        key = key or ""
        old = self.entry(replaces) if replaces is not None else None
        if old is not None and old.field != field_name:
            raise UsageError(f"entry {replaces!r} is a {old.field} entry, not {field_name}")
        same = self._find(field_name, key, None if field_name in KEYED else text)
        if same is not None and same.origin == "user" and same.value == text \
                and old in (None, same):
            return same  # the user's already
        replaced = {e.entry_id: e for e in (old, same) if e is not None}
        others = [e for e in self.current(field_name)
                  if e.origin == "user" and e.entry_id not in replaced]
        if len(others) >= BOUNDS[field_name]:
            raise UsageError(
                f"{field_name} holds at most {BOUNDS[field_name]} entries of yours; remove "
                "or change one of them first"
            )
        entry = self._new(field_name, key, text, "user", [], None)
        for previous in replaced.values():
            confirmed = previous.value == text and previous.origin != "user"
            self._supersede(previous, "confirmed" if confirmed else "changed", entry)
        self.profile.last_updated = self.now
        return entry

    def remove(self, entry_id: str) -> ProfileEntry:
        """Take a current entry out of the profile as the user (it stays as history)."""
        entry = self.entry(entry_id)
        self._exact = None
        self._supersede(entry, "removed", None)
        self.profile.last_updated = self.now
        return entry

    # -- raw edits of the projection -------------------------------------------------------

    def edit(self, apply: Callable[[Profile], None]) -> None:
        """Run ``apply`` on the projection (as ``Store.update_profile`` does), then make the
        entries say what it says: values it added become entries without sources, values it
        took out become history. The profile it made is stored as it is (any JSON values,
        within the bounds), though the entries hold its values as learned text is held; the
        next learning or correction stores the entries' projection."""
        # The stored profile as it is, unless this book changed it: a raw edit sees what it
        # would have seen before entries existed.
        projection = replace(self._exact) if self._exact is not None else self.projection()
        for name in BOUNDS:  # its own lists and maps, not the stored row's
            value = getattr(projection, name)
            setattr(projection, name, value.copy() if isinstance(value, (list, dict)) else value)
        apply(projection)
        try:
            data = projection.to_dict()
            dumps(data)
            checked = Profile.from_dict({**data, "user_id": self.profile.user_id})
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise UsageError(
                f"the profile of {self.profile.user_id!r} cannot be stored after this update "
                f"({exc}); keep each field's type (lists of strings, dicts of JSON values, "
                "strings)"
            ) from exc
        self._sync(checked)
        for name in ("created_at", "last_updated", "interaction_count", "synthesis_version"):
            setattr(self.profile, name, getattr(checked, name))
        self._exact = checked

    def take(self, profile: Profile) -> None:
        """Make the book hold ``profile``'s values and metadata (a profile given to a save)."""

        def copy(target: Profile) -> None:
            for item in fields(Profile):
                if item.name != "user_id":
                    setattr(target, item.name, getattr(profile, item.name))

        self.edit(copy)

    def sync(self, stored: Profile) -> None:
        """Make the entries hold what ``stored`` (a ``profile_data`` row) holds: a value no
        entry holds (written by something other than a book) becomes an entry without
        sources; an entry whose value it no longer holds becomes history."""
        if self._values() != _values_of(stored):
            self._sync(stored)
        self._exact = stored  # unless something changes, the row stays as it is

    def _sync(self, target: Profile) -> None:
        for name in BOUNDS:
            wanted = _items(name, _field_value(target, name), bound=None)
            order: list[ProfileEntry] = []
            for key, value in wanted:
                same = self._find(name, key, None if name in KEYED else value)
                if same is not None and same.value != value:
                    self._supersede(same, "edited", None)
                    same = None
                if same is None:
                    same = self._new(name, key, value, "learned", [], None)
                order.append(same)
            held = {e.entry_id for e in order}
            for entry in self.current(name):
                if entry.entry_id not in held:
                    self._supersede(entry, "edited", None)
            self._in_order([e for e in order if e.origin != "user"])

    # -- the result ------------------------------------------------------------------------

    def finish(self) -> Profile:
        """Enforce the bounds (the oldest learned entries of a full field become history) and
        return the projection, which is now :attr:`profile`."""
        for name, bound in BOUNDS.items():
            entries = self.current(name)
            excess = len(entries) - bound
            for entry in [e for e in entries if e.origin != "user"][:max(0, excess)]:
                self._supersede(entry, "bounds", None)
        self.profile = self._exact if self._exact is not None else self.projection()
        return self.profile

    def projection(self) -> Profile:
        """The profile as its current entries make it (a copy; metadata from :attr:`profile`)."""
        values: dict[str, Any] = {}
        for name in BOUNDS:
            entries = self.current(name)
            if name in _MAP_BOUNDS:
                values[name] = {e.key: e.value for e in entries}
            elif name == "communication_style":
                values[name] = entries[-1].value if entries else ""
            else:
                values[name] = [e.value for e in entries]
        return replace(self.profile, **values)

    @property
    def writes(self) -> int:
        """Rows this book will insert or update."""
        return len(self.added) + len(self.changed)

    # -- internals -------------------------------------------------------------------------

    def _values(self) -> dict[str, Any]:
        return _values_of(self.projection())

    def _find(self, name: str, key: str, value: str | None) -> ProfileEntry | None:
        for entry in self._current.values():
            if entry.field == name and entry.key == key and (value is None or entry.value == value):
                return entry
        return None

    def _in_order(self, entries: Sequence[ProfileEntry]) -> None:
        """Re-rank as few of ``entries`` as needed for them to rank in this order."""
        last = None
        for entry in entries:
            if last is not None and entry.rank <= last:
                self._touch(entry, ())
            last = entry.rank

    def _next_rank(self) -> int:
        self._rank += 1
        return self._rank

    def _new(self, name: str, key: str, value: str, origin: str,
             sources: Sequence[dict[str, Any]], model: str | None) -> ProfileEntry:
        merged, omitted = _merged([], sources, 0)
        entry = ProfileEntry(
            entry_id=new_hex(), user_id=self.profile.user_id, field=name, key=key,
            value=value, origin=origin, sources=merged, rank=self._next_rank(),
            created_at=self.now, updated_at=self.now, model=model, sources_omitted=omitted,
        )
        self._current[entry.entry_id] = entry
        self.added.append(entry)
        self._new_ids.add(entry.entry_id)
        return entry

    def _touch(self, entry: ProfileEntry, sources: Sequence[dict[str, Any]]) -> None:
        entry.sources, entry.sources_omitted = _merged(entry.sources, sources,
                                                       entry.sources_omitted)
        entry.rank = self._next_rank()
        entry.updated_at = self.now
        self._changed(entry)

    def _supersede(self, entry: ProfileEntry, reason: str, by: ProfileEntry | None) -> None:
        entry.superseded_at = self.now
        entry.superseded_by = by.entry_id if by is not None else None
        entry.reason = reason
        self._current.pop(entry.entry_id, None)
        self._changed(entry)

    def _changed(self, entry: ProfileEntry) -> None:
        if entry.entry_id not in self._new_ids:  # a new one is inserted as it ends up
            self.changed[entry.entry_id] = entry


def _merged(old: Sequence[dict[str, Any]], new: Iterable[dict[str, Any]],
            omitted: int) -> tuple[list[dict[str, Any]], int]:
    """``old`` then ``new`` sources without repeats; beyond :data:`MAX_SOURCES` the first and
    the newest are kept and the rest counted."""
    seen = {_source_key(s) for s in old}
    merged = list(old)
    for source in new:
        key = _source_key(source)
        if key not in seen:
            seen.add(key)
            merged.append(dict(source))
    if len(merged) > MAX_SOURCES:
        omitted += len(merged) - MAX_SOURCES
        merged = [merged[0], *merged[-(MAX_SOURCES - 1):]]
    return merged, omitted


def _source_key(source: dict[str, Any]) -> tuple[Any, ...]:
    return (source.get("task_id"), tuple(source.get("message_ids") or ()), source.get("at"))


def _items(name: str, value: Any, bound: int | None = -1) -> list[tuple[str, str]]:
    """The ``(key, text)`` pairs a reply's ``value`` holds for field ``name``, normalized as
    everything learned is (text, at most :data:`MAX_TEXT` characters, placeholders dropped);
    only the newest ``bound`` (the field's bound unless given; ``None``: all) can count."""
    limit = BOUNDS[name] if bound == -1 else bound
    if name == "communication_style":
        text = _text(value)
        return [("", text)] if text else []
    if name in _MAP_BOUNDS:
        if isinstance(value, list):  # [{"key", "value"}, ...] pairs
            value = _unpair(value)
        if not isinstance(value, dict):
            return []
        pairs = list(value.items())
        pairs = pairs if limit is None else pairs[-limit:]
        found: dict[str, str] = {}
        for key, item in pairs:
            key_text, item_text = _text(key), _map_text(item)
            if key_text and item_text:
                found.pop(key_text, None)  # the later one wins, and is the newer
                found[key_text] = item_text
        return list(found.items())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    texts: list[str] = []
    for item in (value if limit is None else value[-limit:]):
        text = _text(item)
        if text:
            if text in texts:
                texts.remove(text)  # re-mentioned: now the newest
            texts.append(text)
    return [("", text) for text in texts]


def _map_text(value: Any) -> str:
    """A preference's or project's value as text (a raw edit may store any JSON value)."""
    if isinstance(value, (dict, list)):
        try:
            return _text(dumps(value)[:MAX_TEXT])
        except (TypeError, ValueError, RecursionError):
            return ""
    return _text(value)


def _unpair(value: list[Any]) -> dict[str, Any]:
    """``[{"key": k, "value": v}, …]`` (or ``[[k, v], …]``) as ``{k: v, …}``."""
    pairs: dict[str, Any] = {}
    for item in value:
        if isinstance(item, dict):
            key, text = item.get("key"), item.get("value")
        elif isinstance(item, list) and len(item) == 2:
            key, text = item
        else:
            continue  # malformed entries are skipped, like every malformed insight
        if isinstance(key, (str, int, float)) and not isinstance(key, bool):
            pairs[str(key)] = text
    return pairs


def _field_value(profile: Profile, name: str) -> Any:
    return getattr(profile, name)


def _values_of(profile: Profile) -> dict[str, Any]:
    return {name: _items(name, _field_value(profile, name), bound=None) for name in BOUNDS}


def _user_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value.strip()) > MAX_TEXT:
        raise UsageError(f"the {name} must be text of at most {MAX_TEXT} characters")
    text = _text(value)
    if not text:
        raise UsageError(f"the {name} must hold a letter or digit")
    return text


__all__ = ["BOUNDS", "MAX_SOURCES", "REASONS", "ProfileBook", "ProfileEntry", "source_of"]
