"""Typed functions as tools: the arguments' JSON schema and validation, by Pydantic.

The signature becomes a ``TypedDict`` of its parameters (closed: an unknown argument is an
error), so every type Pydantic knows works as an argument: models, dataclasses, TypedDicts,
``datetime``, enums and ``Literal``, ``Annotated[int, Field(ge=1, description=...)]``, fixed
tuples. The schema has Pydantic's ``$defs``/``$ref`` for named types; validation returns the
arguments as the declared types (a model instance, a ``datetime``), and a failure becomes a
short :class:`~cogency.errors.ToolArgumentError` that names the argument.

Imported only when ``@tool`` is used: ``import cogency`` does not import Pydantic.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, Required

from pydantic import ConfigDict, PydanticUserError, TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticSerializationError, to_jsonable_python
from typing_extensions import TypedDict

from ..errors import ToolArgumentError, ToolError

MAX_ERRORS_SHOWN = 3
"""Validation errors named in one message; the rest are counted."""


class _ToolSchema(GenerateJsonSchema):
    """Pydantic's JSON schema without a title on every field (``"title": "City"`` next to
    ``city`` only costs the model tokens)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def arguments_of(
    fn: Callable[..., Any], docs: Mapping[str, str], namespace: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], TypeAdapter[Any]]:
    """The JSON schema of ``fn``'s arguments and the adapter that validates them.

    ``docs`` holds each argument's help from the docstring (used where the annotation gives no
    description); ``namespace`` resolves annotations that name local classes.
    """
    where = f"tool {fn.__name__!r}"
    try:
        hints = typing.get_type_hints(fn, localns=dict(namespace or {}), include_extras=True)
    except Exception as exc:
        raise ToolError(f"{where}: cannot read its type hints ({exc})") from exc
    fields: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"{where}: *args and **kwargs cannot be described")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolError(f"{where}: argument {param.name!r} is positional-only; tools are "
                            "called with keyword arguments")
        if param.name not in hints:
            raise ToolError(f"{where}: argument {param.name!r} needs a type annotation")
        if param.default is param.empty:
            fields[param.name] = Required[hints[param.name]]
        else:
            fields[param.name] = NotRequired[hints[param.name]]
            defaults[param.name] = param.default
    make: Any = TypedDict  # the functional form, with names known only here
    arguments = make(f"{fn.__name__}_arguments", fields)
    # Closed, as the schema says; NaN and infinities are not numbers a tool can use.
    arguments.__pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(arguments)
        schema = adapter.json_schema(schema_generator=_ToolSchema)
    except (PydanticUserError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolError(f"{where}: cannot describe the type of an argument in a JSON schema "
                        f"({first})") from exc
    schema.pop("title", None)
    props = schema.setdefault("properties", {})
    schema.setdefault("required", [])
    for name, spec in props.items():
        if name in docs and "description" not in spec:
            spec["description"] = docs[name]
        if name in defaults:
            try:
                spec["default"] = to_jsonable_python(defaults[name])
            except (PydanticSerializationError, TypeError, ValueError):
                pass  # a default JSON cannot show: the schema just leaves it out
    return schema, adapter


def typed_arguments(
    adapter: TypeAdapter[Any], args: Any, tool_name: str, allowed: Any = (),
) -> dict[str, Any]:
    """``args`` (JSON values) validated and converted to the declared types; raises
    :class:`~cogency.errors.ToolArgumentError` naming each bad argument (and, for an unknown
    one, the ``allowed`` names)."""
    if not isinstance(args, Mapping):
        raise ToolArgumentError(
            f"tool {tool_name!r}: the arguments must be an object, got {_shown(args)}"
        )
    try:
        return dict(adapter.validate_python(args))
    except ValidationError as exc:
        raise ToolArgumentError(f"tool {tool_name!r}: {_problems(exc, allowed)}") from None
    except RecursionError:
        raise ToolArgumentError(f"tool {tool_name!r}: the arguments are nested too deeply") \
            from None


def _problems(exc: ValidationError, allowed: Any) -> str:
    """Pydantic's errors as one short line: each bad argument with what is wrong and what
    was given (no documentation links, no type tags of union members)."""
    errors = exc.errors(include_url=False, include_context=False)
    shown = []
    for error in errors[:MAX_ERRORS_SHOWN]:
        loc = [part for part in error["loc"] if not _is_type_tag(part)]
        kind = error["type"]
        if not loc:
            shown.append(str(error["msg"]))
            continue
        path = str(loc[0]) + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:])
        name = f"argument {path!r}"
        if kind == "missing":
            shown.append(f"missing the required {name}")
        elif kind == "extra_forbidden" and len(loc) == 1:
            shown.append(f"unknown {name} (allowed: {', '.join(allowed) or 'none'})")
        else:
            shown.append(f"{name}: {error['msg']} (got {_shown(error.get('input'))})")
    more = len(errors) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _is_type_tag(part: Any) -> bool:
    # Pydantic names the member of a union an error is about; 'list[int]' or
    # 'function-after[…]' is no place in the arguments (a model's name is kept: it says which).
    return isinstance(part, str) and _TYPE_TAG.match(part) is not None


_TYPE_TAG = re.compile(r"^[\w-]+\[.*\]$", re.S)


def _shown(value: Any) -> str:
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(
            value, ensure_ascii=False, default=repr)
    except (RecursionError, ValueError):
        return "a value nested too deeply to show"
    return text[:60] + ("…" if len(text) > 60 else "")
