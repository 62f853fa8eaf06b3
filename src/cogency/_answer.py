"""The answer, streamed while the model writes it: read incrementally out of the JSON step.

A step's answer is the ``response`` string of its JSON object. :class:`StepScanner` reads the
reply as it arrives, one pass, constant work per character (a regex jumps over plain text),
and gives out the decoded answer text only once it is known to be the final answer: the step
says ``"actions": []`` (or ``null``) before it, the object ends without actions, or the run
has no tools at all. :class:`AnswerStream` turns that into ``response_delta`` events, within
the client's ``stop``/``max_tokens`` (:class:`~cogency.client.AnswerLimits`), and keeps
their promise (see :class:`~cogency.events.ResponseDelta`): what was sent adds up to the
answer, or a ``restart`` says it does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .client import AnswerLimits
from .llm.base import AnswerText
from .reason import MAX_REPLY_CHARS

_STRING_STOP = re.compile(r'["\\]')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}
_MAX_KEY = 64


class StepScanner:
    """Reads a streamed JSON step; :meth:`feed` returns the answer text it can now give out."""

    def __init__(self, final_without_actions: bool) -> None:
        self.released = final_without_actions
        """Whether text of ``response`` is the answer (no tool can be called at all)."""
        self.acts = False
        """The step calls tools: nothing of it is the answer."""
        self.held: list[str] = []  # answer text read before it was known to be final
        self.seen = 0
        self.mode = "seek"
        self.depth = 0  # nesting inside a skipped value
        self.in_string = False  # inside a string of a skipped value
        self.escape = ""  # an escape sequence begun in an earlier piece
        self.key: list[str] = []
        self.current = ""  # the key whose value is being read
        self.high = ""  # a high surrogate waiting for its low half

    def feed(self, piece: str) -> str:
        if self.mode == "done" or self.acts or self.seen > MAX_REPLY_CHARS:
            return ""
        self.seen += len(piece)
        out: list[str] = []
        i, n = 0, len(piece)
        while i < n and self.mode != "done":
            i = getattr(self, "_" + self.mode)(piece, i, out)
        text = "".join(out)
        if self.acts:
            self.held.clear()
            return ""
        if not self.released:
            self.held.append(text)
            return ""
        if self.held:
            text, self.held = "".join(self.held) + text, []
        return text

    def _release(self) -> None:
        self.released = True

    # -- states: each reads from piece[i:] and returns where it stopped -----------------------

    def _seek(self, piece: str, i: int, out: list[str]) -> int:
        start = piece.find("{", i)
        if start < 0:
            return len(piece)
        self.mode = "key"
        return start + 1

    def _key(self, piece: str, i: int, out: list[str]) -> int:
        while i < len(piece):
            ch = piece[i]
            i += 1
            if ch == '"':
                self.mode, self.key, self.escape = "in_key", [], ""
                return i
            if ch == "}":
                self._end()
                return i
        return i

    def _in_key(self, piece: str, i: int, out: list[str]) -> int:
        while i < len(piece):
            ch = piece[i]
            i += 1
            if self.escape:
                self.escape = ""
                if len(self.key) < _MAX_KEY:
                    self.key.append(_ESCAPES.get(ch, ch))
            elif ch == "\\":
                self.escape = "\\"
            elif ch == '"':
                self.current, self.mode = "".join(self.key), "colon"
                return i
            elif len(self.key) < _MAX_KEY:
                self.key.append(ch)
        return i

    def _colon(self, piece: str, i: int, out: list[str]) -> int:
        colon = piece.find(":", i)
        if colon < 0:
            return len(piece)
        self.mode = "value"
        return colon + 1

    def _value(self, piece: str, i: int, out: list[str]) -> int:
        while i < len(piece) and piece[i] in " \t\r\n":
            i += 1
        if i == len(piece):
            return i
        ch = piece[i]
        if self.current == "response" and ch == '"':
            self.mode, self.escape = "answer", ""
            return i + 1
        if self.current == "actions" and ch == "[":
            self.mode = "actions"
            return i + 1
        if self.current == "actions" and ch == "n":  # null: no actions
            self._release()
        self.mode, self.depth, self.in_string, self.escape = "skip", 0, False, ""
        return i

    def _actions(self, piece: str, i: int, out: list[str]) -> int:
        while i < len(piece) and piece[i] in " \t\r\n":
            i += 1
        if i == len(piece):
            return i
        if piece[i] == "]":
            self._release()
            self.mode = "after"
            return i + 1
        self.acts = True
        self.mode = "done"
        return len(piece)

    def _skip(self, piece: str, i: int, out: list[str]) -> int:
        """A value that is not the answer (a string, a literal, or nested), to its end."""
        n = len(piece)
        while i < n:
            if self.in_string:
                if self.escape:
                    self.escape, i = "", i + 1
                    continue
                found = _STRING_STOP.search(piece, i)
                if found is None:
                    return n
                i = found.end()
                if found.group() == "\\":
                    self.escape = "\\"
                    continue
                self.in_string = False
                if self.depth == 0:
                    self.mode = "after"
                    return i
                continue
            ch = piece[i]
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                if self.depth == 0:  # the object's own end, after a literal
                    self.mode = "after"
                    return i
                self.depth -= 1
                if self.depth == 0:
                    self.mode = "after"
                    return i + 1
            elif ch == "," and self.depth == 0:
                self.mode = "key"
                return i + 1
            i += 1
        return i

    def _after(self, piece: str, i: int, out: list[str]) -> int:
        while i < len(piece):
            ch = piece[i]
            i += 1
            if ch == ",":
                self.mode = "key"
                return i
            if ch == "}":
                self._end()
                return i
        return i

    def _answer(self, piece: str, i: int, out: list[str]) -> int:
        n = len(piece)
        while i < n:
            if self.escape:
                i = self._escaped(piece, i, out)
                continue
            found = _STRING_STOP.search(piece, i)
            if found is None:
                self._text(piece[i:], out)
                return n
            self._text(piece[i:found.start()], out)
            i = found.end()
            if found.group() == '"':
                self._text("", out, end=True)  # a high surrogate left alone
                self.mode = "after"
                return i
            self.escape = "\\"
        return i

    def _escaped(self, piece: str, i: int, out: list[str]) -> int:
        """Continue an escape sequence (``\\n``, ``\\u00e9``…), which may span pieces."""
        while i < len(piece):
            self.escape += piece[i]
            i += 1
            if len(self.escape) == 2 and self.escape[1] != "u":
                code, self.escape = self.escape[1], ""
                self._text(_ESCAPES.get(code, code), out)
                return i
            if len(self.escape) == 6:
                digits, self.escape = self.escape[2:], ""
                try:
                    self._text(chr(int(digits, 16)), out)
                except ValueError:
                    pass  # not JSON: the reply is invalid, and the final answer says so
                return i
        return i

    def _text(self, text: str, out: list[str], end: bool = False) -> None:
        """Decoded answer text, joining a surrogate pair written as two escapes."""
        if not text and not end:
            return
        if self.high:
            if text and "\udc00" <= text[0] <= "\udfff":
                text = (self.high + text).encode("utf-16", "surrogatepass").decode("utf-16")
            else:
                out.append(self.high)
            self.high = ""
        if len(text) == 1 and "\ud800" <= text <= "\udbff":
            self.high = text
            return
        out.append(text)

    def _end(self) -> None:
        self.mode = "done"
        if not self.acts:
            self._release()  # the object ended without actions: it answers


class AnswerStream:
    """The answer of one step as ``response_delta`` events: ``emit(text, restart)``.

    :meth:`feed` takes each piece of the reply, :meth:`retry` says the reply was invalid (the
    next one starts), :meth:`finish` gives the step's final answer (``None``: it did not
    answer) and sends what is left, or a restart. A model that streams nothing (only its
    whole reply) gets no deltas: the ``response`` event carries its answer. With ``emit=None``
    (no one reads the run's events: ``Agent.run``) nothing is scanned.
    """

    def __init__(self, emit: Callable[[str, bool], None] | None, *, tools: bool,
                 stop: Sequence[str] = (), max_tokens: int | None = None) -> None:
        self._emit = emit
        self._tools = tools
        self._stop, self._max_tokens = stop, max_tokens
        self._sent: list[str] = []
        self._streamed = False  # a model that does not stream gets no deltas at all
        self._before = ""  # what was sent when this reply began (to compare a retry with)
        self._at = 0  # how far this reply's answer has come
        if emit is not None:
            self._begin()

    def _begin(self) -> None:
        self._scanner = StepScanner(final_without_actions=not self._tools)
        self._limits = AnswerLimits(self._stop, self._max_tokens)
        self._plain = False  # an AnswerText piece arrived: leading whitespace is dropped
        self._at = 0

    def feed(self, piece: str) -> None:
        if self._emit is None:
            return
        self._streamed = True
        if isinstance(piece, AnswerText):
            text = str(piece)
            if not self._plain and self._at == 0 and not self._limits.held:
                text = text.lstrip()
            self._plain = self._plain or bool(text)
        else:
            text = self._scanner.feed(piece)
        if text:
            self._offer(self._limits.push(text))

    def retry(self) -> None:
        if self._emit is None:
            return
        self._before = "".join(self._sent)
        self._begin()

    def finish(self, answer: str | None) -> None:
        if self._emit is None:
            return
        sent = "".join(self._sent)
        if answer is None:
            if sent:
                self._restart("")
            return
        if not self._streamed:
            return
        if answer.startswith(sent):
            if len(answer) > len(sent):
                self._send(answer[len(sent):])
        else:
            self._restart(answer)

    def _offer(self, text: str) -> None:
        """Text of this reply's answer, after what it gave before: sent unless the answer
        sent earlier (by an invalid reply) already holds it."""
        if not text:
            return
        start, self._at = self._at, self._at + len(text)
        overlap = min(self._at, len(self._before)) - start
        if overlap > 0:
            if self._before[start:start + overlap] != text[:overlap]:
                self._restart(self._before[:start] + text)
                return
            text = text[overlap:]
        if text:
            self._send(text)

    def _send(self, text: str) -> None:
        assert self._emit is not None
        self._sent.append(text)
        self._emit(text, False)

    def _restart(self, text: str) -> None:
        assert self._emit is not None
        self._sent, self._before = [text], ""
        self._at = len(text)
        self._emit(text, True)
