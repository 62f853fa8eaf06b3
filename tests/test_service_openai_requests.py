"""What an OpenAI request asks, parsed (cogency.server.openai_requests): any JSON a client
sends is either understood or refused with the service's own error naming what to change,
never an exception of another type (which the service would answer with a 500)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")

from pydantic import ValidationError  # noqa: E402

from cogency.errors import CogencyError  # noqa: E402
from cogency.server.openai_requests import (  # noqa: E402
    ChatRequest,
    ResponsesRequest,
    chat_asked,
    response_parts,
    responses_asked,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) |
    st.sampled_from(["", "user", "assistant", "tool", "system", "function", "text",
                     "input_text", "function_call_output", "json_schema", "allowed_tools",
                     "required", "none", "auto", "call_1", "x"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "tool_call_id", "tool_calls",
                         "function", "name", "call_id", "output", "schema", "json_schema",
                         "tools", "mode", "allowed_tools", "id", "format", "effort"]),
        inner, max_size=4),
    max_leaves=20,
)
fields = st.dictionaries(
    st.sampled_from(["messages", "input", "tools", "tool_choice", "response_format", "text",
                     "reasoning", "conversation", "previous_response_id", "store", "n",
                     "temperature", "metadata", "instructions", "include", "top_k",
                     "modalities", "logit_bias", "stop", "made_up"]),
    json_values, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields, st.booleans())
@example({"tools": [{"type": "function", "function": "x"}],
          "tool_choice": {"type": "function", "function": "x"}}, True)
@example({"tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "allowed_tools", "tools": "f"}}, False)
@example({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "allowed_tools", "allowed_tools": [1]}}, True)
@example({"text": {"format": "json_schema"}}, False)
@example({"response_format": {"type": "json_schema", "json_schema": "x"}}, True)
@example({"messages": [{"role": "user", "content": "q"},
                       {"role": "tool", "tool_call_id": 5, "content": "r"}]}, True)
@example({"input": [{"type": "function_call_output", "call_id": "c", "output": [1]}]}, False)
def test_any_request_is_understood_or_refused_with_the_services_own_error(body, chat):
    body = {"model": "cogency", **body}
    if chat:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    else:
        body.setdefault("input", "hi")
    try:
        request = (ChatRequest if chat else ResponsesRequest).model_validate(body)
    except ValidationError:
        return  # FastAPI answers these with a 400 naming the field
    try:
        asked = chat_asked(request) if chat else responses_asked(request)
    except CogencyError:
        return
    assert asked.query is not None or asked.results


@given(st.text(max_size=80))
def test_any_response_id_is_parsed_or_not_found(text):
    try:
        response_parts(text)
    except CogencyError:
        pass
