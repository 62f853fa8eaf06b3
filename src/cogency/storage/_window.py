"""The history windows a store keeps of recently used conversations, so a turn reads only the
messages added since the last one.

Messages are append-only and numbered (``seq``), so a cached window is brought up to date
with the rows after the last seq it saw, once the store has checked that this row is still
there unchanged (a conversation erased and made again under its id is read afresh). The
window is a :class:`~cogency._history.History`, so what building a prompt needs of each
message is computed once, when it joins, and handed on with every copy.

A stored count may be an upper bound of the message's tokens (see :mod:`cogency.tokens`).
While the bounds fit the budget every message fits and none is counted; where they do not,
the counts that decide the window's edge are made exact first (:class:`Newest`), so a window
holds the newest messages that fit by their exact counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

from .._history import History, exactly
from ..tokens import is_estimate, loaded


class Newest:
    """The newest messages that fit ``budget`` tokens (and ``limit`` messages), fed newest
    first to :meth:`take` until it says no more fit.

    Stored counts are taken as they are while their sum fits; at the first message that does
    not, the messages taken so far and every one after get their exact counts (copies of
    the dicts), so the window's edge is where exact counts put it.
    """

    __slots__ = ("budget", "limit", "picked", "used", "exact")

    def __init__(self, budget: int | None, limit: int | None = None) -> None:
        self.budget, self.limit = budget, limit
        self.picked: list[dict[str, Any]] = []  # newest first
        self.used = 0
        self.exact = False

    def take(self, message: dict[str, Any]) -> bool:
        """Keep ``message`` if it fits; ``False`` (and nothing kept) once it does not."""
        if self.limit is not None and len(self.picked) >= self.limit:
            return False
        if self.budget is None:
            self.picked.append(message)
            return True
        if not self.exact and self.used + message["tokens"] > self.budget:
            self.exact = True  # the edge is near: from here on counts must be exact
            self.picked = [exactly(m) for m in self.picked]
            self.used = sum(m["tokens"] for m in self.picked)
        if self.exact:
            message = exactly(message)
        if self.used + message["tokens"] > self.budget:
            return False
        self.used += message["tokens"]
        self.picked.append(message)
        return True


class Window:
    """The newest messages of a conversation that fit ``budget`` tokens, and the seq and
    ``created_at`` of the newest message seen (to check the window still holds)."""

    __slots__ = ("budget", "messages", "used", "last_seq", "last_stamp")

    def __init__(self, budget: int, messages: History, used: int, last_seq: int,
                 last_stamp: str) -> None:
        # ``used``: the tokens of ``messages``, kept as they come and go (never re-summed).
        self.budget, self.messages, self.used = budget, messages, used
        self.last_seq, self.last_stamp = last_seq, last_stamp

    @classmethod
    def newest(cls, budget: int, newest_first: Iterable[dict[str, Any]], last_seq: int,
               last_stamp: str) -> Window:
        """The window of the messages in ``newest_first`` (newest first) that fit, stopping
        at the first that does not."""
        fit = Newest(budget)
        for message in newest_first:
            if not fit.take(message):
                break
        return cls(budget, History(reversed(fit.picked)), fit.used, last_seq, last_stamp)

    def advanced(self, fresh: list[dict[str, Any]], last_seq: int, last_stamp: str) -> Window:
        """This window with ``fresh`` (the messages after ``last_seq``, oldest first) added
        and the oldest dropped while the window is over budget."""
        old, used = self.messages, self.used + sum(m["tokens"] for m in fresh)
        if used > self.budget:  # something is dropped: which depends on exact counts
            if old.estimated:  # once: the window is chosen again, by exact counts
                return Window.newest(self.budget, chain(reversed(fresh), reversed(old)),
                                     last_seq, last_stamp)
            if any(is_estimate(m["content"], m["tokens"]) for m in fresh):
                fresh = [exactly(m) for m in fresh]
                used = self.used + sum(m["tokens"] for m in fresh)
        drop = 0  # the oldest messages over budget, counted before anything is copied
        while drop < len(old) + len(fresh) and used > self.budget:
            used -= (old[drop] if drop < len(old) else fresh[drop - len(old)])["tokens"]
            drop += 1
        messages = old.after(min(drop, len(old)))
        messages.extend(fresh[max(drop - len(old), 0):])
        return Window(self.budget, messages, used, last_seq, last_stamp)


def counts_held(window: Window, fresh: list[dict[str, Any]]) -> dict[int, int]:
    """``seq`` -> ``tokens`` as held, of the messages that ``window.advanced(fresh, …)`` may
    count again (for :func:`recounted`). Advancing counts only when ``fresh`` takes the window
    over its budget, and then only what carries a bound: the whole window if it holds one
    (it is chosen again), else the fresh messages that do. A full window of exact counts (a
    long conversation's every turn) costs a look at the fresh messages alone."""
    if window.used + sum(message["tokens"] for message in fresh) <= window.budget:
        return {}
    if window.messages.estimated:
        return {message["seq"]: message["tokens"] for message in chain(window.messages, fresh)}
    return {message["seq"]: message["tokens"] for message in fresh
            if is_estimate(message["content"], message["tokens"])}


def recounted(stored: Mapping[int, int], window: Window) -> list[tuple[int, int, int]]:
    """``(seq, exact count, count as stored)`` of the messages of ``window`` that were read
    (``stored``: each one's ``seq`` and its ``tokens`` as stored) with an upper bound of their
    tokens, and that the window counted exactly: what a store writes back, so that the next
    process to read them need not count them again (which loads the encoding: ~0.12 s and
    20-26 MiB, in every process that starts on a conversation whose bounds exceed its
    window, however far below it the conversation is).

    Looked up by ``seq`` (a window is a run of consecutive messages): it costs a look per
    message read, none while the encoding was never loaded (nothing was counted)."""
    messages = window.messages
    if not stored or not messages or not loaded():
        return []
    first = messages[0].get("seq")
    if not isinstance(first, int):
        return []
    found = []
    for seq, tokens in stored.items():
        at = seq - first
        if 0 <= at < len(messages):
            message = messages[at]
            if message.get("seq") == seq and message["tokens"] != tokens:
                found.append((seq, message["tokens"], tokens))
    return found


class Windows:
    """The windows of the ``size`` most recently used conversations."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._entries: OrderedDict[str, Window] = OrderedDict()

    def get(self, conversation_id: str, budget: int | None) -> Window | None:
        """The cached window of this budget, if any (the caller checks it still holds)."""
        entry = self._entries.get(conversation_id)
        return entry if entry is not None and entry.budget == budget else None

    def put(self, conversation_id: str, window: Window) -> History:
        """Keep ``window`` as the conversation's; returns a copy of its messages to hand out."""
        self._entries[conversation_id] = window
        self._entries.move_to_end(conversation_id)
        if len(self._entries) > self.size:
            self.drop(next(iter(self._entries)))  # the least recently used, with what it holds
        return window.messages.copy()

    def drop(self, conversation_id: str) -> None:
        self._entries.pop(conversation_id, None)

    def clear(self) -> None:
        self._entries.clear()
