"""The reply parser: what real models emit, read into a Step or refused with a clear reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cogency import tool
from cogency.errors import InvalidResponseError
from cogency.reason import contract, correction, parse_step, step_schema


@tool
def search(query: str, limit: int = 5) -> str:
    """Search the web."""
    return query


TOOLS = {"search": search}


def test_plain_object():
    step = parse_step(
        '{"secure": true, "objective": "o", "understanding": "u", "approach": "a", '
        '"discoveries": "d", "response": "hi", "actions": []}',
        TOOLS,
    )
    assert step.secure is True and step.response == "hi" and step.actions == []
    assert step.workspace == {"objective": "o", "understanding": "u", "approach": "a",
                              "discoveries": "d"}


def test_code_fence_and_prose_around():
    text = 'Here is my answer:\n```json\n{"response": "fenced", "actions": []}\n```\nHope it helps!'
    assert parse_step(text, TOOLS).response == "fenced"
    assert parse_step('Sure. {"response": "bare"} That is all.', TOOLS).response == "bare"
    assert parse_step('```\n{"response": "no language tag"}\n```', TOOLS).response == (
        "no language tag"
    )


def test_trailing_commas_outside_strings_only():
    text = '{"response": "a, }", "actions": [{"name": "search", "args": {"query": "x,]",},},],}'
    step = parse_step(text, TOOLS)
    assert step.response == "a, }"
    assert step.actions == [{"name": "search", "args": {"query": "x,]"}}]


def test_braces_and_quotes_inside_strings():
    text = 'noise {"response": "use {curly} and \\"quotes\\" and } here", "actions": []} tail {x}'
    assert parse_step(text, TOOLS).response == 'use {curly} and "quotes" and } here'


def test_prose_with_braces_before_the_object():
    text = 'I think {this} is tricky. {"response": "the real one"}'
    assert parse_step(text, TOOLS).response == "the real one"


def test_absent_fields_are_left_out_and_empty_response_is_none():
    step = parse_step('{"understanding": "only this", "response": "  "}', TOOLS)
    assert step.workspace == {"understanding": "only this"}
    assert step.response is None and step.actions == [] and step.secure is True


def test_actions_args_are_validated_and_null_args_mean_none():
    step = parse_step('{"actions": [{"name": "search", "args": {"query": "cats", "limit": 2}}]}',
                      TOOLS)
    assert step.actions == [{"name": "search", "args": {"query": "cats", "limit": 2}}]
    with pytest.raises(InvalidResponseError, match="missing the required argument 'query'"):
        parse_step('{"actions": [{"name": "search", "args": null}]}', TOOLS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no json here", "no JSON object found"),
        ("[1, 2, 3]", "no JSON object found"),
        ('{"secure": "yes"}', '"secure" must be true or false'),
        ('{"understanding": 5}', '"understanding" must be a string'),
        ('{"response": ["a"]}', '"response" must be a string or null'),
        ('{"actions": {"name": "search"}}', '"actions" must be a list'),
        ('{"actions": ["search"]}', 'actions[0] must be an object with a string "name"'),
        ('{"actions": [{"name": "rm", "args": {}}]}', "unknown tool 'rm' (available tools: search)"),
        ('{"actions": [{"name": "search", "args": []}]}', "actions[0].args must be an object"),
        ('{"actions": [{"name": "search", "args": {"query": 3}}]}',
         "argument 'query': Input should be a valid string (got 3)"),
        ('{"actions": [{"name": "search", "args": {"query": "x", "limit": "two"}}]}',
         "argument 'limit': Input should be a valid integer"),
        ('{"actions": [{"name": "search", "args": {"query": "x", "page": 2}}]}',
         "unknown argument 'page'"),
    ],
)
def test_wrong_shapes_say_what_is_wrong(text, message):
    with pytest.raises(InvalidResponseError) as caught:
        parse_step(text, TOOLS)
    assert message in str(caught.value)


def test_too_many_actions_and_too_long_replies_are_refused():
    many = {"actions": [{"name": "search", "args": {"query": str(i)}} for i in range(17)]}
    with pytest.raises(InvalidResponseError, match="at most 16 actions"):
        parse_step(json.dumps(many), TOOLS)
    with pytest.raises(InvalidResponseError, match="longer than"):
        parse_step('{"response": "' + "x" * 300_000 + '"}', TOOLS)


def test_deep_nesting_is_refused_not_a_crash():
    with pytest.raises(InvalidResponseError):
        parse_step("{" * 5000, TOOLS)
    with pytest.raises(InvalidResponseError):
        parse_step('{"a": ' * 3000 + "1" + "}" * 3000, TOOLS)  # valid JSON, too deep


def test_correction_and_contract_carry_the_schema_reminder():
    text = correction("no JSON object found in the reply", first_iteration=False)
    assert text.startswith("Your reply was not valid: no JSON object found in the reply.")
    assert contract(False) in text and '"secure"' not in text
    assert '"secure": true' in contract(True)


def test_step_schema_lists_each_tool_with_its_arguments():
    schema = step_schema([search], first_iteration=True)
    assert schema["required"][0] == "secure" and schema["additionalProperties"] is False
    [variant] = schema["properties"]["actions"]["items"]["anyOf"]
    assert variant["properties"]["name"] == {"type": "string", "enum": ["search"]}
    assert variant["properties"]["args"] == search.parameters
    assert "secure" not in step_schema([search], first_iteration=False)["properties"]
    assert step_schema([], first_iteration=False)["properties"]["actions"]["maxItems"] == 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_or_raises_invalid_response(text):
    try:
        parse_step(text, TOOLS)
    except InvalidResponseError:
        pass


@settings(max_examples=100, deadline=None)
@given(
    response=st.one_of(st.none(), st.text(max_size=50)),
    understanding=st.text(max_size=50),
    prefix=st.sampled_from(["", "Sure!\n", "```json\n", "Answer: "]),
)
def test_valid_replies_round_trip_through_noise(response, understanding, prefix):
    body = json.dumps({"understanding": understanding, "response": response, "actions": []})
    suffix = "\n```" if prefix.startswith("```") else ""
    step = parse_step(prefix + body + suffix, TOOLS)
    assert step.workspace["understanding"] == understanding
    assert step.response == (response if response and response.strip() else None)


def test_a_reply_cut_short_is_invalid_not_its_inner_object():
    # The nested {"name": "search"} parses on its own; taking it for the step would
    # silently lose the reply. It holds no field of the contract, so the reply is invalid.
    with pytest.raises(InvalidResponseError, match="no JSON object"):
        parse_step('{"actions": [{"name": "search", "args": {"query": "a"}}]', TOOLS)
