"""OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/responses``, ``/v1/models``.

The key from ``cogency keys create`` is the client's ``api_key``; the user is the key's user.
Which Cogency conversation a request continues:

- ``/v1/responses``: ``previous_response_id`` continues the conversation of that response
  (its id carries the conversation's id, so this survives restarts and works on any replica);
- either endpoint: ``metadata: {"conversation_id": ID}`` continues that conversation;
- ``/v1/chat/completions`` naming none, with earlier turns (what a chat UI resends): the
  user's most recently updated conversation whose turns are exactly those, in order (the
  user's queries and Cogency's final answers, each compared without leading and trailing
  whitespace; tool calls and results are not turns), found by one indexed lookup of a digest
  of them (the store keeps each conversation's). Turns that match none (edited, regenerated,
  or from elsewhere) start a new conversation that stores them first, so the model has the
  context the client shows (the newest whole turns that fit the history window; never
  another conversation's);
- otherwise a new conversation, whose id (made by the server) the reply carries
  (``conversation_id`` at the top level and in ``metadata``, and the
  ``X-Cogency-Conversation-Id`` header, percent-encoded where it holds anything but ASCII
  letters, digits and ``-._~``).

A conversation a client names must be one of its user's (404 otherwise, as for one that
does not exist): clients never choose the id of a new conversation.

Cogency keeps each conversation's history itself: the query is the last user message, and
earlier messages a client resends for a stored conversation are not sent to the model
again (``/v1/responses`` input with earlier turns but no ``previous_response_id`` gets a 400
saying so). Fields Cogency cannot honour (``tools``, ``n`` > 1, ``temperature``, system
instructions, …) get a 400 in OpenAI's error shape naming the field, never silent ignoring.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from ..errors import NotFoundError
from . import sse
from .auth import Caller, caller
from .errors import AwaitingApproval, ModelNotFound, RunFailed, Unsupported, openai_body
from .runs import Run
from .wire import Json, dumps

router = APIRouter(prefix="/v1", dependencies=[Depends(caller)], tags=["openai"])

MODEL = "cogency"
"""The id ``/v1/models`` lists: the served agent (whatever model it reasons with)."""
_HEADER = "X-Cogency-Conversation-Id"
MAX_MESSAGES = 500
"""The most messages a chat request may carry (each resent turn is compared and may be stored)."""


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    n: int | None = None
    store: bool | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    previous_response_id: str | None = None
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    store: bool | None = None
    instructions: str | None = None
    tools: list[Any] | None = None


@router.get("/models", summary="The served agent, as a model")
async def list_models() -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "cogency"}]}


@router.post("/chat/completions", summary="Chat Completions (OpenAI-compatible)")
async def chat_completions(body: ChatRequest, me: Caller = Depends(caller)) -> Any:
    _check(body, "chat.completions")
    if body.n not in (None, 1):
        raise Unsupported("n must be 1: the agent gives one answer per run", "n")
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    conversation = (body.metadata or {}).get("conversation_id")
    if len(body.messages) > MAX_MESSAGES:
        raise Unsupported(
            f"a request carries at most {MAX_MESSAGES} messages, this one {len(body.messages)}: "
            "Cogency keeps the history, so name the conversation (metadata.conversation_id) "
            "and send only the new message", "messages")
    query = _query(body.messages, "messages")
    history: list[tuple[str, str]] = []
    if conversation is None:  # resent turns: the conversation they are, or a new one's start
        history = [(m["role"], _text(m.get("content"), "messages")) for m in body.messages[:-1]]
    run = await me.run(query, conversation, history,
                       find=(lambda: me.conversation_with_turns(history)) if history else None,
                       once=me.once(body))
    created = int(time.time())
    if body.stream:
        each, end = _chat_chunks(run, created, include_usage)
        return sse.response(run, each, end, _header(run.conversation_id))
    result = await _finished(run)
    completion = {
        "id": f"chatcmpl-{result['task_id']}",
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": result["response"],
                                 "refusal": None}}],
        "usage": _chat_usage(result),
        "conversation_id": result["conversation_id"],
        "system_fingerprint": None,
    }
    return _with_header(completion, result["conversation_id"])


@router.post("/responses", summary="Responses (OpenAI-compatible)")
async def responses(body: ResponsesRequest, me: Caller = Depends(caller)) -> Any:
    _check(body, "responses")
    if body.instructions is not None:
        raise Unsupported("instructions are not supported: the agent has its own",
                          "instructions")
    if body.tools:
        raise Unsupported("tools cannot be supplied by the client: the agent has its own",
                          "tools")
    conversation = (body.metadata or {}).get("conversation_id")
    if body.previous_response_id is not None:
        conversation = _conversation_of(body.previous_response_id)
    items = ([{"role": "user", "content": body.input}] if isinstance(body.input, str)
             else body.input)
    query = _query(items, "input")
    if len(items) > 1 and conversation is None:
        raise Unsupported(
            "input holds earlier turns but names no conversation: Cogency keeps the history "
            "itself; continue with previous_response_id (or metadata.conversation_id), or "
            "send only the new user message", "input")
    run = await me.run(query, conversation, once=me.once(body))
    created = int(time.time())
    if body.stream:
        each, end = _response_events(run, created, body)
        return sse.response(run, each, end, _header(run.conversation_id))
    result = await _finished(run)
    return _with_header(_response_object(result, created, body, "completed"),
                        result["conversation_id"])


# -- requests -----------------------------------------------------------------------------------


def _check(body: ChatRequest | ResponsesRequest, endpoint: str) -> None:
    if body.model != MODEL:
        raise ModelNotFound(f"the model {body.model[:80]!r} is not served here; "
                            f"use {MODEL!r} (GET /v1/models)")
    if body.store is False:
        raise Unsupported("store=false is not supported: Cogency keeps every conversation "
                          "(DELETE /api/profile forgets it)", "store")
    extra = sorted(name for name, value in (body.model_extra or {}).items()
                   if value is not None)
    if extra:
        raise Unsupported(
            f"{extra[0]!r} is not supported by {endpoint} on Cogency: the agent decides its "
            f"own model settings, tools and instructions; remove the field", extra[0]
        )


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                    "text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Unsupported(f"content parts of type {kind!r} are not supported: "
                                  "send text", where)
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise Unsupported("message content must be text or a list of text parts", where)


def _query(items: list[dict[str, Any]], where: str) -> str:
    """The last user message, after checking the rest of ``items`` can be honoured."""
    for item in items:
        role = item.get("role")
        if item.get("type", "message") != "message" or role not in ("user", "assistant"):
            what = role or item.get("type")
            raise Unsupported(
                f"{where} items of role/type {what!r} are not supported: send user and "
                "assistant messages (the agent has its own instructions and tools)", where)
    if items[-1].get("role") != "user":
        raise Unsupported(f"the last of {where} must be a user message: it is the query", where)
    query = _text(items[-1].get("content"), where)
    if not query.strip():
        raise Unsupported("the last user message is empty", where)
    return query


def _response_id(conversation_id: str, task_id: str) -> str:
    token = base64.urlsafe_b64encode(conversation_id.encode()).decode().rstrip("=")
    return f"resp_{token}.{task_id.replace('-', '')}"


def _conversation_of(response_id: str) -> str:
    """The conversation a response id names (a forged one names one the key's user must own:
    the run is refused as not found otherwise)."""
    try:
        token = response_id.removeprefix("resp_").rsplit(".", 1)[0]
        conversation = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        if not response_id.startswith("resp_") or not conversation:
            raise ValueError(response_id)
        return conversation
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise NotFoundError(f"no response {response_id[:80]!r}") from exc


# -- answers ------------------------------------------------------------------------------------


async def _finished(run: Run) -> dict[str, Any]:
    result = await run.finished()
    if result["response"] is None:
        raise _unanswered(result)
    return result


def _unanswered(result: dict[str, Any]) -> AwaitingApproval | RunFailed:
    """The error of a run over without an answer: paused for a person, or stopped."""
    task = result["task_id"]
    if result["stop_reason"] == "awaiting_approval":
        calls = ", ".join(f"{c['name']} ({c['id']})" for c in result["pending_approvals"])
        return AwaitingApproval(
            f"the agent waits for your approval of {calls}: decide with POST "
            f"/api/tasks/{task}/approvals (or on the web page), whose reply carries the answer")
    return RunFailed(f"the run stopped ({result['stop_reason']}) without an answer"
                     + (f": {result['error']}" if result.get("error") else "")
                     + f"; task {task} can be resumed (POST /api/tasks/{task}/resume)")


def _chat_usage(result: dict[str, Any]) -> dict[str, int]:
    usage = result["usage"]
    return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"]}


def _header(conversation_id: str) -> dict[str, str]:
    """The conversation's id as a header (percent-encoded: any id fits in one)."""
    return {_HEADER: quote(conversation_id, safe="-._~")}


def _with_header(payload: dict[str, Any], conversation_id: str) -> Json:
    return Json(payload, headers=_header(conversation_id))


def _data(payload: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {dumps(payload)}\n\n".encode()


def _answered(run: Run) -> bool:
    """The run is over with an answer (its ``response`` event was sent)."""
    return run.failure is None and run.summary()["response"] is not None


def _failure(run: Run) -> dict[str, Any]:
    """OpenAI's error object for a run over without an answer."""
    if run.failure is not None:
        status, kind, message = run.problem()
    else:
        error = _unanswered(run.summary())
        status, kind, message = error.status, error.kind, str(error)
    return dict(openai_body(status, kind, message)["error"])


def _chat_chunks(run: Run, created: int, include_usage: bool) -> tuple[sse.Format, sse.End]:
    base = {"id": "", "object": "chat.completion.chunk", "created": created, "model": MODEL,
            "system_fingerprint": None, "conversation_id": run.conversation_id}

    def each(event: dict[str, Any]) -> Iterable[bytes]:
        base["id"] = f"chatcmpl-{event['task_id']}"
        if event["type"] == "start":
            yield _data({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                    "content": ""},
                                              "finish_reason": None, "logprobs": None}]})
        elif event["type"] == "response":
            yield _data({**base, "choices": [{"index": 0, "delta": {"content": event["text"]},
                                              "finish_reason": None, "logprobs": None}]})

    def end() -> Iterable[bytes]:
        if not _answered(run):
            yield _data({"error": _failure(run)})
        else:
            yield _data({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                              "logprobs": None}]})
            if include_usage:
                yield _data({**base, "choices": [], "usage": _chat_usage(run.summary())})
        yield b"data: [DONE]\n\n"

    return each, end


def _response_object(result: dict[str, Any], created: int, body: ResponsesRequest,
                     status: str, text: str | None = None) -> dict[str, Any]:
    conversation = result["conversation_id"]
    answer = result.get("response") if text is None else text
    output = [] if answer is None else [{
        "type": "message", "id": f"msg_{result['task_id'].replace('-', '')}",
        "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": answer, "annotations": []}],
    }]
    usage = result.get("usage")
    return {
        "id": _response_id(conversation, result["task_id"]),
        "object": "response",
        "created_at": created,
        "status": status,
        "model": MODEL,
        "output": output,
        "previous_response_id": body.previous_response_id,
        "metadata": {**(body.metadata or {}), "conversation_id": conversation},
        "conversation_id": conversation,
        "usage": None if not usage else {
            "input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "error": None, "incomplete_details": None, "instructions": None,
        "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
        "temperature": None, "top_p": None, "truncation": "disabled",
        "text": {"format": {"type": "text"}},
    }


def _response_events(run: Run, created: int, body: ResponsesRequest) -> tuple[sse.Format, sse.End]:
    numbers = itertools.count()
    partial: dict[str, Any] = {"conversation_id": run.conversation_id, "task_id": "",
                               "response": None, "usage": None}

    def emit(kind: str, **fields: Any) -> bytes:
        return _data({"type": kind, "sequence_number": next(numbers), **fields}, kind)

    def each(event: dict[str, Any]) -> Iterable[bytes]:
        partial["task_id"] = event["task_id"]
        if event["type"] == "start":
            shell = _response_object(partial, created, body, "in_progress")
            yield emit("response.created", response=shell)
            yield emit("response.in_progress", response=shell)
        elif event["type"] == "response":
            item_id = f"msg_{event['task_id'].replace('-', '')}"
            text = event["text"]
            item = {"type": "message", "id": item_id, "status": "in_progress",
                    "role": "assistant", "content": []}
            yield emit("response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            yield emit("response.content_part.added", item_id=item_id, output_index=0,
                       content_index=0, part=part)
            yield emit("response.output_text.delta", item_id=item_id, output_index=0,
                       content_index=0, delta=text, logprobs=[])
            yield emit("response.output_text.done", item_id=item_id, output_index=0,
                       content_index=0, text=text, logprobs=[])
            done_part = {**part, "text": text}
            yield emit("response.content_part.done", item_id=item_id, output_index=0,
                       content_index=0, part=done_part)
            yield emit("response.output_item.done", output_index=0,
                       item={**item, "status": "completed", "content": [done_part]})

    def end() -> Iterable[bytes]:
        if _answered(run):
            yield emit("response.completed",
                       response=_response_object(run.summary(), created, body, "completed"))
            return
        error = _failure(run)
        failed = _response_object({**partial, **(run.summary() if run.result else {})},
                                  created, body, "failed")
        failed["error"] = {"code": error["code"], "message": error["message"]}
        yield emit("response.failed", response=failed)

    return each, end
