"""API keys: made once, shown once, stored as a hash, checked in constant time.

A key reads ``cog_<key_id>_<secret>``. ``key_id`` is public (``cogency keys list`` shows it,
``keys revoke`` takes it); only the SHA-256 of the 256-bit random ``secret`` is stored. A
slow password hash buys nothing for a secret that random, and would cost every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from .. import _time
from ..errors import UsageError
from ..state.state import check_id
from ..storage.base import ApiKeyRecord, Store

PREFIX = "cog_"
_KEY = re.compile(r"^cog_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_NOBODY = hashlib.sha256(b"no such key").hexdigest()
"""Compared against when the key id is unknown, so that case costs the same work."""


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_key(store: Store, user_id: str, name: str = "") -> tuple[ApiKeyRecord, str]:
    """A new key for ``user_id``: its stored record, and the key itself (never stored)."""
    check_id(user_id, "user_id")
    if not isinstance(name, str) or len(name) > 200:
        raise UsageError("a key's name must be a string of at most 200 characters")
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    record = ApiKeyRecord(key_id, user_id, _hash(secret), name, _time.now())
    await store.create_api_key(record)
    return record, f"{PREFIX}{key_id}_{secret}"


async def authenticate(store: Store, key: str) -> ApiKeyRecord | None:
    """The live record of ``key``, or ``None`` (malformed, unknown, wrong secret, revoked)."""
    match = _KEY.match(key) if len(key) < 100 else None
    if match is None:
        return None
    key_id, secret = match.groups()
    record = await store.find_api_key(key_id)
    expected = record.key_hash if record is not None else _NOBODY
    if not hmac.compare_digest(expected, _hash(secret)):
        return None
    if record is None or record.revoked_at is not None:
        return None
    return record


def key_id_of(text: str) -> str:
    """The public id in ``text``, which is a key id or a whole key."""
    match = _KEY.match(text)
    return match.group(1) if match else text
