"""Random ids, made without building a ``uuid.UUID`` (a turn makes several)."""

from __future__ import annotations

import os


def new_uuid() -> str:
    """A random (version 4) UUID as text: what ``str(uuid.uuid4())`` gives, in a third of
    the time."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def new_hex() -> str:
    """128 random bits as 32 hexadecimal digits (where ``uuid.uuid4().hex`` was used)."""
    return os.urandom(16).hex()
