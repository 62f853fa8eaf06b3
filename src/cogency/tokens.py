"""Token counts with the cl100k_base encoding shipped in the package, loaded only when a count
must be exact.

No token is shorter than one byte, so a text's UTF-8 length is an upper bound of its tokens
(:func:`most_tokens`). Most decisions need no more: a prompt whose bound fits the window fits,
a history whose bound fits its budget is kept whole. The exact encoding (about 100 ms of CPU
and 17 MiB) loads on the first count that must be exact, so a process whose conversations stay
well below their windows never loads it (:func:`loaded` says whether it did).

A message's stored ``tokens`` (:func:`message_tokens`) is its exact count when this process
has the encoding loaded, else its UTF-8 length: an upper bound, and marked as such by being
equal to that length (an exact count that happens to equal it is recounted to the same number,
so the mark never misleads). Wherever a window's edge depends on a count, the count is made
exact first (:func:`exact_tokens`): windows hold what exact counts would give them.

Once it is loaded, ASCII text is counted by its pieces (the encoding's own pattern, spelled out
for ASCII in Python's ``re``) and a bounded cache of each piece's tokens, which prose repeats;
a line of prose (no whitespace but single spaces) by its words, split without ``re``, and a
cache of each word's tokens. Both give tiktoken's count (``tests/test_tokens.py`` holds them
equal), with less work per message. Other text, and text over 16 KiB (``_PIECES_TEXT``), goes
to tiktoken whole.

tiktoken downloads its encodings at run time; Cogency ships the ranks so counting works with
no network (``scripts/pack_encoding.py`` made the file from tiktoken's published one).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable
from importlib import resources
from itertools import accumulate, pairwise, starmap
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import tiktoken

_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_RANKS_FILE = "cl100k_base.ranks"

_loaded: list[tiktoken.Encoding] = []  # the encoding once loaded (a cache of a constant)
_loading = threading.Lock()  # the store's thread and the event loop may both count


def loaded() -> bool:
    """Whether this process has loaded the exact encoding (only a count that had to be exact
    loads it)."""
    return bool(_loaded)


def _encoding() -> tiktoken.Encoding:
    if _loaded:
        return _loaded[0]
    with _loading:
        if not _loaded:
            _loaded.append(_load())
    return _loaded[0]


def _load() -> tiktoken.Encoding:
    import tiktoken

    # The packed ranks: token count, one length byte per token, the tokens in rank order.
    data = zlib.decompress(resources.files("cogency._data").joinpath(_RANKS_FILE).read_bytes())
    count = int.from_bytes(data[:4], "little")
    spans = starmap(slice, pairwise(accumulate(data[4 : 4 + count], initial=4 + count)))
    tokens = map(data.__getitem__, spans)  # sliced in C, no parsing
    encoding = tiktoken.Encoding(
        "cl100k_base", pat_str=_PATTERN, mergeable_ranks=dict(zip(tokens, range(count))),
        special_tokens={},
    )
    # tiktoken's Rust core holds its own copy of the ranks; the Python dict it keeps is read
    # only to pickle the encoding, which nothing here does: dropping it frees ~10 MiB.
    encoding._mergeable_ranks = {}
    return encoding


def most_tokens(text: str) -> int:
    """An upper bound of ``text``'s tokens with no encoding loaded: its UTF-8 length."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def message_tokens(text: str) -> int:
    """What a stored message's ``tokens`` holds: the exact count when the encoding is loaded,
    else :func:`most_tokens` (an upper bound that :func:`exact_tokens` recognises)."""
    return count_tokens(text) if _loaded else most_tokens(text)


def is_estimate(text: str, tokens: int) -> bool:
    """Whether a stored count may be the upper bound rather than the exact count."""
    return tokens > 1 and tokens == most_tokens(text)


def exact_tokens(text: str, tokens: int) -> int:
    """The exact count of a message stored with ``tokens`` (recounted if it may be a bound)."""
    return count_tokens(text) if is_estimate(text, tokens) else tokens


_RUN = 128
_LONG_RUN = re.compile(r"(?<!\S)\S{%d,}" % _RUN)  # tried only where a run begins


def _may_have_long_run(text: str) -> bool:
    """False when ``text`` surely holds no run of ``_RUN`` non-space characters: such a run
    covers a whole aligned block of half its length, and every block here holds a space (a
    block with none is what ``split`` leaves whole; ``split`` and ``\\s`` agree on every
    character). A few C calls, where the regex is a pass over every character."""
    half = _RUN // 2
    for at in range(0, len(text) - half + 1, half):
        block = text[at : at + half]
        if (block.split(None, 1) or ("",))[0] == block:
            return True
    return False


def _encode(text: str) -> list[int]:
    """Token ids of ``text``; runs of 128+ non-space characters are encoded 128 at a time.

    BPE time grows with the square of a pre-token's length: one 40,000-character run (CJK
    prose, base64, minified code) took 17 s. Cutting long runs keeps encoding linear; counts
    differ from exact ones only inside such runs, by about one token per cut (every piece is
    still at least one byte a token, so :func:`most_tokens` stays a bound).
    """
    encoding = _encoding()
    if not _may_have_long_run(text) or _LONG_RUN.search(text) is None:
        return encoding.encode_ordinary(text)
    ids: list[int] = []
    start = 0
    for run in _LONG_RUN.finditer(text):
        ids += encoding.encode_ordinary(text[start : run.start()])
        for cut in range(run.start(), run.end(), 128):
            ids += encoding.encode_ordinary(text[cut : min(cut + 128, run.end())])
        start = run.end()
    ids += encoding.encode_ordinary(text[start:])
    return ids


_WS = r"\t\n\x0b\x0c\r "  # what the pattern's \s is in ASCII: Unicode's White_Space
_ASCII_PIECES = re.compile(
    r"'(?:[sdmtSDMT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\nA-Za-z0-9]?+[A-Za-z]++|[0-9]{1,3}+"
    rf"| ?[^{_WS}A-Za-z0-9]++[\r\n]*+|[{_WS}]++\Z|[{_WS}]*[\r\n]|[{_WS}]+(?![^{_WS}])|[{_WS}]"
)
"""The pattern's pieces in ASCII text, with Python's ``re`` (the pattern's classes spelled out
for ASCII; ``\\Z`` where it says ``$``, which means the text's end there): the same pieces as
tiktoken's regex finds."""
_PIECE_TOKENS: dict[str, int] = {}
"""piece -> its tokens: a cache of a pure function, of at most ``_PIECES_KEPT`` pieces of at
most ``_PIECE_KEPT`` characters. Entries are only added; a full cache is replaced by an empty
one, so a thread counting with the old one still finds every piece it saw there."""
_WORD_TOKENS: dict[str, int] = {}
"""word -> the tokens of ``" " + word`` (:func:`_count_words`), kept as ``_PIECE_TOKENS``."""
_PIECES_KEPT = 16_384
_PIECE_KEPT = 64
_PIECES_TEXT = 16_384
"""The longest text counted by its pieces: ``re`` and the lookups hold the GIL, where
tiktoken lets it go while it encodes, so a long text counted in a thread (``State.start_task``
counts a long query in one) goes to tiktoken and leaves the event loop free."""
_FEW_NEW = 4


def _count_ascii(text: str) -> int | None:
    """The count of ASCII ``text``: by its words (:func:`_count_words`) when its only
    whitespace is single spaces (a line of prose), else by its pieces
    (:func:`_count_pieces`); ``None`` (tiktoken's, which cuts them) when it may hold a long
    run of non-space characters."""
    if ("\n" not in text and "\r" not in text and "\t" not in text and "\x0b" not in text
            and "\x0c" not in text and "  " not in text):
        counted = _count_words(text)
        if counted is not None:
            return counted
    return None if _may_have_long_run(text) else _count_pieces(text)


def _count_pieces(text: str) -> int:
    """The count of ASCII ``text``: its pieces (:data:`_ASCII_PIECES`), each counted once by
    the encoding (a piece's tokens do not depend on the text around it), then looked up."""
    global _PIECE_TOKENS
    counted = _looked_up(_PIECE_TOKENS, _ASCII_PIECES.findall(text), "")
    assert counted is not None  # (only a word is ever too long to count here)
    total, _PIECE_TOKENS = counted
    return total


def _count_words(text: str) -> int | None:
    """The count of ASCII ``text`` whose only whitespace is single spaces: its first word's
    pieces, then each later word's tokens with the space before it, looked up; ``None`` if a
    word is longer than ``_PIECE_KEPT`` (it may be a long run).

    The same count as the pieces': no piece of such a text runs past a word's end (a piece
    holds whitespace only as the one space it begins with, or as a lone space: before a
    digit, or at the text's end), and what a space before a word becomes depends only on the
    word's first character (or on the text ending there). So the text's pieces are those of
    the first word and of each ``" " + word`` in turn (a space at either edge: an empty word).
    Two spaces in a row would make one piece: such text goes the pieces' way. Without ``re``:
    a split and a lookup a word, about half the work."""
    global _WORD_TOKENS
    words = text.split(" ")
    if len(words[0]) > _PIECE_KEPT:
        return None
    first = _count_pieces(words[0])
    del words[0]
    counted = _looked_up(_WORD_TOKENS, words, " ")
    if counted is None:
        return None
    total, _WORD_TOKENS = counted
    return first + total


def _looked_up(known: dict[str, int], keys: list[str], before: str
               ) -> tuple[int, dict[str, int]] | None:
    """The tokens of every ``before + key`` of ``keys``, summed, by way of ``known`` (a cache
    of ``key`` -> those tokens, of at most ``_PIECES_KEPT`` keys of at most ``_PIECE_KEPT``
    characters), and the cache to keep: ``known`` with what was new, or a new one when that
    would not fit. Text repeats its pieces and words: the lookups are most of the work. Keys
    with a few new to the cache (a number, a name) are counted as the lookup meets them; with
    more, all the new ones in one pass. With ``before`` (words), ``None`` when a key is longer
    than ``_PIECE_KEPT``: no piece is (``_count_pieces`` is called only where no long run is),
    and a long word is counted with the rest of its text."""
    for _ in range(_FEW_NEW):
        try:
            return sum(map(known.__getitem__, keys)), known
        except KeyError as missing:
            key = missing.args[0]
        if len(key) > _PIECE_KEPT:
            if before:
                return None
            break
        if len(known) >= _PIECES_KEPT:
            break
        known[key] = len(_encoding().encode_ordinary(before + key))
    unknown = set(keys).difference(known)
    if before and any(len(key) > _PIECE_KEPT for key in unknown):
        return None
    encoding = _encoding()
    new = {key: len(encoding.encode_ordinary(before + key)) for key in unknown}
    either = cast(Callable[[str, int | None], int], new.get)  # new, else known (C-speed)
    total = sum(map(either, keys, map(known.get, keys)))
    kept = {key: tokens for key, tokens in new.items() if len(key) <= _PIECE_KEPT}
    if len(known) + len(kept) > _PIECES_KEPT:
        known = {}
    if len(kept) <= _PIECES_KEPT:
        known.update(kept)
    return total, known


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in ``text`` (special-token text counts as plain text).
    Loads the encoding on first use."""
    if not text:
        return 0
    if _loaded and len(text) <= _PIECES_TEXT and text.isascii():
        counted = _count_ascii(text)  # (the first count loads the encoding, below)
        if counted is not None:
            return counted
    return len(_encode(text))


def truncate_tokens(text: str, limit: int, marker: str = " …[truncated]") -> str:
    """``text`` cut to at most ``limit`` tokens, marked when cut (a text whose UTF-8 length is
    within ``limit`` is returned as it is, with no encoding loaded)."""
    if limit <= 0:
        return ""
    if most_tokens(text) <= limit:
        return text
    encoding = _encoding()
    ids = _encode(text)
    if len(ids) <= limit:
        return text
    keep = max(limit - len(encoding.encode_ordinary(marker)), 0)
    return encoding.decode(ids[:keep]) + marker
