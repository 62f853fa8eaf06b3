"""Offline token counting with the cl100k_base encoding shipped in the package.

tiktoken downloads its encodings at run time; Cogency ships the file so counting
works with no network. The encoding loads once, on first use.
"""

from __future__ import annotations

import base64
import gzip
import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


@cache
def _encoding() -> tiktoken.Encoding:
    import tiktoken

    raw = resources.files("cogency._data").joinpath("cl100k_base.tiktoken.gz").read_bytes()
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in gzip.decompress(raw).splitlines() if line)
    }
    return tiktoken.Encoding(
        "cl100k_base", pat_str=_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )


_LONG_RUN = re.compile(r"\S{%d,}" % 128)


def _encode(text: str) -> list[int]:
    """Token ids of ``text``; runs of 128+ non-space characters are encoded 128 at a time.

    BPE time grows with the square of a pre-token's length: one 40,000-character run (CJK
    prose, base64, minified code) took 17 s. Cutting long runs keeps encoding linear; counts
    differ from exact ones only inside such runs, by about one token per cut.
    """
    encoding = _encoding()
    if _LONG_RUN.search(text) is None:
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


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in ``text`` (special-token text counts as plain text)."""
    if not text:
        return 0
    return len(_encode(text))


def truncate_tokens(text: str, limit: int, marker: str = " …[truncated]") -> str:
    """``text`` cut to at most ``limit`` tokens, marked when cut."""
    if limit <= 0:
        return ""
    encoding = _encoding()
    ids = _encode(text)
    if len(ids) <= limit:
        return text
    keep = max(limit - len(encoding.encode_ordinary(marker)), 0)
    return encoding.decode(ids[:keep]) + marker
