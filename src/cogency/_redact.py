"""Secret redaction: tool output is scrubbed of credentials before it is stored or shown.

Two sources of secrets are recognised: text shaped like a credential (provider API keys,
cloud access keys, bearer tokens, private-key blocks, URLs with a password) and the values of
secret-named environment variables of this process (``*_KEY``, ``TOKEN``, ``*_SECRET``,
``APIKEY``, ``*PASSWORD*``, ``DATABASE_URL``, ``COGENCY_DB`` ...), and the passwords inside
any URL-valued variable, wherever they appear.

Every pattern runs in time linear in the text: none can rescan a long run of characters from
each of its positions (``bench/bench_redact.py`` measures the time per MB on hostile input).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REDACTED = "[REDACTED]"

_SECRET_NAME = re.compile(
    r"(?:^|_)(?:KEYS?|TOKENS?|SECRETS?|PASS|PWD|AUTH|DSN|PAT)(?:_|$)|"
    r"APIKEY|ACCESSKEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|DATABASE_URL|"
    r"^COGENCY_DB|"
    r"SESSION|COOKIE|PRIVATE",
    re.I,
)
"""Environment variable names whose values are secrets: whole words (``KEY``, ``AUTH``) or
parts no ordinary name holds (``SECRET``, ``TOKEN``, ``APIKEY``)."""

_MIN_ENV_SECRET = 6
"""Shorter values (``1``, ``true``, ``dev``) would redact ordinary words."""

_PRIVATE_KEY = re.compile(
    # Private key blocks, whole (or to the end of the text when the END line is cut off).
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
    r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.S,
)
_TOKEN = re.compile(
    # One alternation, so the text is scanned once for all of them.
    r"\b(?:"
    r"sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}"  # OpenAI, Anthropic, Stripe
    r"|(?:rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe restricted/publishable
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}\b"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google API keys
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWT
    r")"
)
_PATTERNS = [_PRIVATE_KEY, _TOKEN]
# Keep the label, hide the value: "Authorization: Bearer abc", "password=hunter2", URL passwords.
_LABELLED = [
    (re.compile(r"(\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9_\-.~+/=]{8,}", re.I), r"\1" + REDACTED),
    # URL user info: "scheme://user:password@", "scheme://:password@" (the password may hold
    # "@": the user info ends at the last "@" before the path).
    (re.compile(r"(://[^/\s:@?#]*:)[^\s/?#]*(@)"), r"\1" + REDACTED + r"\2"),
    # The key word is found first and its label kept by the replacement: a pattern that also
    # matched the word's prefix ("[\w.-]*token") rescanned long runs from every position.
    (
        re.compile(
            r"""((?:api[_\-]?key|secret|token|passw(?:or)?d|pwd)["']?\s*[:=]\s*["']?)"""
            r"""([^\s"',;&]{6,})""",
            re.I,
        ),
        r"\1" + REDACTED,
    ),
]
_URL_PASSWORD = re.compile(r"://[^/\s:@?#]*:([^\s/?#]*)@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret."""
    return bool(_SECRET_NAME.search(name))


def env_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of the secret-named variables in ``env`` (default: this process), longest first."""
    source = os.environ if env is None else env
    values = {value for name, value in source.items() if is_secret_name(name)}
    for value in source.values():
        if "://" in value:  # REDIS_URL=redis://:pw@host: the password alone is a secret too
            values.update(_URL_PASSWORD.findall(value))
    return sorted((v for v in values if len(v.strip()) >= _MIN_ENV_SECRET), key=len, reverse=True)


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with every recognised secret replaced by ``[REDACTED]``.

    Lone surrogates (undecodable bytes) become U+FFFD so the text can always be stored.
    """
    if not isinstance(text, str):
        text = str(text)
    for value in env_secrets(env):
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    for pattern, replacement in _LABELLED:
        text = pattern.sub(replacement, text)
    return scrub_surrogates(text)


REDACT_MARGIN = 4096
"""Characters scanned past a cut and then dropped, so no secret is shown cut in half."""


def redact_cut(text: str, limit: int, env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """At most ``limit`` characters of ``text``, redacted, and how many characters are left out.

    Only a window a little longer than ``limit`` is scanned, so the time is bounded by
    ``limit`` whatever the length of ``text``. The window's last ``REDACT_MARGIN`` characters
    (more when an environment secret is longer) are scanned and dropped: a secret cut at the
    window's edge is never shown in part.
    """
    if not isinstance(text, str):
        text = str(text)
    secrets = env_secrets(env)
    margin = REDACT_MARGIN + (len(secrets[0]) if secrets else 0)
    if len(text) <= limit + margin:
        clean = redact(text, env)
        return clean[:limit], max(len(clean) - limit, 0)
    window = redact(text[: limit + margin], env)
    kept = window[: max(min(limit, len(window) - margin), 0)]
    return kept, len(text) - len(kept)


def scrub_surrogates(text: str) -> str:
    """Replace lone surrogates (which no database can store as UTF-8) with U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)  # one U+FFFD per lone surrogate
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")
