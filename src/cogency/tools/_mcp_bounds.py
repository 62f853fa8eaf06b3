"""Bounds on the work an MCP server can make this process do on its event loop.

A server chooses the bytes of every message, the tool schemas the model is shown, and so the
work of checking the model's arguments: a few kB of nested ``$ref``/``anyOf`` once took
minutes to inline or to check, and a 4 MB message of small values half a second to parse,
with every run of the process waiting. Each kind of work here has a budget, counted as it is
done, and stops at it:

- a message: :data:`MAX_MESSAGE_ITEMS`, counted from its bytes before it is parsed
  (:func:`json_items`, a few C-speed passes: 2 ms for 4 MB of text, more for 4 MB full of
  escapes), and :data:`MAX_CONTENT_BLOCKS` per result (each block becomes a model object);
- a tool's schema: :data:`MAX_SCHEMA_NODES` once its ``$ref``s are inlined
  (``cogency._jsonschema.inline_refs`` stops at the budget), :data:`MAX_SERVER_SCHEMA_NODES`
  for all of one server's tools (they are in every model call's step schema);
- checking arguments: :data:`MAX_VALIDATION_STEPS` checks (``cogency._jsonschema.validate``,
  whose patterns share a time limit).

The budgets admit every tool of the reference servers (tests/mcp_servers.py) and of the
GitHub MCP server (measured on its published tool snapshots: 117 tools, 6,288 schema nodes
in all, 354 in the largest; its listing is 14,509 items).
"""

from __future__ import annotations

import re

MAX_MESSAGE_ITEMS = 40_000
"""JSON items in one message from a server: each string, and each ``{``, ``[``, ``,`` and
``:`` outside strings (about two per value). A longer message is not parsed."""
MAX_CONTENT_BLOCKS = 1_000
"""Content blocks in one tool result; a result with more is not read."""
MAX_SCHEMA_NODES = 5_000
"""Nodes (values and keys) of one tool's input schema once its ``$ref``s are inlined."""
MAX_SERVER_SCHEMA_NODES = 20_000
"""Nodes of all of one server's tool schemas together."""
MAX_VALIDATION_STEPS = 5_000
"""Checks spent on one call's arguments (a value against a schema is one, an ``enum`` costs
its length)."""
MAX_DEPTH = 8
"""Levels of schemas nested in schemas inlined (and references followed one inside
another); deeper ones become ``{}`` (any value), as recursive ones do after one level."""


# -- messages ---------------------------------------------------------------------------------

_MARKS = b'"{[,:'
_NOT_MARKS = bytes(b for b in range(256) if b not in _MARKS)
_STRING = re.compile(rb'"[^"]*"')


def json_items(data: bytes, limit: int = MAX_MESSAGE_ITEMS) -> int:
    """At least as many as the items parsing ``data`` (one JSON text) makes: its strings and
    the ``{ [ , :`` outside them; over ``limit`` only if they are.

    From the bytes alone, in C, with no object per value: escaped backslashes and quotes are
    dropped (pairing runs of backslashes from the left, as JSON does), so every quote left
    opens or closes a string; only when a quick bound passes ``limit`` are the strings'
    insides cut out (at most ``limit`` of them) to count what is outside them exactly.
    """
    if len(data) <= limit:
        return len(data)  # every item takes a byte: the bound is the length
    plain = data
    if b"\\" in plain:  # a quick look (memchr) saves two passes over most messages
        plain = plain.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = plain.translate(None, _NOT_MARKS)
    quotes = marks.count(b'"')
    strings = (quotes + 1) // 2
    if strings > limit:
        return strings
    outside = len(marks) - quotes  # an upper bound: marks inside strings are counted too
    if strings + outside <= limit:
        return strings + outside
    return strings + len(_STRING.sub(b"", marks)) - quotes % 2
