"""Secret redaction: tool output is scrubbed of credentials before it is stored or shown.

Two sources of secrets are recognised: text shaped like a credential (provider API keys,
cloud access keys, bearer tokens, private-key blocks, URLs with a password) and the values of
secret-named environment variables of this process (``*_KEY``, ``*_TOKEN``, ``*_SECRET``,
``*PASSWORD*``, ``DATABASE_URL``, ``COGENCY_DB`` ...), wherever they appear.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REDACTED = "[REDACTED]"

_SECRET_NAME = re.compile(
    r"(_KEY|_KEYS|_TOKEN|_TOKENS|_SECRET|_SECRETS|PASSWORD|PASSWD|_PASS|_PWD|CREDENTIALS?|"
    r"_AUTH|^AUTH|DATABASE_URL|_DSN|^COGENCY_DB|SESSION|COOKIE|PRIVATE)",
    re.I,
)
"""Environment variable names whose values are secrets (also stripped from the shell tool)."""

_MIN_ENV_SECRET = 6
"""Shorter values (``1``, ``true``, ``dev``) would redact ordinary words."""

_PATTERNS = [
    # Private key blocks, whole (or to the end of the text when the END line is cut off).
    re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        re.S,
    ),
    re.compile(r"\bsk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI, Anthropic, Stripe
    re.compile(r"\b(?:rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"),  # Stripe restricted/publishable
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}\b"),  # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google API keys
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
]
# Keep the label, hide the value: "Authorization: Bearer abc", "password=hunter2", URL passwords.
_LABELLED = [
    (re.compile(r"(\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9_\-.~+/=]{8,}", re.I), r"\1" + REDACTED),
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+(@)"), r"\1" + REDACTED + r"\2"),
    (
        re.compile(
            r"""(\b[\w.\-]*(?:api[_\-]?key|secret|token|passw(?:or)?d|pwd)["']?\s*[:=]\s*["']?)"""
            r"""([^\s"',;&]{6,})""",
            re.I,
        ),
        r"\1" + REDACTED,
    ),
]


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret."""
    return bool(_SECRET_NAME.search(name))


def env_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of the secret-named variables in ``env`` (default: this process), longest first."""
    source = os.environ if env is None else env
    values = {
        value for name, value in source.items()
        if is_secret_name(name) and len(value.strip()) >= _MIN_ENV_SECRET
    }
    return sorted(values, key=len, reverse=True)


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


def scrub_surrogates(text: str) -> str:
    """Replace lone surrogates (which no database can store as UTF-8) with U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)  # one U+FFFD per lone surrogate
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")
