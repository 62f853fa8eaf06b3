"""JSON Schema, with bounded work: tool arguments (the agent's tools, an MCP server's, a
client's), a client's tool definitions, an answer's format.

Schemas come from outside (an MCP server, an HTTP client) and so do the values checked
against them (a model's reply), and both are handled on the event loop every run shares, so
each kind of work stops at a budget, counted as it is done:

- :func:`inline_refs` replaces local ``$ref``\\ s (JSON pointers) by what they point at, so a
  schema can be embedded in the step schema and sent to any provider; a result of more than
  ``budget`` nodes raises :class:`SchemaTooLarge` as soon as it is made (a few kB of nested
  refs can multiply to millions);
- :func:`validate` stops after ``budget`` checks (:class:`TooCostly`), and every ``pattern``
  it tries shares :data:`PATTERN_SECONDS` (the ``regex`` package's time limit); a pattern
  longer than :data:`MAX_PATTERN_CHARS`, or whose counted repeats could make the regex
  compiler copy more than :data:`MAX_PATTERN_COPIES` nodes (``(a{1000}){1000}`` takes
  ``regex`` 0.6 s to compile, ``(a{10000}){10000}`` all the memory), is not tried.

The keywords checked: ``type``, ``enum``, ``const``, ``anyOf``, ``oneOf``, ``allOf``,
``not``, ``properties``, ``patternProperties``, ``required``, ``additionalProperties``,
``items`` (a schema, or a list as in draft 7), ``prefixItems``, ``additionalItems``,
``minItems``, ``maxItems``, ``minProperties``, ``maxProperties``, ``minLength``,
``maxLength``, ``pattern``, ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``, ``multipleOf``. Others (``format``, ``if``, ``unevaluatedProperties``…)
are not checked, and a pattern not tried passes: each only lets more values through (an MCP
server checks its own schema in full).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import regex as _regex

MAX_STEPS = 100_000
"""Checks one :func:`validate` may make by default (a value node against a schema node
counts one, an ``enum`` its length, a ``required`` its length)."""
PATTERN_SECONDS = 0.02
"""Time the ``pattern``\\ s of one :func:`validate` may take together (compiling them too)."""
MAX_PATTERN_CHARS = 1_000
"""A longer ``pattern`` is not tried (compiling it could take longer than its time limit)."""
MAX_PATTERN_COPIES = 10_000
"""A ``pattern`` whose counted repeats (``{n}``) could make more nodes than this is not tried."""
MAX_NODES = 20_000
"""Schema nodes (values and keys) :func:`inline_refs` may make by default."""
MAX_DEPTH = 32
"""Schemas nested in schemas, and references followed one inside another, that
:func:`inline_refs` follows."""


class SchemaViolation(ValueError):
    """``value`` does not match the schema; the message starts with where (``args.city``)."""


class TooCostly(SchemaViolation):
    """The check ran out of its budget of checks, or of pattern time: no option may be tried
    further. ``spent``: the checks made (just past the budget when that ran out)."""

    def __init__(self, message: str, spent: int) -> None:
        super().__init__(message)
        self.spent = spent


class SchemaError(ValueError):
    """The schema cannot be used: a recursive or unresolvable reference, or too deep."""


class SchemaTooLarge(SchemaError):
    """:func:`inline_refs` stopped at its budget; ``spent``: the nodes made (just past it)."""

    def __init__(self, budget: int, spent: int) -> None:
        super().__init__(f"the schema has over {budget:,} nodes once its references are "
                         "inlined")
        self.budget, self.spent = budget, spent


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: Any, path: str = "value", noun: str = "property", *,
             budget: int = MAX_STEPS) -> None:
    """Raise :class:`SchemaViolation` unless ``value`` matches ``schema`` (a dict or a bool),
    :class:`TooCostly` when that takes more than ``budget`` checks or :data:`PATTERN_SECONDS`
    of patterns.

    ``path`` names the value in messages and ``noun`` its keys ("argument", "property").
    """
    check = _Check(noun, budget)
    try:
        check.run(value, schema, path)
    except RecursionError:
        raise TooCostly(f"{path} could not be checked: it nests too deeply", check.steps) \
            from None


_COMBINATORS = frozenset(("allOf", "anyOf", "oneOf", "not"))
_STRING_KEYS = frozenset(("maxLength", "minLength", "pattern"))
_NUMBER_KEYS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                          "multipleOf"))
_ARRAY_KEYS = frozenset(("maxItems", "minItems", "items", "prefixItems", "additionalItems"))
_OBJECT_KEYS = frozenset(("properties", "patternProperties", "required", "maxProperties",
                          "minProperties", "additionalProperties"))


class _Quiet(SchemaViolation):
    """A failure inside an option being tried: its message is never made."""


class _Check:
    def __init__(self, noun: str, budget: int) -> None:
        self.noun = noun
        self.steps = 0
        self.budget = budget
        self.pattern_time = PATTERN_SECONDS
        self.trying = 0  # options being tried (anyOf…): their failures need no message

    def fail(self, path: str, message: Callable[[], str]) -> None:
        if self.trying:
            raise _Quiet
        raise SchemaViolation(f"{path} {message()}")

    def spend(self, path: str, steps: int) -> None:
        self.steps += steps
        if self.steps > self.budget:
            raise TooCostly(f"{path} could not be checked: it and its schema need more than "
                            f"{self.budget:,} checks", self.steps)

    def run(self, value: Any, spec: Any, path: str) -> None:
        # The hot path: each keyword group is looked at only when the schema has one of it.
        self.steps += 1
        if self.steps > self.budget:
            self.spend(path, 0)
        if spec is True or spec is None:
            return
        if spec is False or not isinstance(spec, dict):
            self.fail(path, lambda: "is not allowed here")
            return
        if not spec:
            return
        if not _COMBINATORS.isdisjoint(spec):
            self.combinators(value, spec, path)
        if "enum" in spec and isinstance(spec["enum"], list):
            self.spend(path, len(spec["enum"]))
            if not _among(value, spec["enum"]):
                self.fail(path, lambda: "must be one of " + ", ".join(
                    _show(v) for v in spec["enum"][:20]) + f", got {describe(value)}")
        if "const" in spec and not _among(value, [spec["const"]]):
            self.fail(path, lambda: f"must be {_show(spec['const'])}, got {describe(value)}")
        kind = spec.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not any(_JSON_TYPES[k](value) for k in kinds[:8]
                       if isinstance(k, str) and k in _JSON_TYPES):
                self.fail(path, lambda: f"must be {'/'.join(map(str, kinds[:8]))}, got "
                                        f"{describe(value)}")
        if isinstance(value, str):
            if not _STRING_KEYS.isdisjoint(spec):
                self.string(value, spec, path)
        elif isinstance(value, bool):
            return
        elif isinstance(value, (int, float)):
            if value != value:
                self.fail(path, lambda: "must be a number, got NaN")
            if not _NUMBER_KEYS.isdisjoint(spec):
                self.number(value, spec, path)
        elif isinstance(value, list):
            if not _ARRAY_KEYS.isdisjoint(spec):
                self.array(value, spec, path)
        elif isinstance(value, dict):
            if not _OBJECT_KEYS.isdisjoint(spec):
                self.object(value, spec, path)

    def passes(self, value: Any, spec: Any, path: str) -> bool:
        self.trying += 1
        try:
            self.run(value, spec, path)
        except TooCostly:
            raise
        except SchemaViolation:
            return False
        finally:
            self.trying -= 1
        return True

    def combinators(self, value: Any, spec: dict[str, Any], path: str) -> None:
        for option in _list(spec.get("allOf")):
            self.run(value, option, path)
        options = _list(spec.get("anyOf"))
        if options and not any(self.passes(value, option, path) for option in options):
            self.fail(path, lambda: f"must be {type_name(spec)}, got {describe(value)}")
        options = _list(spec.get("oneOf"))
        if options and sum(self.passes(value, option, path) for option in options) != 1:
            self.fail(path, lambda: f"must match exactly one of {type_name({'anyOf': options})}"
                                    f", got {describe(value)}")
        if "not" in spec and self.passes(value, spec["not"], path):
            self.fail(path, lambda: f"must not match {type_name(spec['not'])}")

    def string(self, value: str, spec: dict[str, Any], path: str) -> None:
        most, least = _number(spec.get("maxLength")), _number(spec.get("minLength"))
        if most is not None and len(value) > most:
            self.fail(path, lambda: f"is longer than {_num(most)} characters")
        if least is not None and len(value) < least:
            self.fail(path, lambda: f"is shorter than {_num(least)} characters")
        pattern = spec.get("pattern")
        if isinstance(pattern, str) and self.search(pattern, value, path) is False:
            self.fail(path, lambda: f"must match the pattern {pattern[:80]!r}")

    def search(self, pattern: str, text: str, path: str) -> bool | None:
        """Whether ``pattern`` matches in ``text``; None when it is not tried (see the
        module's docstring). Its time is taken from the check's :data:`PATTERN_SECONDS`."""
        started = time.perf_counter()
        try:
            if self.pattern_time <= 0:  # spent by earlier patterns (compiling is not timed)
                raise TimeoutError
            compiled = _compiled(pattern)
            if compiled is None:
                return None
            left = self.pattern_time - (time.perf_counter() - started)
            if left <= 0:  # spent compiling it
                raise TimeoutError
            return compiled.search(text, timeout=left, concurrent=True) is not None
        except TimeoutError:
            raise TooCostly(f"{path} could not be checked: its patterns need more than "
                            f"{PATTERN_SECONDS * 1000:g} ms", self.steps) from None
        finally:
            self.pattern_time -= time.perf_counter() - started

    def number(self, value: float, spec: dict[str, Any], path: str) -> None:
        bounds = (("minimum", lambda b: value >= b, "at least"),
                  ("maximum", lambda b: value <= b, "at most"),
                  ("exclusiveMinimum", lambda b: value > b, "more than"),
                  ("exclusiveMaximum", lambda b: value < b, "less than"))
        for key, holds, words in bounds:
            bound = _number(spec.get(key))
            if bound is not None and not holds(bound):
                self.fail(path, lambda: f"must be {words} {_num(bound)}, got {_num(value)}")
        step = _number(spec.get("multipleOf"))
        if step and not _multiple(value, step):
            self.fail(path, lambda: f"must be a multiple of {_num(step)}")

    def array(self, value: list[Any], spec: dict[str, Any], path: str) -> None:
        most, least = _number(spec.get("maxItems")), _number(spec.get("minItems"))
        if most is not None and len(value) > most:
            self.fail(path, lambda: f"has more than {_num(most)} items")
        if least is not None and len(value) < least:
            self.fail(path, lambda: f"has fewer than {_num(least)} items")
        items = spec.get("items", True)
        if isinstance(items, list):  # draft 7's tuple form
            prefix, rest = items, spec.get("additionalItems", True)
        else:
            prefix, rest = _list(spec.get("prefixItems")), items
        for index, item in enumerate(value):
            self.run(item, prefix[index] if index < len(prefix) else rest, f"{path}[{index}]")

    def object(self, value: dict[str, Any], spec: dict[str, Any], path: str) -> None:
        props = spec.get("properties")
        props = props if isinstance(props, dict) else {}
        required = _list(spec.get("required"))
        self.spend(path, len(required))
        for key in required:
            if key not in value:
                self.fail(path, lambda: f"is missing the required {self.noun} {key!r}")
        most, least = _number(spec.get("maxProperties")), _number(spec.get("minProperties"))
        if most is not None and len(value) > most:
            self.fail(path, lambda: f"has more than {_num(most)} {self.noun}s")
        if least is not None and len(value) < least:
            self.fail(path, lambda: f"has fewer than {_num(least)} {self.noun}s")
        patterned = spec.get("patternProperties")
        patterned = patterned if isinstance(patterned, dict) else {}
        extra = spec.get("additionalProperties", True)
        for key, item in value.items():
            if not isinstance(key, str):
                self.fail(path, lambda: "has a non-string key")
            where = f"{path}.{key}"
            matched = key in props
            if matched:
                self.run(item, props[key], where)
            for pattern, rule in patterned.items():
                self.spend(where, 1)
                found = self.search(pattern, key, where)
                if found:
                    self.run(item, rule, where)
                matched = matched or found is not False  # a pattern not tried may match
            if matched:
                continue
            if extra is False:
                self.fail(path, lambda: f"has an unknown {self.noun} {key[:80]!r} (allowed: "
                                        f"{', '.join(itertools.islice(props, 30)) or 'none'})")
            elif isinstance(extra, dict):
                self.run(item, extra, where)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def _num(value: float) -> str:
    """A number for a message (an integer of thousands of digits too)."""
    if isinstance(value, int):
        text = str(value) if abs(value) < 10 ** 60 else f"an integer of {len(str(value))} digits"
        return text
    return f"{value:g}"


def _multiple(value: float, step: float) -> bool:
    try:
        ratio = value / step
        return abs(ratio - round(ratio)) <= 1e-9
    except (OverflowError, ValueError):  # too large to tell as floats: not refused
        return True


def _among(value: Any, options: list[Any]) -> bool:
    # JSON equality: 1 == 1.0 but True != 1 (Python's == says True == 1).
    return any(type(value) is type(option) and value == option
               or _JSON_TYPES["number"](value) and _JSON_TYPES["number"](option)
               and value == option for option in options)


_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    """``pattern`` compiled, or None when it is not tried: too long, too many copies once its
    counted repeats are expanded, or a pattern the engine cannot read (the schema's fault,
    not the value's)."""
    if len(pattern) > MAX_PATTERN_CHARS or _copies(pattern) > MAX_PATTERN_COPIES:
        return None
    try:
        return _regex.compile(pattern)
    except (_regex.error, OverflowError, RecursionError, ValueError, MemoryError):
        return None


def _copies(pattern: str) -> int:
    """At least as many nodes as compiling ``pattern`` can make: each counted repeat
    (``{n}``, ``{n,m}``) multiplies what it repeats by its largest count, alternatives add."""
    groups = [0]  # the size of each group open, so far
    last = 0  # the size of what a quantifier would repeat
    at = 0
    while at < len(pattern):
        char = pattern[at]
        counted = _COUNTED.match(pattern, at) if char == "{" else None
        if counted and (counted.group(1) or counted.group(2)):
            times = max(_count(counted.group(1)), _count(counted.group(2)), 1)
            groups[-1] += last * (times - 1)
            last *= times
            at = counted.end()
            if groups[-1] > MAX_PATTERN_COPIES:
                return groups[-1]
            continue
        if char == "(":
            groups.append(0)
            last, at = 0, at + 1
            continue
        size = 1
        if char == "\\":
            at += 1
        elif char == "[":  # a class is one node: on to its closing "]"
            at += 1 + pattern.startswith("^", at + 1)
            at += pattern.startswith("]", at)
            while at < len(pattern) and pattern[at] != "]":
                at += 2 if pattern[at] == "\\" else 1
        elif char == ")" and len(groups) > 1:
            size = groups.pop() + 1
        groups[-1] += size
        last, at = size, at + 1
    return sum(groups)


def _count(digits: str | None) -> int:
    return int(digits) if digits and len(digits) < 10 else (10 ** 10 if digits else 0)


def _show(value: Any) -> str:
    """``value`` as JSON for a message, at most 60 characters, in work bounded however large
    the value is."""
    try:
        text = json.dumps(_clipped(value, 0), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(_clipped(value, 0))
    return text if len(text) <= 60 else text[:60] + "…"


def _clipped(value: Any, depth: int) -> Any:
    """A small copy of ``value`` showing its start: strings, lists and objects cut."""
    if isinstance(value, str):
        return value[:61]
    if depth > 3 or isinstance(value, int) and not isinstance(value, bool) and \
            abs(value) >= 10 ** 60:
        return "…"
    if isinstance(value, list):
        return [_clipped(item, depth + 1) for item in value[:8]] + (["…"] if value[8:] else [])
    if isinstance(value, dict):
        shown = {str(key)[:61]: _clipped(item, depth + 1)
                 for key, item in itertools.islice(value.items(), 8)}
        return {**shown, "…": "…"} if len(value) > 8 else shown
    return value


def type_name(spec: Any, defs: Any = None) -> str:
    """A schema in a few words for a prompt or a message: ``list[integer] | null``,
    ``"a" | "b"``, ``Point{x: integer, y: integer = optional}`` (named types from ``defs``, to a
    few levels); at most 200 characters however large the schema."""
    text = _name(spec, defs, 0)
    return text if len(text) <= 200 else text[:199] + "…"


_NAME_DEPTH = 3
_NAME_ITEMS = 12
"""How deep and how wide :func:`type_name` describes a type (a hostile schema stays short)."""


def _name(spec: Any, defs: Any, depth: int) -> str:
    if not isinstance(spec, dict):
        return "any"
    if depth > _NAME_DEPTH:
        return "…"
    ref = spec.get("$ref")
    if isinstance(ref, str):
        name = ref[:200].rsplit("/", 1)[-1]
        target = defs.get(name) if isinstance(defs, dict) else None
        if isinstance(target, dict) and depth < _NAME_DEPTH and "$ref" not in target:
            shown = _name(target, defs, depth + 1)
            return f"{name}{shown}" if shown.startswith("{") else shown
        return name
    if "const" in spec:
        return _show(spec["const"])
    if isinstance(spec.get("enum"), list):
        shown = " | ".join(_show(v) for v in spec["enum"][:_NAME_ITEMS])
        return shown + (" | …" if len(spec["enum"]) > _NAME_ITEMS else "")
    options = spec.get("anyOf", spec.get("oneOf"))
    if isinstance(options, list):
        shown = " | ".join(_name(s, defs, depth + 1) for s in options[:_NAME_ITEMS])
        return shown + (" | …" if len(options) > _NAME_ITEMS else "")
    kind = spec.get("type")
    if kind == "array" and isinstance(spec.get("prefixItems"), list):
        return "[" + ", ".join(_name(s, defs, depth + 1)
                               for s in spec["prefixItems"][:_NAME_ITEMS]) + "]"
    if kind == "array" and isinstance(spec.get("items"), dict):
        return f"list[{_name(spec['items'], defs, depth + 1)}]"
    props = spec.get("properties")
    if kind == "object" and isinstance(props, dict) and props and depth < _NAME_DEPTH:
        required = spec.get("required") or []
        fields = [f"{str(key)[:80]}: {_name(value, defs, depth + 1)}"
                  f"{'' if key in required else ' = optional'}"
                  for key, value in itertools.islice(props.items(), _NAME_ITEMS)]
        return "{" + ", ".join(fields) + (", …" if len(props) > _NAME_ITEMS else "") + "}"
    if isinstance(kind, list):
        return " | ".join(map(str, kind[:_NAME_ITEMS]))
    if isinstance(spec.get("format"), str) and kind == "string":
        return f"string ({spec['format'][:40]})"
    return str(kind or "any")[:40]


def describe(value: Any) -> str:
    """A value in a few words for an error message: its type and the start of it (in work
    bounded however large it is)."""
    text = repr(value[:61]) if isinstance(value, str) else _show(value)
    long = len(text) > 60 or isinstance(value, str) and len(value) > 61
    return f"{type(value).__name__} {text[:60]}{'…' if long else ''}"


# -- references ------------------------------------------------------------------------------

_DROPPED = frozenset(("$defs", "definitions", "$schema", "$id", "$anchor", "$dynamicAnchor",
                      "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "$comment"))
_NAMED = frozenset(("properties", "patternProperties", "dependentSchemas"))
"""Keywords whose value maps names (any text, "$ref" too) to schemas."""
_DATA = frozenset(("enum", "const", "default", "examples", "required"))
"""Keywords whose value is data, never a schema: copied, counted, not looked into."""
_MAX_REF_CHARS = 1_000


def inline_refs(schema: dict[str, Any], *, budget: int = MAX_NODES, strict: bool = True,
                max_depth: int = MAX_DEPTH) -> tuple[dict[str, Any], int]:
    """``schema`` with its local ``$ref``\\ s (JSON pointers: ``#/$defs/Name``, ``#``…)
    replaced by what they point at, without ``$defs``, ``$schema``, ``$id`` and the like (it
    is embedded in the step schema, where ``#/…`` would point elsewhere); a copy, and its
    nodes (values and keys).

    Raises :class:`SchemaTooLarge` as soon as the result has more than ``budget`` nodes:
    the work is bounded by the budget, whatever the references multiply to. A reference
    into itself (recursion), to nowhere or to another document, and schemas nested deeper
    than ``max_depth``, raise :class:`SchemaError` when ``strict``; otherwise each becomes
    ``{}`` (any value), a recursive one after it is inlined once.
    """
    made = 0

    def count(n: int = 1) -> None:
        nonlocal made
        made += n
        if made > budget:
            raise SchemaTooLarge(budget, made)

    def give_up(why: str) -> dict[str, Any]:
        if strict:
            raise SchemaError(why)
        return {}

    def walk(node: Any, depth: int, active: tuple[str, ...]) -> Any:
        """``node``, in a schema's place (or a list of schemas), inlined."""
        count()
        if isinstance(node, list):
            return [walk(item, depth, active) for item in node]
        if not isinstance(node, dict):
            return node
        if depth > max_depth:
            return give_up(f"the schema nests schemas more than {max_depth} levels deep")
        if "$ref" in node:
            ref = node["$ref"]
            shown = repr(ref[:80]) if isinstance(ref, str) else "that is not a string"
            if ref in active:
                inner = give_up(f"the reference {shown} refers to itself")
            elif len(active) >= max_depth:
                inner = give_up(f"the schema nests references more than {max_depth} deep")
            elif (target := _pointer(schema, ref)) is None:
                inner = give_up(f"the reference {shown} cannot be resolved (only local ones, "
                                "#/$defs/NAME and other #/… pointers, are)")
            else:
                inner = walk(target, depth, (*active, ref))
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

    try:
        result = walk(schema, 0, ())
    except RecursionError as exc:
        raise SchemaError("the schema is nested too deeply") from exc
    return (result if isinstance(result, dict) else {}), made


def _pointer(root: dict[str, Any], ref: Any) -> dict[str, Any] | None:
    """What a local ``$ref`` (``#`` or ``#/a/b``, RFC 6901) points at, if it is a schema."""
    if not isinstance(ref, str) or len(ref) > _MAX_REF_CHARS or not ref.startswith("#"):
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
    """Nodes in ``value`` (values and keys), counted up to just past ``limit``, without
    recursion; nesting deeper than 32 levels is a :class:`SchemaError` (later work on it
    would recurse that deep)."""
    seen = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and seen <= limit:
        item, level = stack.pop()
        seen += 1
        if level > 32:
            raise SchemaError("a value in the schema nests more than 32 levels deep")
        if isinstance(item, dict):
            seen += len(item)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return seen


def depth(schema: Any) -> int:
    """How deep ``schema`` nests (objects and lists), without recursion."""
    deepest, stack = 0, [(schema, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, dict):
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, level + 1) for child in node)
    return deepest
