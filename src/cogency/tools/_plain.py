"""The arguments' JSON schema of a function whose parameters are all ``str``, ``int``,
``float`` or ``bool``, written as Pydantic writes it (``_typed.arguments_of``) but without
importing Pydantic: the common tool's schema costs no start-up time or memory. Validation
stays Pydantic's (made on the tool's first call); a test holds the two schemas equal."""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any

_TYPES: tuple[tuple[type, str], ...] = (
    (str, "string"), (int, "integer"), (float, "number"), (bool, "boolean"),
)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def plain_arguments(
    fn: Callable[..., Any], docs: Mapping[str, str], namespace: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """``fn``'s arguments' schema when every parameter is a plain scalar (its default, if
    any, of exactly that type); ``None`` for any other signature (Pydantic describes it)."""
    try:
        hints = typing.get_type_hints(fn, localns=dict(namespace or {}), include_extras=True)
        params = inspect.signature(fn).parameters.values()
    except Exception:  # noqa: BLE001 - arguments_of says what is wrong
        return None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in params:
        hint = hints.get(param.name)
        kind = next((name for known, name in _TYPES if hint is known), None)
        if kind is None or param.kind not in _NAMED:
            return None
        spec: dict[str, Any] = {"type": kind}
        if param.name in docs:
            spec["description"] = docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif type(param.default) is hint and not (
                hint is float and not math.isfinite(param.default)):
            spec["default"] = param.default
        else:
            return None
        properties[param.name] = spec
    if required:
        return {"additionalProperties": False, "properties": properties, "required": required,
                "type": "object"}
    return {"additionalProperties": False, "properties": properties, "type": "object",
            "required": []}
