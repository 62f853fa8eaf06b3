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
