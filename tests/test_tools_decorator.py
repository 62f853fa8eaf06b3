"""@tool: schemas from typed, documented functions; validation before the call; bad definitions."""

from __future__ import annotations

import asyncio
import enum
from typing import Literal, Optional

import pytest

from cogency import Tool, tool
from cogency.errors import ToolArgumentError, ToolError
from cogency.tools.base import run_tool, run_tools


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


@tool
def forecast(
    city: str,
    days: int = 3,
    hourly: bool = False,
    threshold: float = 0.5,
    unit: Literal["c", "f"] = "c",
    stations: list[int] | None = None,
    note: Optional[str] = None,
    scale: Unit = Unit.C,
    tags: dict[str, int] | None = None,
) -> str:
    """Forecast the weather.

    Longer text that is not part of the summary.

    Args:
        city: The city name,
            as people write it.
        days (int): How many days ahead.
        stations: Station ids to use.
    """
    return f"{city} {days} {hourly} {threshold} {unit} {stations} {note} {scale} {tags}"


def test_schema_from_the_signature_and_docstring():
    assert forecast.name == "forecast"
    assert forecast.description == "Forecast the weather."
    schema = forecast.parameters
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["city"] and "title" not in schema
    props = schema["properties"]
    assert props["city"] == {"type": "string", "description": "The city name, as people write it."}
    assert props["days"] == {"type": "integer", "description": "How many days ahead.", "default": 3}
    assert props["hourly"] == {"type": "boolean", "default": False}
    assert props["threshold"] == {"type": "number", "default": 0.5}
    assert props["unit"] == {"enum": ["c", "f"], "type": "string", "default": "c"}
    assert props["stations"]["anyOf"] == [
        {"type": "array", "items": {"type": "integer"}}, {"type": "null"},
    ]
    assert props["stations"]["description"] == "Station ids to use."
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["scale"] == {"$ref": "#/$defs/Unit", "default": "celsius"}
    assert schema["$defs"]["Unit"]["enum"] == ["celsius", "fahrenheit"]
    assert props["tags"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "integer"}}
    line = forecast.signature()
    assert line.startswith("forecast(city: string, days: integer = optional")
    assert "unit: \"c\" | \"f\" = optional" in line and "list[integer] | null" in line
    assert 'scale: "celsius" | "fahrenheit" = optional' in line


def test_validation_accepts_good_args_and_names_the_bad_one():
    assert forecast.validate({"city": "Oslo", "stations": [1, 2], "threshold": 1}) == {
        "city": "Oslo", "stations": [1, 2], "threshold": 1,
    }
    cases = [
        ({}, "missing the required argument 'city'"),
        ({"city": 1}, "argument 'city': Input should be a valid string (got 1)"),
        ({"city": "x", "days": 2.5}, "argument 'days': Input should be a valid integer"),
        ({"city": "x", "threshold": float("nan")}, "argument 'threshold': Input should be a "
                                                   "finite number"),
        ({"city": "x", "unit": "k"}, "argument 'unit': Input should be 'c' or 'f' (got 'k')"),
        ({"city": "x", "stations": [1, "two"]}, "argument 'stations[1]': Input should be a "
                                                "valid integer"),
        ({"city": "x", "tags": {"a": "b"}}, "argument 'tags.a'"),
        ({"city": "x", "colour": "red"}, "unknown argument 'colour' (allowed: city, days,"),
        ("Oslo", "the arguments must be an object"),
    ]
    for args, message in cases:
        with pytest.raises(ToolArgumentError) as caught:
            forecast.validate(args)
        assert message in str(caught.value), (args, str(caught.value))
        assert "'forecast'" in str(caught.value) and "pydantic" not in str(caught.value)


async def test_sync_and_async_functions_are_called_alike():
    @tool(name="double", description="Double a number.", timeout=2)
    async def twice(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    @tool
    def shout(text: str) -> dict[str, str]:
        """Shout."""
        return {"text": text.upper()}

    assert (twice.name, twice.description, twice.timeout) == ("double", "Double a number.", 2)
    assert await twice(n=4) == 8 and await shout(text="hi") == {"text": "HI"}
    results = await run_tools({"double": twice, "shout": shout}, [
        {"name": "shout", "args": {"text": "a"}},
        {"name": "double", "args": {"n": 5}},
        {"name": "missing", "args": {}},
    ])
    assert results == [
        {"name": "shout", "args": {"text": "a"}, "ok": True, "output": '{"text": "A"}'},
        {"name": "double", "args": {"n": 5}, "ok": True, "output": "10"},
        {"name": "missing", "args": {}, "ok": False, "error": "unknown tool 'missing'"},
    ]


async def test_long_output_is_cut_and_marked():
    @tool
    def big() -> str:
        """Lots of text."""
        return "x" * 50_000

    result = await run_tool(big, "big", {})
    assert result["ok"] and len(result["output"]) < 21_000
    assert result["output"].endswith("[cut: 30000 more characters]")


def test_bad_definitions_raise_tool_error():
    def undocumented(x: int) -> int:
        return x

    def untyped(x):
        """Has no annotation."""

    def star(*items: int) -> None:
        """Variadic."""

    class Opaque:
        pass

    def odd_type(x: Opaque) -> None:
        """A class Pydantic knows nothing of has no JSON type."""

    def positional(x: int, /) -> None:
        """Positional-only."""

    for fn, message in [
        (undocumented, "needs a description"),
        (untyped, "needs a type annotation"),
        (star, "*args and **kwargs"),
        (odd_type, "cannot describe the type"),
        (positional, "positional-only"),
    ]:
        with pytest.raises(ToolError, match=message.replace("*", r"\*")):
            tool(fn)
    with pytest.raises(ToolError, match="tool name"):
        tool(name="has space", description="d")(lambda: None)
    with pytest.raises(ToolError, match="timeout"):
        tool(timeout=0)(forecast.func)
    with pytest.raises(ToolError, match="type object"):
        Tool("t", "d", {"type": "array"}, lambda: None)
    with pytest.raises(ToolError, match="callable"):
        Tool("t", "d", {"type": "object"}, "not a function")  # type: ignore[arg-type]


def test_the_decorated_tool_is_a_tool_for_the_agent():
    from cogency import Agent
    from cogency.errors import UsageError
    from cogency.testing import ScriptedLLM

    def plain(x: int) -> int:
        """Not decorated."""
        return x

    with pytest.raises(UsageError, match="@tool"):
        Agent(llm=ScriptedLLM([]), tools=[plain], store=":memory:")  # type: ignore[list-item]
    with pytest.raises(UsageError, match="unique"):
        Agent(llm=ScriptedLLM([]), tools=[forecast, forecast], store=":memory:")


async def test_dense_output_is_cut_by_tokens_too():
    from cogency.tokens import count_tokens

    @tool
    def digits() -> str:
        """Dense text: one token a character."""
        return "1." * 9_000

    @tool
    def fails() -> str:
        """Raises with a huge message."""
        raise ValueError("9," * 50_000)

    result = await run_tool(digits, "digits", {})
    kept = result["output"].rsplit("\n…[cut: ", 1)[0]
    assert 5_000 < count_tokens(kept) <= 6_000  # 18,000 characters would be 18,000 tokens
    assert result["output"].endswith(f"[cut: {18_000 - len(kept)} more characters]")
    error = (await run_tool(fails, "fails", {}))["error"]
    assert error.startswith("ValueError: 9,9,") and count_tokens(error) < 6_100
