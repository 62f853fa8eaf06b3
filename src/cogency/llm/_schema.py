"""The step schema (``reason.step_schema``) in the dialect each provider's structured output
accepts. Each provider supports a different subset of JSON Schema; sending a keyword it does
not know is an HTTP 400, so unknown keywords are dropped (the agent validates every reply
against the full contract anyway)."""

from __future__ import annotations

from typing import Any

_COMMON = {
    "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum",
    "description", "title", "$defs", "$ref", "format",
}
OPENAI_KEYWORDS = _COMMON | {
    "const", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems",
}
ANTHROPIC_KEYWORDS = _COMMON | {"const", "allOf"}
GEMINI_KEYWORDS = _COMMON | {
    "$id", "$anchor", "prefixItems", "minItems", "maxItems", "minimum", "maximum", "oneOf",
    "propertyOrdering",
}

_CHILD_MAPS = ("properties", "$defs")
_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_CHILD_ONE = ("items", "additionalProperties")


def restrict(schema: Any, keywords: set[str]) -> Any:
    """A copy of ``schema`` holding only ``keywords``, at every level."""
    if not isinstance(schema, dict):
        return schema
    if isinstance(schema.get("$ref"), str):
        # A reference stands alone: OpenAI's strict mode refuses keywords beside it (a
        # description), and JSON Schema drafts before 2019 ignore them anyway.
        return {"$ref": schema["$ref"]}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in keywords:
            if key == "const" and "enum" in keywords:
                out["enum"] = [value]
            elif key == "prefixItems" and isinstance(value, list) and "items" not in schema:
                # A fixed tuple where the dialect has none: any of its item types, in any
                # place (the agent validates the exact tuple).
                out["items"] = {"anyOf": [restrict(sub, keywords) for sub in value]}
            continue
        if key in _CHILD_MAPS and isinstance(value, dict):
            out[key] = {name: restrict(sub, keywords) for name, sub in value.items()}
        elif key in _CHILD_LISTS and isinstance(value, list):
            out[key] = [restrict(sub, keywords) for sub in value]
        elif key in _CHILD_ONE and isinstance(value, dict):
            out[key] = restrict(value, keywords)
        else:
            out[key] = value
    return out


def lift_defs(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (a tool's arguments) ready to sit inside another schema: its ``$defs`` moved
    into ``defs`` under ``prefix`` + name, and its references rewritten to point there (a
    reference is resolved from the root of the whole document). A reference to anything but
    its own ``$defs`` becomes ``{}`` (any value: the tool still validates its arguments).
    ``schema`` itself is returned, uncopied, when it has no reference.
    """
    own = schema.get("$defs", schema.get("definitions"))
    if not isinstance(own, dict) and not any("$ref" in node for node in walk(schema)):
        return schema
    out: dict[str, Any] = restrict(schema, set(_all_keywords(schema)) - {"$defs", "definitions"})
    names = own if isinstance(own, dict) else {}
    renamed = {name: f"{prefix}{name}" for name in names}
    for name, sub in names.items():
        defs[renamed[name]] = restrict(sub, set(_all_keywords(sub)))
    for node in walk(out) + [node for name in names for node in walk(defs[renamed[name]])]:
        ref = node.get("$ref")
        if not isinstance(ref, str):
            continue
        target = ref.removeprefix("#/$defs/").removeprefix("#/definitions/")
        if target != ref and target in renamed:
            node["$ref"] = f"#/$defs/{renamed[target]}"
        else:
            del node["$ref"]
    return out


def walk(schema: Any) -> list[dict[str, Any]]:
    """Every sub-schema of ``schema``, itself first."""
    found: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        found.append(node)
        for key in _CHILD_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in _CHILD_LISTS:
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        for key in _CHILD_ONE:
            if isinstance(node.get(key), dict):
                stack.append(node[key])
    return found


def for_openai(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema in OpenAI's strict subset, and whether strict mode can hold it.

    Strict mode needs every object closed with every property required and no open
    ("any") values; a tool with optional arguments makes the schema non-strict (the model
    is then guided by the schema but not forced).
    """
    out = restrict(schema, OPENAI_KEYWORDS)
    strict = True
    for node in walk(out):
        if node.get("type") == "array" and "items" not in node and node.get("maxItems") == 0:
            node["items"] = {"type": "null"}
        kind = node.get("type")
        if not kind and not any(k in node for k in ("anyOf", "enum", "const", "$ref")):
            strict = False  # an "any" value
        if kind == "object":
            props = node.get("properties", {})
            if node.get("additionalProperties") is not False or set(
                node.get("required", [])
            ) != set(props):
                strict = False
    return out, strict


ANTHROPIC_FORMATS = frozenset(
    ("date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid")
)
"""String formats the Anthropic SDK's schema transform keeps (others become prose)."""


def for_anthropic(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the Anthropic SDK documents it (``transform_schema``): no ``type`` beside
    ``enum``/``const``, ``minItems`` only 0 or 1, ``format`` only from its list, ``oneOf`` as
    ``anyOf``. A step that may call no tool has no ``actions`` at all (Anthropic has no
    ``maxItems``; an array with no ``items`` would let anything through)."""
    out = restrict(schema, ANTHROPIC_KEYWORDS | {"oneOf", "minItems"})
    for node in walk(out):
        if "oneOf" in node:
            node["anyOf"] = node.pop("oneOf")
        if "enum" in node or "const" in node:
            node.pop("type", None)
        if node.get("minItems") not in (None, 0, 1):
            node.pop("minItems")
        if "format" in node and node["format"] not in ANTHROPIC_FORMATS:
            node.pop("format")
    actions = schema.get("properties", {}).get("actions")
    if isinstance(actions, dict) and actions.get("maxItems") == 0:
        out.get("properties", {}).pop("actions", None)
        if "required" in out:
            out["required"] = [name for name in out["required"] if name != "actions"]
    return out


def for_gemini(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema in the subset Gemini's ``response_json_schema`` documents."""
    return restrict(schema, GEMINI_KEYWORDS)


def bounded(
    schema: dict[str, Any], *, max_chars: int, response_chars: int, max_actions: int
) -> dict[str, Any]:
    """A tighter step schema for a small local model under a grammar.

    Every string gets a length bound (a small model otherwise repeats itself until the token
    limit), the response gets its own bound, and at most ``max_actions`` calls per step.
    With no tools the response must be a non-empty string: a step that neither answers nor
    acts can only stall the loop.
    """
    out = restrict(schema, set(_all_keywords(schema)))  # a deep copy
    for node in walk(out):
        if node.get("type") == "string":
            node["maxLength"] = min(node.get("maxLength", max_chars), max_chars)
    props = out.get("properties", {})
    actions = props.get("actions")
    no_tools = isinstance(actions, dict) and actions.get("maxItems") == 0
    if isinstance(actions, dict) and not no_tools:
        actions["maxItems"] = min(actions.get("maxItems", max_actions), max_actions)
    if "response" in props and text_answer(props["response"]):  # not a JSON answer
        answer = {"type": "string", "minLength": 1, "maxLength": response_chars}
        props["response"] = answer if no_tools else {"anyOf": [answer, {"type": "null"}]}
    return out


def text_answer(response: Any) -> bool:
    """Whether a step's ``response`` schema is the usual text (or null), not a JSON answer
    with a schema of its own (``output_schema``)."""
    options = response.get("anyOf") if isinstance(response, dict) else None
    return isinstance(options, list) and all(
        isinstance(o, dict) and o.get("type") in ("string", "null")
        and set(o) <= {"type", "maxLength"} for o in options)


def _all_keywords(schema: Any) -> set[str]:
    keys: set[str] = set()
    for node in walk(schema):
        keys.update(node)
    return keys
