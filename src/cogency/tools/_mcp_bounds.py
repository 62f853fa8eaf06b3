"""Bounds on the work an MCP server can make this process do on its event loop.

A server chooses the bytes of every message, the tool schemas the model is shown, and so the
work of checking the model's arguments: a few kB of nested ``$ref``/``anyOf`` once took
minutes to inline or to check, and a 4 MB message of small values half a second to parse,
with every run of the process waiting. Each kind of work here has a budget, counted as it is
done, and stops at it:

- a message: :data:`MAX_MESSAGE_ITEMS`, counted from its bytes before it is parsed
  (:func:`json_items`, a few C-speed passes: 2 ms for 4 MB of text, more for 4 MB full of
  escapes), and
  :data:`MAX_CONTENT_BLOCKS` per result (each block becomes a model object);
- a tool's schema: :data:`MAX_SCHEMA_NODES` once its ``$ref``s are inlined
  (:func:`inline_refs` stops at the budget), :data:`MAX_SERVER_SCHEMA_NODES` for all of one
  server's tools (they are in every model call's step schema);
- checking arguments: :data:`MAX_VALIDATION_STEPS` keyword checks (:func:`check_args`).

The budgets admit every tool of the reference servers (tests/mcp_servers.py) and of the
GitHub MCP server (measured on its published tool snapshots: 117 tools, 6,288 schema nodes
in all, 354 in the largest; its listing is 14,509 items).
"""

from __future__ import annotations

import contextvars
import functools
import re
from typing import Any
from urllib.parse import unquote

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
"""Keyword checks (an ``enum`` costs its length) spent on one call's arguments."""
MAX_DEPTH = 8
"""Levels of schemas nested in schemas inlined; deeper ones become ``{}`` (any value), as
recursive ones do."""
_MAX_REF_CHARS = 1_000


class OverBudget(Exception):
    """Work stopped at its budget: ``spent`` is how much was done (just past the budget)."""

    def __init__(self, message: str, spent: int) -> None:
        super().__init__(message)
        self.spent = spent


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


# -- schemas ----------------------------------------------------------------------------------

_DROPPED = frozenset(("$defs", "definitions", "$schema", "$id", "$anchor", "$dynamicAnchor",
                      "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "$comment"))
_NAMED = frozenset(("properties", "patternProperties", "dependentSchemas"))
"""Keywords whose value maps names (any text, "$id" too) to schemas."""
_DATA = frozenset(("enum", "const", "default", "examples", "required"))
"""Keywords whose value is data, never a schema: copied, counted, not looked into."""


def inline_refs(
    schema: dict[str, Any], budget: int = MAX_SCHEMA_NODES
) -> tuple[dict[str, Any], int]:
    """``schema`` with its local ``$ref``s (JSON pointers, ``#/$defs/Name`` and the like)
    replaced by what they point at, without ``$defs``/``$schema``/``$id``: a tool's parameters
    are embedded in the step schema, where ``#/...`` would point elsewhere.

    A ref into itself (recursion), to nowhere or to another document becomes ``{}`` (any
    value), as does a schema nested deeper than :data:`MAX_DEPTH`. Raises
    :class:`OverBudget` as soon as the result has more than ``budget`` nodes (values and
    keys): the work is bounded by the budget, whatever the refs multiply to. Returns the
    schema and its nodes.
    """
    made = 0

    def count(n: int = 1) -> None:
        nonlocal made
        made += n
        if made > budget:
            raise OverBudget(f"over {budget:,} nodes once its $refs are inlined", made)

    def walk(node: Any, depth: int, active: frozenset[str]) -> Any:
        """``node``, in a schema's place (or a list of schemas), inlined."""
        count()
        if isinstance(node, list):
            return [walk(item, depth, active) for item in node]
        if not isinstance(node, dict):
            return node
        if depth > MAX_DEPTH:
            return {}
        if "$ref" in node:
            ref = node["$ref"]
            target = _pointer(schema, ref) if isinstance(ref, str) and ref not in active else None
            if target is None:
                return {}
            inner = walk(target, depth, active | {ref})
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return {**inner, **walk(rest, depth, active)} if rest else inner
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED:
                continue
            count()
            if key in _DATA:
                count(_size(value, budget - made))
                out[key] = value
            elif key in _NAMED and isinstance(value, dict):
                count(len(value))
                out[key] = {name: walk(sub, depth + 1, active) for name, sub in value.items()}
            elif isinstance(value, (dict, list)):
                out[key] = walk(value, depth + 1, active)
            else:
                count()
                out[key] = value
        return out

    result = walk(schema, 0, frozenset())
    return {**result, "type": "object"}, made


def _pointer(root: dict[str, Any], ref: str) -> dict[str, Any] | None:
    """What a local ``$ref`` (``#`` or ``#/a/b``, RFC 6901) points at, if it is a schema."""
    if len(ref) > _MAX_REF_CHARS or not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    node: Any = root
    if fragment:
        if not fragment.startswith("/"):
            return None  # an anchor: not followed
        for part in fragment[1:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
    return node if isinstance(node, dict) else None


def _size(value: Any, limit: int) -> int:
    """Nodes in ``value`` (values and keys), counted up to just past ``limit``; nesting
    deeper than 32 levels counts as over (later walks of it would recurse that deep)."""
    seen = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and seen <= limit:
        item, depth = stack.pop()
        seen += 1
        if depth > 32:
            return limit + 1
        if isinstance(item, dict):
            seen += len(item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return seen


_SUBSCHEMA_LISTS = frozenset(("anyOf", "allOf", "oneOf", "prefixItems", "items"))
_SUBSCHEMA = frozenset(("additionalProperties", "items", "not", "if", "then", "else",
                        "contains", "propertyNames", "additionalItems"))
_UNCHECKED = frozenset(("pattern", "patternProperties", "unevaluatedProperties",
                        "unevaluatedItems"))


def checkable(schema: Any) -> Any:
    """An inlined schema as arguments are checked against it: without ``pattern`` and
    ``patternProperties`` (a server's regex run on the model's text on the event loop could
    take forever: Python's ``re`` has no time limit) nor ``unevaluated*`` (which look through a
    schema again for every value). Each drop only lets more through; the server checks its
    own schema in full."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _UNCHECKED:
            continue
        if key in _NAMED and isinstance(value, dict):
            out[key] = {name: checkable(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [checkable(sub) for sub in value]
        elif key in _SUBSCHEMA:
            out[key] = checkable(value)
        else:
            out[key] = value
    if "patternProperties" in schema:  # what its patterns matched is no longer "additional"
        out.pop("additionalProperties", None)
    return out


# -- checking arguments -----------------------------------------------------------------------

_steps: contextvars.ContextVar[list[int]] = contextvars.ContextVar("cogency_mcp_steps")
"""Keyword checks spent, and the budget, of the check_args call running."""


def check_args(schema: dict[str, Any], args: Any, budget: int = MAX_VALIDATION_STEPS) -> list[Any]:
    """The jsonschema errors of ``args`` against ``schema`` (a :func:`checkable` one), first
    the shallowest. Raises :class:`OverBudget` once ``budget`` keyword checks are spent."""
    validator = _validator(schema)
    token = _steps.set([0, budget])
    try:
        errors = list(validator.iter_errors(args))
    finally:
        _steps.reset(token)
    return sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])


def _validator(schema: dict[str, Any]) -> Any:
    from jsonschema import validators

    base = validators.validator_for(schema, default=validators.Draft202012Validator)
    return _counted(base)(schema)


@functools.cache
def _counted(base: Any) -> Any:
    """``base`` (a jsonschema draft's validator class) charging every keyword check to the
    budget of the :func:`check_args` call it runs in."""
    from jsonschema import validators

    def charged(keyword: str, check: Any) -> Any:
        def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            spent = _steps.get()
            spent[0] += _cost(keyword, value, instance)
            if spent[0] > spent[1]:
                raise OverBudget(f"over {spent[1]:,} keyword checks", spent[0])
            return check(validator, value, instance, schema)

        return run

    return validators.extend(base, {k: charged(k, f) for k, f in base.VALIDATORS.items()})


def _cost(keyword: str, value: Any, instance: Any) -> int:
    if keyword == "enum" and isinstance(value, list):
        return 1 + len(value)
    if keyword == "uniqueItems" and value is True and isinstance(instance, list):
        n = len(instance)  # sorted when it can be; else every pair compared
        if any(isinstance(item, (dict, list)) for item in instance):
            return 1 + n * n // 2
        return 1 + n
    return 1
