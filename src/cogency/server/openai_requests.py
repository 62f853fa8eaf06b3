"""What an OpenAI client's request asks of a run, field by field (``/v1/chat/completions`` and
``/v1/responses``), as one :class:`Asked`.

Every field of the official SDK's request types is one of:

- **honoured**: system and developer messages and ``instructions`` (the client's instructions
  for the task), ``temperature``, ``top_p``, ``seed``, ``reasoning_effort``/``reasoning.effort``
  (to every model call of the task, where the agent's model takes them), ``max_tokens``/
  ``max_completion_tokens``/``max_output_tokens`` and ``stop`` (the answer), ``tools`` and
  ``tool_choice`` (the client's functions), ``response_format``/``text.format`` (an answer
  schema), ``store: false`` (a run that keeps nothing), ``stream``,
  ``stream_options.include_usage``, ``metadata.conversation_id``, ``previous_response_id``,
  ``conversation``;
- **accepted, changing nothing** (reported back where the response has the field):
  ``user``, ``safety_identifier``, ``prompt_cache_key`` and the prompt cache's options,
  ``service_tier``, ``metadata``, ``include``, ``truncation``, ``store: true``,
  ``logprobs: false``, ``n: 1``, ``parallel_tool_calls: true``, ``background: false``,
  ``stream_options.include_obfuscation``;
- **accepted, not applied** (named in the ``X-Cogency-Not-Applied`` header when set to
  anything but their default): ``frequency_penalty``, ``presence_penalty``, ``prediction``,
  ``verbosity``/``text.verbosity``, ``reasoning.summary``, ``parallel_tool_calls: false``,
  ``max_tool_calls``, ``context_management``, ``image``, the sampling options of servers
  such as vLLM (``top_k``, ``min_p``, ``repetition_penalty``), and any sampling option the
  agent's model cannot take (Anthropic has no ``seed``);
- **refused** with a 400 naming it, as what would change the meaning of the answer and cannot
  be honoured: ``n`` > 1, ``logprobs: true``, ``top_logprobs`` > 0 (also as ``include``),
  ``logit_bias`` (token ids of OpenAI's tokenizers), ``audio`` and audio ``modalities``,
  ``web_search_options``, ``moderation``, ``functions``/``function_call`` (use ``tools``),
  ``prompt`` (stored prompt templates), ``background: true``, ``access_programs``, built-in
  and custom tools, content that is not text, and any field the SDKs do not know.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import NotFoundError
from .errors import ModelNotFound, Unsupported

MODEL = "cogency"
"""The id ``/v1/models`` lists: the served agent (whatever model it reasons with)."""
MAX_MESSAGES = 500
"""The most messages (or input items) a request may carry (each resent turn is compared and
may be stored)."""
SAMPLING = ("temperature", "top_p", "seed", "reasoning_effort")
"""The options that go to the agent's model (with every call of the task)."""
VENDOR_SAMPLING = ("top_k", "min_p", "repetition_penalty")
"""Sampling options of OpenAI-compatible servers (vLLM, llama.cpp) that clients such as Open
WebUI send: accepted, not applied."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    store: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: Any = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    moderation: Any = None
    stream_options: dict[str, Any] | None = None


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    logit_bias: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    prediction: Any = None
    verbosity: str | None = None
    audio: Any = None
    modalities: list[str] | None = None
    web_search_options: Any = None
    functions: list[Any] | None = None
    function_call: Any = None


class ResponsesRequest(_Request):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    context_management: Any = None
    image: Any = None
    prompt: Any = None
    access_programs: Any = None
    background_options: Any = None


@dataclass
class Asked:
    """What one request asks: a new run of ``query`` (after ``history``, the turns a client
    resent, when it names no conversation), or (``query`` None) the continuation of the task
    waiting for the client's ``results`` (call id to output)."""

    query: str | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    conversation_id: str | None = None
    task_id: str | None = None
    """The task a ``previous_response_id`` names (its results continue it)."""
    instructions: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    output_schema: dict[str, Any] | None = None
    keep: bool = True
    not_applied: list[str] = field(default_factory=list)

    def run_options(self) -> dict[str, Any]:
        """The keyword arguments of ``Agent.stream`` for a new run (none left at default)."""
        asks: dict[str, Any] = {}
        if self.instructions:
            asks["instructions"] = self.instructions
        if self.options:
            asks["options"] = self.options
        if self.tools:
            asks["client_tools"] = self.tools
        if self.output_schema is not None:
            asks["output_schema"] = self.output_schema
        if not self.keep:
            asks["keep"] = False
        return asks


def chat_asked(body: ChatRequest) -> Asked:
    """A chat completion request as an :class:`Asked` (an :class:`Unsupported` 400 naming the
    field for what cannot be honoured)."""
    _common(body, "chat.completions")
    if body.n not in (None, 1):
        raise Unsupported("n must be 1: the agent gives one answer per run", "n")
    if body.logprobs:
        raise Unsupported("logprobs are not available: the agent's answer is written in steps, "
                          "not sampled token by token for you", "logprobs")
    _refuse(body, ("logit_bias", "audio", "web_search_options", "functions", "function_call"))
    if body.modalities and set(body.modalities) - {"text"}:
        raise Unsupported("only text can be generated: send modalities ['text'] or leave it "
                          "out", "modalities")
    if len(body.messages) > MAX_MESSAGES:
        raise Unsupported(
            f"a request carries at most {MAX_MESSAGES} messages, this one {len(body.messages)}: "
            "Cogency keeps the history, so name the conversation (metadata.conversation_id) "
            "and send only the new message", "messages")
    asked = Asked(keep=body.store is not False)
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in body.messages:
        if not isinstance(message, dict):
            raise Unsupported("each message must be an object with a role", "messages")
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text(message.get("content"), "messages"))
        elif role in ("user", "assistant", "tool"):
            turns.append(message)
        else:
            raise Unsupported(f"messages of role {str(role)[:40]!r} are not supported: send "
                              "system, developer, user, assistant and tool messages", "messages")
    asked.instructions = "\n\n".join(part for part in system if part.strip())
    if not turns:
        raise Unsupported("the messages hold no user message: it is the query", "messages")
    # A continuation: the tool results that end the messages, after the assistant message
    # that called them.
    tail = len(turns)
    while tail > 0 and turns[tail - 1].get("role") == "tool":
        tail -= 1
    if tail < len(turns):
        for message in turns[tail:]:
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise Unsupported("a tool message needs the tool_call_id of the call it answers",
                                  "messages")
            asked.results[call_id] = _text(message.get("content"), "messages")
    else:
        last = turns[-1]
        if last.get("role") != "user":
            raise Unsupported("the last message must be a user message (the query) or the "
                              "tool messages with the results of the calls asked for",
                              "messages")
        asked.query = _query(_text(last.get("content"), "messages"), "messages")
        asked.history = _turns(turns[:-1], "messages")
    asked.conversation_id = (body.metadata or {}).get("conversation_id")
    asked.options = _options(
        temperature=body.temperature, top_p=body.top_p, seed=body.seed,
        reasoning_effort=body.reasoning_effort,
        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None
        else body.max_tokens, stop=body.stop)
    asked.tools, asked.instructions = _tools(body.tools, body.tool_choice, asked.instructions,
                                             chat=True)
    asked.output_schema = _format(body.response_format, "response_format")
    not_applied = [name for name, value in (("frequency_penalty", body.frequency_penalty),
                                            ("presence_penalty", body.presence_penalty))
                   if value not in (None, 0, 0.0)]
    not_applied += [name for name in ("prediction", "verbosity")
                    if getattr(body, name) is not None]
    asked.not_applied = not_applied + _common_not_applied(body)
    _check_named(asked)
    return asked


def responses_asked(body: ResponsesRequest) -> Asked:
    """A Responses request as an :class:`Asked` (see :func:`chat_asked`)."""
    _common(body, "responses")
    _refuse(body, ("prompt", "access_programs"))
    if body.background:
        raise Unsupported("background responses are not available: stream the response, or "
                          "follow the run on /api/runs", "background")
    if any(isinstance(item, str) and "logprobs" in item for item in body.include or ()):
        raise Unsupported("logprobs are not available: the agent's answer is written in steps",
                          "include")
    asked = Asked(keep=body.store is not False)
    items: list[dict[str, Any]] = ([{"role": "user", "content": body.input}]
                                   if isinstance(body.input, str) else body.input)
    if not items:
        raise Unsupported("input is empty: send the query", "input")
    if len(items) > MAX_MESSAGES:
        raise Unsupported(
            f"input carries at most {MAX_MESSAGES} items, this one {len(items)}: Cogency keeps "
            "the history, so continue with previous_response_id and send only the new input",
            "input")
    system = [body.instructions] if body.instructions else []
    turns: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise Unsupported("each input item must be an object", "input")
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role in ("system", "developer"):
            system.append(_text(item.get("content"), "input"))
        elif kind == "message" and role in ("user", "assistant"):
            turns.append(item)
        elif kind in ("function_call", "function_call_output"):
            turns.append(item)
        elif kind == "reasoning":
            continue  # the model's own reasoning, resent: Cogency keeps its steps itself
        elif kind == "item_reference":
            raise Unsupported("input items by reference are not available: resend the item, "
                              "or continue with previous_response_id", "input")
        else:
            raise Unsupported(f"input items of type {str(kind)[:40]!r} (role {str(role)[:20]!r}) "
                              "are not supported: send messages, function_call and "
                              "function_call_output items", "input")
    asked.instructions = "\n\n".join(part for part in system if part.strip())
    if not turns:
        raise Unsupported("input holds no user message: it is the query", "input")
    tail = len(turns)
    while tail > 0 and turns[tail - 1].get("type") in ("function_call", "function_call_output"):
        tail -= 1
    outputs = [item for item in turns[tail:] if item.get("type") == "function_call_output"]
    if outputs:
        for item in outputs:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise Unsupported("a function_call_output item needs the call_id of the call "
                                  "it answers", "input")
            asked.results[call_id] = _text(item.get("output"), "input")
    else:
        last = turns[-1]
        if last.get("type", "message") != "message" or last.get("role") != "user":
            raise Unsupported("the last input item must be a user message (the query) or "
                              "function_call_output items with the results of the calls "
                              "asked for", "input")
        asked.query = _query(_text(last.get("content"), "input"), "input")
        asked.history = _turns([t for t in turns[:-1] if t.get("type", "message") == "message"],
                               "input")
    asked.conversation_id = (body.metadata or {}).get("conversation_id")
    if body.conversation is not None:
        named = (body.conversation.get("id") if isinstance(body.conversation, dict)
                 else body.conversation)
        if not isinstance(named, str) or not named:
            raise Unsupported("conversation must be a conversation id (or {\"id\": ID})",
                              "conversation")
        asked.conversation_id = named
    if body.previous_response_id is not None:
        if body.conversation is not None:
            raise Unsupported("previous_response_id and conversation cannot both be given",
                              "previous_response_id")
        asked.conversation_id, asked.task_id = response_ids(body.previous_response_id)
    reasoning = body.reasoning or {}
    text = body.text or {}
    asked.options = _options(temperature=body.temperature, top_p=body.top_p,
                             reasoning_effort=reasoning.get("effort"),
                             max_tokens=body.max_output_tokens)
    asked.tools, asked.instructions = _tools(body.tools, body.tool_choice, asked.instructions,
                                             chat=False)
    fmt = text.get("format")
    asked.output_schema = _format(
        None if fmt is None else {"type": fmt.get("type"), "json_schema": fmt}
        if isinstance(fmt, dict) else fmt, "text.format")
    not_applied = []
    if reasoning.get("summary") is not None:
        not_applied.append("reasoning.summary")
    if text.get("verbosity") is not None:
        not_applied.append("text.verbosity")
    not_applied += [name for name in ("max_tool_calls", "context_management", "image")
                    if getattr(body, name) is not None]
    asked.not_applied = not_applied + _common_not_applied(body)
    _check_named(asked)
    return asked


# -- response ids -------------------------------------------------------------------------------


def response_id(conversation_id: str, task_id: str, after: str | None = None) -> str:
    """A response's id: its conversation, its task and, for the response to a client's tool
    results, the first call they answered (``after``): all that is needed to continue it, or
    to rebuild it from the stored messages, on any replica."""
    token = base64.urlsafe_b64encode(conversation_id.encode()).decode().rstrip("=")
    tail = f".{after.removeprefix('call_')}" if after else ""
    return f"resp_{token}.{task_id.replace('-', '')}{tail}"


def response_ids(response: str) -> tuple[str, str | None]:
    """The conversation and the task a response id names (a forged one names ids the key's
    user must own: the run is refused as not found otherwise)."""
    conversation, task, _ = response_parts(response)
    return conversation, task


def response_parts(response: str) -> tuple[str, str | None, str | None]:
    """The conversation, the task (with its dashes) and the call a response id names."""
    try:
        if not response.startswith("resp_"):
            raise ValueError(response)
        token, *rest = response.removeprefix("resp_").split(".")
        conversation = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        if not conversation or len(rest) > 2:
            raise ValueError(response)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise NotFoundError(f"no response {response[:80]!r}") from exc
    task = call = None
    if rest:
        hexed = rest[0]
        if len(hexed) != 32 or any(c not in "0123456789abcdef" for c in hexed):
            raise NotFoundError(f"no response {response[:80]!r}")
        task = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
    if len(rest) == 2:
        call = f"call_{rest[1]}"
    return conversation, task, call


# -- parts ------------------------------------------------------------------------------------


def _common(body: _Request, endpoint: str) -> None:
    if body.model != MODEL:
        raise ModelNotFound(f"the model {body.model[:80]!r} is not served here; "
                            f"use {MODEL!r} (GET /v1/models)")
    if body.top_logprobs:
        raise Unsupported("logprobs are not available: the agent's answer is written in steps, "
                          "not sampled token by token for you", "top_logprobs")
    if body.moderation is not None:
        raise Unsupported("moderation is not run by Cogency (the agent judges each query's "
                          "safety itself); leave moderation out", "moderation")
    extra = sorted(name for name, value in (body.model_extra or {}).items()
                   if value is not None and name not in VENDOR_SAMPLING)
    if extra:
        raise Unsupported(f"{extra[0]!r} is not a field of {endpoint} (OpenAI's API, which "
                          "Cogency serves): remove it", extra[0])


def _refuse(body: BaseModel, names: Iterable[str]) -> None:
    why = {
        "logit_bias": "it names token ids of OpenAI's tokenizers, which the agent's model does "
                      "not share",
        "audio": "only text is generated",
        "web_search_options": "the agent has its own tools (web search is not one of this "
                              "server's built-ins)",
        "functions": "use tools (functions is OpenAI's deprecated form of them)",
        "function_call": "use tool_choice (function_call is OpenAI's deprecated form of it)",
        "prompt": "stored prompt templates are not available: send instructions",
        "access_programs": "access programs are OpenAI's own",
    }
    for name in names:
        value = getattr(body, name)
        if value is None or (name in ("logit_bias", "functions") and not value):
            continue  # none given (an empty bias or list of functions asks for nothing)
        raise Unsupported(f"{name} is not available: {why[name]}", name)


def _common_not_applied(body: _Request) -> list[str]:
    names = [name for name in VENDOR_SAMPLING if (body.model_extra or {}).get(name) is not None]
    if body.parallel_tool_calls is False:
        names.append("parallel_tool_calls")
    return names


def _check_named(asked: Asked) -> None:
    named = asked.conversation_id is not None or asked.task_id is not None
    if not asked.keep and named and asked.query is not None:
        raise Unsupported("store=false runs in a conversation of its own, which keeps nothing: "
                          "it cannot continue a stored one (resend the turns it needs instead)",
                          "store")


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in ("text", "input_text", "output_text", "refusal"):
                raise Unsupported(f"content parts of type {str(kind)[:40]!r} are not supported: "
                                  "send text", where)
            parts.append(str(part.get("text", part.get("refusal", ""))))
        return "".join(parts)
    raise Unsupported("message content must be text or a list of text parts", where)


def _query(text: str, where: str) -> str:
    if not text.strip():
        raise Unsupported("the last user message is empty", where)
    return text


def _turns(messages: Iterable[dict[str, Any]], where: str) -> list[tuple[str, str]]:
    """The turns a client resent: its user messages and the answers it was given (a call of
    its tools, and the tool's result, are no turn: a chat shows neither)."""
    turns = []
    for message in messages:
        role = message.get("role")
        if role == "user":
            turns.append(("user", _text(message.get("content"), where)))
        elif role == "assistant" and not message.get("tool_calls"):
            text = _text(message.get("content"), where)
            if text.strip():
                turns.append(("assistant", text))
    return turns


def _options(**given: Any) -> dict[str, Any]:
    return {name: value for name, value in given.items() if value is not None}


def _tools(tools: list[Any] | None, choice: str | dict[str, Any] | None, instructions: str,
           *, chat: bool) -> tuple[list[dict[str, Any]], str]:
    """The client's functions to offer, and the instructions with what ``tool_choice`` asks
    (a call that is required is asked for; which tools are offered follows the choice)."""
    functions: list[dict[str, Any]] = []
    for index, tool in enumerate(tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise Unsupported(f"tools[{index}] is of type {str(kind)[:40]!r}: only function tools "
                              "can be declared (the agent's own tools run on the server)",
                              f"tools[{index}]")
        functions.append(tool)
    def name_of(tool: Any) -> Any:
        spec = _field(tool, "function") if chat else tool
        return _field(spec, "name")

    if choice is None or choice == "auto":
        return functions, instructions
    if choice == "none":
        return [], instructions
    names: list[str] = []
    required = choice == "required"
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            name = name_of(choice)
            names = [name] if isinstance(name, str) else []
            required = True
        elif kind == "allowed_tools":
            allowed = _field(choice, "allowed_tools") if chat else choice
            listed = _field(allowed, "tools")
            names = [str(name_of(t)) for t in listed if isinstance(t, dict)] \
                if isinstance(listed, list) else []
            required = _field(allowed, "mode") == "required"
        else:
            raise Unsupported(f"tool_choice of type {str(kind)[:40]!r} is not available: only "
                              "function tools can be declared", "tool_choice")
        unknown = [name for name in names if name not in {name_of(t) for t in functions}]
        if not names or unknown:
            raise Unsupported(f"tool_choice names {str(unknown[:1] or names)[:80]}, which is not "
                              "among the tools", "tool_choice")
        functions = [t for t in functions if name_of(t) in names]
    elif choice != "required":
        raise Unsupported("tool_choice must be none, auto, required or a function",
                          "tool_choice")
    if required and functions:
        offered = ", ".join(str(name_of(t)) for t in functions)
        asked = (f"Before your final answer, call {offered} once (the application requires a "
                 "call to it)" if len(functions) == 1 else
                 f"Before your final answer, call at least one of {offered} (the application "
                 "requires it)")
        instructions = f"{instructions}\n\n{asked}" if instructions else asked
    return functions, instructions


def _field(value: Any, name: str) -> Any:
    """``value[name]`` if ``value`` is an object (a client's JSON may be any shape)."""
    return value.get(name) if isinstance(value, dict) else None


def _format(given: Any, where: str) -> dict[str, Any] | None:
    """The answer's JSON schema a ``response_format``/``text.format`` asks for, if any."""
    if given is None:
        return None
    if not isinstance(given, dict):
        raise Unsupported(f"{where} must be an object with a type", where)
    kind = given.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = given.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise Unsupported(f"{where}: a json_schema format needs its schema", where)
        return schema
    raise Unsupported(f"{where} of type {str(kind)[:40]!r} is not available: use text, "
                      "json_object or json_schema", where)
