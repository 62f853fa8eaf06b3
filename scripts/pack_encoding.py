"""Make ``src/cogency/_data/cl100k_base.ranks`` from tiktoken's published ``cl100k_base.tiktoken``.

The published file is one ``<base64 token> <rank>`` line per token (ranks 0, 1, 2, … in order).
Parsing it costs a base64 decode and a split per line at every load; the packed form loads
with a few slicing passes in C. It is zlib data of: the token count (4 bytes, little endian),
one length byte per token (no token is longer than 255 bytes), then the tokens' bytes in rank
order. ``tests/test_tokens.py`` rebuilds the published text from the packed file and checks
it against tiktoken's published SHA-256, so the packed file holds exactly the published ranks.

    python scripts/pack_encoding.py cl100k_base.tiktoken   # or the .tiktoken.gz of git history
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import sys
import zlib
from pathlib import Path

PUBLISHED_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
OUT = Path(__file__).resolve().parent.parent / "src" / "cogency" / "_data" / "cl100k_base.ranks"


def main(source: str) -> None:
    raw = Path(source).read_bytes()
    text = gzip.decompress(raw) if source.endswith(".gz") else raw
    if hashlib.sha256(text).hexdigest() != PUBLISHED_SHA256:
        raise SystemExit(f"{source} is not tiktoken's published cl100k_base.tiktoken")
    tokens = []
    for expected, line in enumerate(text.splitlines()):
        token, rank = line.split()
        if int(rank) != expected:
            raise SystemExit(f"rank {rank} is out of order (expected {expected})")
        tokens.append(base64.b64decode(token))
    body = len(tokens).to_bytes(4, "little") + bytes(map(len, tokens)) + b"".join(tokens)
    OUT.write_bytes(zlib.compress(body, 9))
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(tokens):,} tokens)")


if __name__ == "__main__":
    main(sys.argv[1])
