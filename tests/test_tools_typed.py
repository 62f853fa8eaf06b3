"""@tool with Pydantic: every type Pydantic knows is an argument, arriving as that type; a bad
argument is an error the model sees, naming it. Through ``Agent.run`` and the database."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from typing import Annotated, Literal

import pytest
from cli_run import rows
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from cogency import Agent, tool
from cogency.errors import ToolArgumentError
from cogency.llm._schema import for_anthropic, for_gemini, for_openai, walk
from cogency.reason import step_schema
from cogency.testing import ScriptedLLM


class Point(BaseModel):
    x: int
    y: int = 0


class Window(TypedDict):
    start: int
    end: int


@dataclasses.dataclass
class Size:
    width: float
    height: float


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


received: list[dict[str, object]] = []


@tool
def draw(
    at: Point,
    when: datetime.datetime,
    colour: Colour,
    shape: Literal["dot", "cross"],
    count: Annotated[int, Field(ge=1, le=9, description="How many marks, 1 to 9.")],
    span: tuple[int, str],
    window: Window | None = None,
    size: Size | None = None,
) -> str:
    """Draw marks on the canvas.

    Args:
        at: Where the first mark goes.
        count: Overridden by the Field's own description.
    """
    received.append({"at": at, "when": when, "colour": colour, "shape": shape, "count": count,
                     "span": span, "window": window, "size": size})
    return f"drew {count} {colour.value} {shape}(s) at {at.x},{at.y}"


GOOD = {"at": {"x": 1, "y": 2}, "when": "2024-05-01T12:00:00Z", "colour": "red", "shape": "dot",
        "count": 3, "span": [4, "days"], "window": {"start": 0, "end": 5},
        "size": {"width": 2, "height": 1.5}}


def test_the_schema_keeps_constraints_descriptions_and_named_types():
    schema = draw.parameters
    props = schema["properties"]
    assert props["count"] == {"type": "integer", "minimum": 1, "maximum": 9,
                              "description": "How many marks, 1 to 9."}
    assert props["at"]["$ref"] == "#/$defs/Point"
    assert props["at"]["description"] == "Where the first mark goes."  # from the docstring
    assert schema["$defs"]["Point"]["properties"]["x"] == {"type": "integer"}
    assert props["when"] == {"type": "string", "format": "date-time"}
    assert props["colour"] == {"$ref": "#/$defs/Colour"}
    assert schema["$defs"]["Colour"]["enum"] == ["red", "blue"]
    assert props["shape"]["enum"] == ["dot", "cross"]
    assert props["span"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert (props["span"]["minItems"], props["span"]["maxItems"]) == (2, 2)
    assert set(schema["$defs"]) == {"Point", "Colour", "Window", "Size"}
    assert schema["required"] == ["at", "when", "colour", "shape", "count", "span"]
    line = draw.signature()
    assert "at: Point{x: integer, y: integer = optional}" in line
    assert "span: [integer, string]" in line and 'colour: "red" | "blue"' in line


def test_fixed_tuples_and_constraints_are_enforced():
    assert draw.validate(GOOD) == GOOD  # the JSON arguments, as the model sent them
    for change, message in [
        ({"span": [1, 2, 3]}, "argument 'span': Tuple should have at most 2 items"),
        ({"span": [1, 2]}, "argument 'span[1]': Input should be a valid string"),
        ({"count": 0}, "argument 'count': Input should be greater than or equal to 1"),
        ({"when": "tomorrow"}, "argument 'when': Input should be a valid datetime"),
        ({"colour": "green"}, "argument 'colour': Input should be 'red' or 'blue'"),
        ({"at": {"x": "left"}}, "argument 'at.x': Input should be a valid integer"),
        ({"window": {"start": 1}}, "missing the required argument 'window.end'"),
    ]:
        with pytest.raises(ToolArgumentError) as caught:
            draw.validate({**GOOD, **change})
        text = str(caught.value)
        assert text.startswith("tool 'draw': ") and message in text, text
        assert "errors.pydantic.dev" not in text and "For further information" not in text
    assert draw.validate({**GOOD, "span": [1, "x"]})["span"] == [1, "x"]


async def test_arguments_arrive_as_the_declared_types(tmp_path):
    received.clear()
    llm = ScriptedLLM([
        {"actions": [{"name": "draw", "args": GOOD}]},
        {"response": "done"},
    ])
    async with Agent(llm=llm, tools=[draw], store=str(tmp_path / "a.db")) as agent:
        result = await agent.run("draw", user_id="ada")
    assert result.stop_reason == "completed" and result.response == "done"
    [got] = received
    assert got["at"] == Point(x=1, y=2)
    assert got["when"] == datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.timezone.utc)
    assert got["colour"] is Colour.RED and got["shape"] == "dot" and got["count"] == 3
    assert got["span"] == (4, "days")
    assert got["window"] == {"start": 0, "end": 5} and got["size"] == Size(2.0, 1.5)
    stored = [json.loads(text) for (text,) in rows(
        tmp_path / "a.db", "SELECT content FROM conversation_messages WHERE role = 'tool'")]
    assert stored[0]["args"] == GOOD and stored[0]["output"] == "drew 3 red dot(s) at 1,2"


async def test_a_bad_argument_is_an_error_the_model_sees(tmp_path):
    received.clear()
    bad = {**GOOD, "when": "next tuesday", "span": [1, 2, 3]}
    llm = ScriptedLLM([
        {"actions": [{"name": "draw", "args": bad}]},
        {"actions": [{"name": "draw", "args": GOOD}]},
        {"response": "done"},
    ])
    async with Agent(llm=llm, tools=[draw], store=str(tmp_path / "a.db")) as agent:
        events = [event async for event in agent.stream("draw")]
    told = llm.calls[1][-1]["content"]
    assert "tool 'draw': argument 'when': Input should be a valid datetime" in told
    assert "argument 'span': Tuple should have at most 2 items" in told
    assert "pydantic" not in told.lower()
    errors = [event.message for event in events if event.type == "error"]
    assert errors and "argument 'when'" in errors[0]
    assert len(received) == 1 and events[-1].stop_reason == "completed"


def test_named_types_work_in_every_providers_step_schema():
    schema = step_schema([draw], first_iteration=False)
    args = schema["properties"]["actions"]["items"]["anyOf"][0]["properties"]["args"]
    assert args["properties"]["at"]["$ref"] == "#/$defs/draw__Point"
    assert set(schema["$defs"]) == {"draw__Point", "draw__Colour", "draw__Window", "draw__Size"}
    for dialect in (for_openai(schema)[0], for_anthropic(schema), for_gemini(schema), schema):
        nodes = walk(dialect)
        refs = {node["$ref"] for node in nodes if "$ref" in node}
        assert refs and all(ref.removeprefix("#/$defs/") in dialect["$defs"] for ref in refs)
        assert all(set(node) == {"$ref"} for node in nodes if "$ref" in node)
    openai_span = for_openai(schema)[0]["properties"]["actions"]["items"]["anyOf"][0][
        "properties"]["args"]["properties"]["span"]
    assert openai_span["items"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def test_tool_schemas_that_refer_elsewhere_or_recur_stay_usable():
    from cogency import Tool

    class Tree(BaseModel):
        value: int
        children: list[Tree] = []

    @tool
    def plant(tree: Tree) -> int:
        """Plant a tree."""
        return tree.value

    odd = Tool("odd", "A raw schema with a reference to nowhere.",
               {"type": "object", "properties": {"a": {"$ref": "#/properties/b"}}}, lambda a: a)
    schema = step_schema([plant, odd], first_iteration=True)
    tree = schema["$defs"]["plant__Tree"]
    assert tree["properties"]["children"]["items"] == {"$ref": "#/$defs/plant__Tree"}
    variants = schema["properties"]["actions"]["items"]["anyOf"]
    assert variants[1]["properties"]["args"]["properties"]["a"] == {}
    assert odd.parameters["properties"]["a"] == {"$ref": "#/properties/b"}  # not changed


def _plain(key: str, count: int = 3, ratio: float = 0.5, loud: bool = False, *,
           label: str = "x") -> str:
    """Plain scalars only.

    Args:
        key: which key
        loud: shout it
    """
    return key


def _plain_required(key: str, count: int, ratio: float, loud: bool) -> str:
    """All required."""
    return key


def _plain_none() -> str:
    """No arguments."""
    return ""


def _not_plain_default(count: int = 2.5) -> str:  # type: ignore[assignment]
    """A default of another type: Pydantic's path."""
    return ""


@pytest.mark.parametrize("fn", [_plain, _plain_required, _plain_none, _not_plain_default])
def test_a_plain_signature_gets_pydantics_schema_exactly(fn):
    from cogency.tools._plain import plain_arguments
    from cogency.tools._typed import arguments_of
    from cogency.tools.base import _parse_doc

    import inspect

    docs = _parse_doc(inspect.getdoc(fn) or "")[1]
    pydantics = json.dumps(arguments_of(fn, docs)[0])
    assert json.dumps(tool(fn).parameters) == pydantics  # the same text, key order too
    plain = plain_arguments(fn, docs)
    assert (plain is None) == (fn is _not_plain_default)
    if plain is not None:
        assert json.dumps(plain) == pydantics


def test_a_plain_tool_imports_pydantic_only_when_called(tmp_path):
    """A process whose tools take plain arguments answers without importing Pydantic (its
    start-up time and memory); the first call validates with Pydantic, as every tool does."""
    script = f"""
import asyncio, json, sys
from cogency import Agent, tool
from cogency.testing import ScriptedLLM

@tool
def lookup(key: str, times: int = 1) -> str:
    '''Look a key up.'''
    return key * times

async def main():
    llm = ScriptedLLM([{{"response": "hi"}},
                       {{"actions": [{{"name": "lookup", "args": {{"key": "a", "times": "x"}}}}]}},
                       {{"actions": [{{"name": "lookup", "args": {{"key": "a", "times": "2"}}}}]}},
                       {{"response": "done"}}])
    async with Agent(llm=llm, tools=[lookup], store={str(tmp_path / "a.db")!r}) as agent:
        first = await agent.run("hello", "u")
        print(first.response, "pydantic" in sys.modules)
        second = await agent.run("look", "u")
        print(second.response, "pydantic" in sys.modules)
        print(json.dumps(llm.calls[2]))
        print(json.dumps(llm.calls[3]))
asyncio.run(main())
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["hi False", "done True"]
    told_bad, told_good = json.loads(lines[2])[-1], json.loads(lines[3])[-1]
    assert "tool 'lookup': argument 'times': Input should be a valid integer" in told_bad["content"]
    assert "<tool_output>\naa\n</tool_output>" in told_good["content"]  # "2" arrived as 2


def test_arguments_that_are_not_json_are_refused_though_pydantic_would_convert_them():
    # Found by tests/test_fuzz.py: bytes pass Pydantic's lax str, but arguments are stored
    # and shown as JSON.
    @tool
    def echo(q: str) -> str:
        """Echo."""
        return q

    with pytest.raises(ToolArgumentError, match="must be JSON values"):
        echo.validate({"q": b"\x00"})
    assert echo.validate({"q": "x"}) == {"q": "x"}
