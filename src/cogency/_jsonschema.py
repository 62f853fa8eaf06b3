"""JSON Schema, checked with bounded work: tool arguments, a client's tool definitions, an
answer's format.

Schemas can come from outside (an MCP server, an HTTP client) and so can the values checked
against them (a model's reply): :func:`validate` stops after :data:`MAX_STEPS` checks and
gives each ``pattern`` a time limit (the ``regex`` package, which releases the GIL), so no
schema and no value can hold the event loop. :func:`inline_refs` replaces local ``$ref``\\ s
by what they point at, within a bound on the result's size, so a schema can be embedded in
the step schema and sent to any provider.

The keywords checked: ``type``, ``enum``, ``const``, ``anyOf``, ``oneOf``, ``allOf``,
``not``, ``properties``, ``required``, ``additionalProperties``, ``items``, ``prefixItems``,
``minItems``, ``maxItems``, ``minProperties``, ``maxProperties``, ``minLength``,
``maxLength``, ``pattern``, ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``, ``multipleOf``; others (``format``, ``description``…) are annotations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import regex as _regex

MAX_STEPS = 100_000
"""Checks one :func:`validate` may make (a value node against a schema node counts one)."""
PATTERN_SECONDS = 0.05
"""Time a ``pattern`` may take on one string."""
MAX_NODES = 20_000
"""Schema nodes :func:`inline_refs` may produce (references can multiply a small schema)."""


class SchemaViolation(ValueError):
    """``value`` does not match the schema; the message starts with where (``args.city``)."""


class _TooCostly(SchemaViolation):
    """The check ran out of its :data:`MAX_STEPS`: no option may be tried further."""


class SchemaError(ValueError):
    """The schema cannot be used: a recursive or unresolvable reference, or too large."""


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: Any, path: str = "value", noun: str = "property") -> None:
    """Raise :class:`SchemaViolation` unless ``value`` matches ``schema`` (a dict or a bool).

    ``path`` names the value in messages and ``noun`` its keys ("argument", "property").
    """
    _Check(noun).run(value, schema, path)


class _Check:
    def __init__(self, noun: str) -> None:
        self.noun = noun
        self.steps = 0

    def fail(self, path: str, message: str) -> None:
        raise SchemaViolation(f"{path} {message}")

    def run(self, value: Any, spec: Any, path: str) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _TooCostly(
                f"{path} could not be checked: it and its schema need more than {MAX_STEPS:,} "
                "checks (simplify the schema)"
            )
        if spec is True or spec is None:
            return
        if spec is False or not isinstance(spec, dict):
            self.fail(path, "is not allowed here")
            return
        self.combinators(value, spec, path)
        if "enum" in spec and isinstance(spec["enum"], list) and not _among(value, spec["enum"]):
            listed = ", ".join(_show(v) for v in spec["enum"][:20])
            self.fail(path, f"must be one of {listed}, got {describe(value)}")
        if "const" in spec and not _among(value, [spec["const"]]):
            self.fail(path, f"must be {_show(spec['const'])}, got {describe(value)}")
        kind = spec.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not any(_JSON_TYPES[k](value) for k in kinds if k in _JSON_TYPES):
                self.fail(path, f"must be {'/'.join(map(str, kinds))}, got {describe(value)}")
        if isinstance(value, float) and value != value:
            self.fail(path, "must be a number, got NaN")
        if isinstance(value, str):
            self.string(value, spec, path)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self.number(value, spec, path)
        elif isinstance(value, list):
            self.array(value, spec, path)
        elif isinstance(value, dict):
            self.object(value, spec, path)

    def passes(self, value: Any, spec: Any, path: str) -> bool:
        try:
            self.run(value, spec, path)
        except _TooCostly:
            raise
        except SchemaViolation:
            return False
        return True

    def combinators(self, value: Any, spec: dict[str, Any], path: str) -> None:
        for option in _list(spec.get("allOf")):
            self.run(value, option, path)
        options = _list(spec.get("anyOf"))
        if options and not any(self.passes(value, option, path) for option in options):
            self.fail(path, f"must be {type_name(spec)}, got {describe(value)}")
        options = _list(spec.get("oneOf"))
        if options and sum(self.passes(value, option, path) for option in options) != 1:
            self.fail(path, f"must match exactly one of {type_name({'anyOf': options})}, got "
                            f"{describe(value)}")
        if "not" in spec and self.passes(value, spec["not"], path):
            self.fail(path, f"must not match {type_name(spec['not'])}")

    def string(self, value: str, spec: dict[str, Any], path: str) -> None:
        if _number(spec.get("maxLength")) is not None and len(value) > spec["maxLength"]:
            self.fail(path, f"is longer than {spec['maxLength']} characters")
        if _number(spec.get("minLength")) is not None and len(value) < spec["minLength"]:
            self.fail(path, f"is shorter than {spec['minLength']} characters")
        pattern = spec.get("pattern")
        if isinstance(pattern, str) and not _matches(pattern, value):
            self.fail(path, f"must match the pattern {pattern[:80]!r}")

    def number(self, value: float, spec: dict[str, Any], path: str) -> None:
        bounds = (("minimum", lambda b: value >= b, "at least"),
                  ("maximum", lambda b: value <= b, "at most"),
                  ("exclusiveMinimum", lambda b: value > b, "more than"),
                  ("exclusiveMaximum", lambda b: value < b, "less than"))
        for key, holds, words in bounds:
            bound = _number(spec.get(key))
            if bound is not None and not holds(bound):
                self.fail(path, f"must be {words} {bound:g}, got {value:g}")
        step = _number(spec.get("multipleOf"))
        if step and abs(value / step - round(value / step)) > 1e-9:
            self.fail(path, f"must be a multiple of {step:g}")

    def array(self, value: list[Any], spec: dict[str, Any], path: str) -> None:
        if _number(spec.get("maxItems")) is not None and len(value) > spec["maxItems"]:
            self.fail(path, f"has more than {spec['maxItems']} items")
        if _number(spec.get("minItems")) is not None and len(value) < spec["minItems"]:
            self.fail(path, f"has fewer than {spec['minItems']} items")
        prefix = _list(spec.get("prefixItems"))
        for index, item in enumerate(value):
            rule = prefix[index] if index < len(prefix) else spec.get("items", True)
            self.run(item, rule, f"{path}[{index}]")

    def object(self, value: dict[str, Any], spec: dict[str, Any], path: str) -> None:
        props = spec.get("properties")
        props = props if isinstance(props, dict) else {}
        for key in _list(spec.get("required")):
            if key not in value:
                self.fail(path, f"is missing the required {self.noun} {key!r}")
        most, least = _number(spec.get("maxProperties")), _number(spec.get("minProperties"))
        if most is not None and len(value) > most:
            self.fail(path, f"has more than {most:g} {self.noun}s")
        if least is not None and len(value) < least:
            self.fail(path, f"has fewer than {least:g} {self.noun}s")
        extra = spec.get("additionalProperties", True)
        for key, item in value.items():
            if not isinstance(key, str):
                self.fail(path, "has a non-string key")
            if key in props:
                self.run(item, props[key], f"{path}.{key}")
            elif extra is False:
                allowed = ", ".join(list(props)[:30]) or "none"
                self.fail(path, f"has an unknown {self.noun} {key[:80]!r} (allowed: {allowed})")
            elif isinstance(extra, dict):
                self.run(item, extra, f"{path}.{key}")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def _among(value: Any, options: list[Any]) -> bool:
    # JSON equality: 1 == 1.0 but True != 1 (Python's == says True == 1).
    return any(type(value) is type(option) and value == option
               or _JSON_TYPES["number"](value) and _JSON_TYPES["number"](option)
               and value == option for option in options)


def _matches(pattern: str, text: str) -> bool:
    try:
        return _regex.search(pattern, text, timeout=PATTERN_SECONDS, concurrent=True) is not None
    except (_regex.error, OverflowError, RecursionError):
        return True  # a pattern this engine cannot read is not the value's fault
    except TimeoutError:
        return False


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


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
        name = ref.rsplit("/", 1)[-1]
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
        fields = [f"{key}: {_name(value, defs, depth + 1)}"
                  f"{'' if key in required else ' = optional'}"
                  for key, value in list(props.items())[:_NAME_ITEMS]]
        return "{" + ", ".join(fields) + (", …" if len(props) > _NAME_ITEMS else "") + "}"
    if isinstance(kind, list):
        return " | ".join(map(str, kind))
    if isinstance(spec.get("format"), str) and kind == "string":
        return f"string ({spec['format']})"
    return str(kind or "any")


def describe(value: Any) -> str:
    """A value in a few words for an error message: its type and the start of it."""
    try:
        if isinstance(value, str):
            text = repr(value)
        else:
            text = json.dumps(value, ensure_ascii=False, default=repr)
    except (RecursionError, ValueError):  # hostile input: nested past the recursion limit
        text = "(nested too deeply to show)"
    kind = type(value).__name__
    return f"{kind} {text[:60]}{'…' if len(text) > 60 else ''}"


# -- references ------------------------------------------------------------------------------

_LOCAL_REF = re.compile(r"#/(?:\$defs|definitions)/(.+)")


def inline_refs(schema: dict[str, Any], *, lenient: bool = False) -> dict[str, Any]:
    """``schema`` with its local ``$ref``\\ s (``#/$defs/…``, ``#/definitions/…``) replaced by
    what they point at, without ``$defs``, ``definitions``, ``$schema`` and ``$id`` (it is
    embedded in the step schema, where ``#/…`` would point elsewhere). A copy.

    A recursive or unknown reference, or a result over :data:`MAX_NODES` nodes, raises
    :class:`SchemaError`; with ``lenient`` such a reference becomes ``{}`` (any value).
    """
    defs = {**_dict(schema.get("definitions")), **_dict(schema.get("$defs"))}
    made = 0

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        nonlocal made
        made += 1
        if made > MAX_NODES:
            raise SchemaError(f"the schema is too large once its references are inlined "
                              f"(more than {MAX_NODES:,} parts)")
        if len(seen) > 32:
            raise SchemaError("the schema nests references more than 32 deep")
        if isinstance(node, list):
            return [walk(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            match = _LOCAL_REF.fullmatch(ref)
            name = match.group(1) if match else None
            if name is None or name not in defs or name in seen:
                if lenient:
                    return walk(rest, seen)
                why = "refers to itself" if name in seen else "cannot be resolved (only "\
                      "#/$defs/NAME and #/definitions/NAME are)"
                raise SchemaError(f"the reference {ref[:80]!r} {why}")
            target = walk(defs[name], (*seen, name))
            return {**target, **walk(rest, seen)} if isinstance(target, dict) else target
        return {key: walk(value, seen) for key, value in node.items()
                if key not in ("$defs", "definitions", "$schema", "$id")}

    try:
        result = walk(schema, ())
    except RecursionError as exc:
        raise SchemaError("the schema is nested too deeply") from exc
    return result if isinstance(result, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


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
