"""OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/responses`` (and
``GET /v1/responses/{id}``), ``/v1/models``.

The key from ``cogency keys create`` is the client's ``api_key``; the user is the key's user.
What each request field does is :mod:`.openai_requests`'s to say. Which Cogency conversation a
request continues:

- ``/v1/responses``: ``previous_response_id`` continues the conversation of that response
  (its id carries the conversation's id, so this survives restarts and works on any replica);
  ``conversation`` names one;
- either endpoint: ``metadata: {"conversation_id": ID}`` continues that conversation;
- naming none, with earlier turns (what a chat UI, or an SDK that keeps the history itself,
  resends): the user's most recently updated conversation whose turns are exactly those, in
  order (the user's queries and Cogency's final answers, each compared without leading and
  trailing whitespace; tool calls and results are not turns), found by one indexed lookup of
  a digest of them (the store keeps each conversation's). Turns that match none (edited,
  regenerated, or from elsewhere) start a new conversation that stores them first, so the
  model has the context the client shows (the newest whole turns that fit the history
  window; never another conversation's);
- otherwise a new conversation, whose id (made by the server) the reply carries
  (``conversation_id`` at the top level and in ``metadata``, and the
  ``X-Cogency-Conversation-Id`` header, percent-encoded where it holds anything but ASCII
  letters, digits and ``-._~``).

A conversation a client names must be one of its user's (404 otherwise, as for one that
does not exist): clients never choose the id of a new conversation. ``store: false`` runs in a
conversation of its own that is deleted when the run ends (nothing is learned from it).

The client's functions (``tools``) are offered to the model with the agent's own; a call to
one pauses the task durably (a waiting call with decider ``client``) and the reply carries
it (``tool_calls``, finish reason ``tool_calls``; Responses: ``function_call`` items). The
client's next request with the results (``tool`` messages; ``function_call_output`` items)
continues that task, found by the call's id, on any replica and after a restart.

Streaming sends the answer as the model writes it (``response_delta`` events); the agent's own
steps (its reasoning, its own tool calls) are not sent here (``/api/runs`` streams them).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends

from ..errors import NotFoundError
from . import sse
from .auth import Caller, caller
from .errors import NOT_APPLIED, AwaitingApproval, ModelNotFound, RunFailed, openai_body
from .openai_requests import (
    MODEL,
    Asked,
    ChatRequest,
    ResponsesRequest,
    chat_asked,
    response_id,
    response_parts,
    responses_asked,
)
from .runs import Run
from .wire import Json, dumps

router = APIRouter(prefix="/v1", dependencies=[Depends(caller)], tags=["openai"])

_HEADER = "X-Cogency-Conversation-Id"
_MODEL = {"id": MODEL, "object": "model", "created": 0, "owned_by": "cogency"}


@router.get("/models", summary="The served agent, as a model")
async def list_models() -> dict[str, Any]:
    return {"object": "list", "data": [_MODEL]}


@router.get("/models/{model_id}", summary="The served agent, as a model")
async def get_model(model_id: str) -> dict[str, Any]:
    if model_id != MODEL:
        raise ModelNotFound(f"the model {model_id[:80]!r} is not served here; "
                            f"use {MODEL!r} (GET /v1/models)")
    return _MODEL


@router.post("/chat/completions", summary="Chat Completions (OpenAI-compatible)")
async def chat_completions(body: ChatRequest, me: Caller = Depends(caller)) -> Any:
    asked = chat_asked(body)
    run = await _start(me, asked, body)
    created = run.created
    after = _after(asked)
    headers = _headers(run.conversation_id, asked)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        each, end = _chat_chunks(run, created, include_usage, after)
        return sse.response(run, each, end, headers)
    result = await _finished(run)
    calls = _client_calls(result)
    if calls is None:
        message: dict[str, Any] = {"role": "assistant", "content": result["response"],
                                   "refusal": None}
        finish = "length" if result.get("truncated") else "stop"
    else:
        message = {"role": "assistant", "content": None, "refusal": None,
                   "tool_calls": [_chat_call(call) for call in calls]}
        finish = "tool_calls"
    completion = {
        "id": _chat_id(result["task_id"], after),
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                     "message": message}],
        "usage": _chat_usage(result),
        "conversation_id": result["conversation_id"],
        "service_tier": "default",
        "system_fingerprint": None,
    }
    return Json(completion, headers=_headers(result["conversation_id"], asked))


@router.post("/responses", summary="Responses (OpenAI-compatible)")
async def responses(body: ResponsesRequest, me: Caller = Depends(caller)) -> Any:
    asked = responses_asked(body)
    run = await _start(me, asked, body)
    created = run.created
    after = _after(asked)
    if body.stream:
        each, end = _response_events(run, created, body, after)
        return sse.response(run, each, end, _headers(run.conversation_id, asked))
    result = await _finished(run)
    conversation = result["conversation_id"]
    rid = response_id(conversation, result["task_id"], after)
    output, status = _output(result, rid)
    return Json(_response_object(rid, conversation, created, status, output, result["usage"],
                                 body), headers=_headers(conversation, asked))


@router.get("/responses/{response_id}", summary="A response, as stored (Responses API)")
async def get_response(response_id: str, me: Caller = Depends(caller)) -> Any:
    """The response rebuilt from what the conversation stored: its answer, or the calls of
    your functions it asked for. Only yours (another user's id is not found)."""
    conversation, task, call = response_parts(response_id)
    missing = NotFoundError(f"no response {response_id[:80]!r} among yours")
    if task is None:
        raise missing
    messages = await me.task_messages(task)
    if not messages:
        raise missing
    # A response is the part of the task's messages from the results its request sent (the
    # first response: from the start) to the results of the next request.
    results = [_waited_result(m) for m in messages]
    start = 0
    if call is not None:
        found = [i for i, r in enumerate(results) if r is not None and r["id"] == call]
        if not found:
            raise missing
        start = found[0]
        while start > 0 and results[start - 1] is not None:
            start -= 1  # the first of the results that request sent
    end = next((i for i in range(start + 1, len(messages))
                if results[i] is not None and results[i - 1] is None), len(messages))
    answers = [m["content"] for m in messages[start:end] if m["role"] == "assistant"
               and not m["content"].startswith('{"actions"')]
    if answers:
        output = [_message_item(response_id, answers[-1])]
    elif end < len(messages):  # it paused; the results of the next request follow
        called = itertools.takewhile(lambda r: r is not None, results[end:])
        output = [_function_call(r) for r in called if r is not None]
    else:
        try:
            waiting = await me.approvals(task)
        except NotFoundError:
            waiting = []
        output = [_function_call(c) for c in waiting
                  if c["decider"] == "client" and c["status"] == "pending"]
    status = "completed" if output else "incomplete"
    created = _timestamp(messages[start].get("created_at"))
    return _response_object(response_id, conversation, created, status, output, None, None)


# -- requests -----------------------------------------------------------------------------------


async def _start(me: Caller, asked: Asked, body: ChatRequest | ResponsesRequest) -> Run:
    """The run a request starts: a new one, or the continuation of the task that waits for
    the results it brings."""
    once = me.once(body) if asked.keep else None  # a run that keeps nothing leaves no record
    if asked.query is None:
        first = next(iter(asked.results))
        task = asked.task_id or await me.find_call(first)
        if task is None:
            raise NotFoundError(
                f"no task of yours waits for the result of call {first[:80]!r} (it was answered "
                "already, or is not yours): send a user message to go on")
        return await me.resume(task, once=once, results=asked.results)
    asked.options, dropped = me.model_options(asked.options)
    asked.not_applied += dropped
    history = asked.history if asked.conversation_id is None else []
    find = None
    if history and asked.keep:  # resent turns: the conversation they are, or a new one's start
        def find() -> Any:
            return me.conversation_with_turns(history)
    return await me.run(asked.query, asked.conversation_id, history, find=find, once=once,
                        asks=asked.run_options())


def _after(asked: Asked) -> str | None:
    """The call whose result a continuation brought first: it tells its response apart from
    the task's earlier ones."""
    return next(iter(asked.results), None) if asked.query is None else None


def _headers(conversation_id: str, asked: Asked) -> dict[str, str]:
    """The conversation's id (percent-encoded: any id fits in a header), and the fields that
    were accepted but changed nothing."""
    headers = {_HEADER: quote(conversation_id, safe="-._~")}
    if asked.not_applied:
        headers[NOT_APPLIED] = ", ".join(dict.fromkeys(asked.not_applied))
    return headers


# -- answers ------------------------------------------------------------------------------------


async def _finished(run: Run) -> dict[str, Any]:
    result = await run.finished()
    if result["response"] is None and _client_calls(result) is None:
        raise _unanswered(result, run.kept)
    return result


def _client_calls(result: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The calls of the client's tools a run paused for (None: it did not pause for them)."""
    if result["stop_reason"] != "awaiting_tool_results":
        return None
    return [call for call in result["pending_approvals"]
            if call.get("decider", "person") == "client"]


def _unanswered(result: dict[str, Any], kept: bool) -> AwaitingApproval | RunFailed:
    """The error of a run over without an answer: paused for a person, or stopped (its task
    kept to resume, or, for a run that keeps nothing, gone)."""
    task = result["task_id"]
    if result["stop_reason"] == "awaiting_approval":
        calls = ", ".join(f"{c['name']} ({c['id']})" for c in result["pending_approvals"])
        return AwaitingApproval(
            f"the agent waits for your approval of {calls}: decide with POST "
            f"/api/tasks/{task}/approvals (or on the web page), whose reply carries the answer")
    return RunFailed(f"the run stopped ({result['stop_reason']}) without an answer"
                     + (f": {result['error']}" if result.get("error") else "")
                     + (f"; task {task} can be resumed (POST /api/tasks/{task}/resume)" if kept
                        else "; nothing of it was kept (store: false): send the request again"))


def _chat_usage(result: dict[str, Any]) -> dict[str, int]:
    usage = result["usage"]
    return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"]}


def _chat_id(task_id: str, after: str | None) -> str:
    return f"chatcmpl-{task_id}" + (f"-{after.removeprefix('call_')}" if after else "")


def _chat_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": dumps(call["args"])}}


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
        error = _unanswered(run.summary(), run.kept)
        status, kind, message = error.status, error.kind, str(error)
    return dict(openai_body(status, kind, message)["error"])


class _Streamed:
    """The answer as a stream sends it: each ``response_delta`` as it comes, then whatever of
    the ``response`` the deltas did not carry.

    An SSE client cannot take text back, so when the agent starts its answer again (a reply
    that turned out invalid, then an answer that differs from what was sent: a ``restart``)
    the new answer follows what was sent after a blank line; the stored answer, and the final
    events that carry a whole response, hold the answer alone."""

    def __init__(self) -> None:
        self.sent = ""
        self._since = ""  # the answer's text since the last restart
        self._broken = False

    def piece(self, text: str, restart: bool) -> str:
        if restart:
            self._since, self._broken = "", bool(self.sent)
        return self._add(text)

    def rest(self, answer: str) -> str:
        if answer.startswith(self._since):
            return self._add(answer[len(self._since):])
        self._since, self._broken = "", bool(self.sent)
        return self._add(answer)

    def _add(self, text: str) -> str:
        if not text:
            return ""
        out = f"\n\n{text}" if self._broken else text
        self._broken = False
        self._since += text
        self.sent += out
        return out


def _chat_chunks(run: Run, created: int, include_usage: bool,
                 after: str | None) -> tuple[sse.Format, sse.End]:
    base = {"id": "", "object": "chat.completion.chunk", "created": created, "model": MODEL,
            "service_tier": "default", "system_fingerprint": None,
            "conversation_id": run.conversation_id}
    text = _Streamed()

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _data({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                           "logprobs": None}]})

    def each(event: dict[str, Any]) -> Iterable[bytes]:
        kind = event["type"]
        if kind == "start":
            base["id"] = _chat_id(event["task_id"], after)
            base["conversation_id"] = run.conversation_id
            yield chunk({"role": "assistant", "content": ""})
        elif kind in ("response_delta", "response"):
            piece = (text.piece(event["text"], event["restart"]) if kind == "response_delta"
                     else text.rest(event["text"]))
            if piece:
                yield chunk({"content": piece})

    def end() -> Iterable[bytes]:
        calls = _client_calls(run.summary()) if run.failure is None else None
        if _answered(run):
            yield chunk({}, "length" if run.summary().get("truncated") else "stop")
        elif calls is not None:
            for index, call in enumerate(calls):
                yield chunk({"tool_calls": [{"index": index, **_chat_call(call)}]})
            yield chunk({}, "tool_calls")
        else:
            yield _data({"error": _failure(run)})
        if include_usage and run.failure is None and (calls is not None or _answered(run)):
            yield _data({**base, "choices": [], "usage": _chat_usage(run.summary())})
        yield b"data: [DONE]\n\n"

    return each, end


# -- the Responses API --------------------------------------------------------------------------


def _message_item(rid: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{rid.removeprefix('resp_')}", "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}",
            "call_id": call["id"], "name": call["name"], "arguments": dumps(call["args"]),
            "status": "completed"}


def _output(result: dict[str, Any], rid: str) -> tuple[list[dict[str, Any]], str]:
    """A finished run's output items and status."""
    calls = _client_calls(result)
    if calls is not None:
        return [_function_call(call) for call in calls], "completed"
    return ([_message_item(rid, result["response"])],
            "incomplete" if result.get("truncated") else "completed")


def _response_object(rid: str, conversation: str, created: int, status: str,
                     output: list[dict[str, Any]], usage: dict[str, Any] | None,
                     body: ResponsesRequest | None) -> dict[str, Any]:
    """A Response, reporting back what the request asked (a rebuilt one: the defaults)."""
    asked: dict[str, Any] = {} if body is None else body.model_dump(exclude_none=True)
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": MODEL,
        "output": output,
        "previous_response_id": asked.get("previous_response_id"),
        "metadata": {**asked.get("metadata", {}), "conversation_id": conversation},
        "conversation_id": conversation,
        "usage": None if not usage else {
            "input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                               and usage else None),
        "instructions": asked.get("instructions"),
        "parallel_tool_calls": asked.get("parallel_tool_calls", True),
        "tool_choice": asked.get("tool_choice", "auto"),
        "tools": asked.get("tools", []),
        "temperature": asked.get("temperature"),
        "top_p": asked.get("top_p"),
        "max_output_tokens": asked.get("max_output_tokens"),
        "max_tool_calls": asked.get("max_tool_calls"),
        "reasoning": asked.get("reasoning", {"effort": None, "summary": None}),
        "text": asked.get("text", {"format": {"type": "text"}}),
        "truncation": asked.get("truncation", "disabled"),
        "store": asked.get("store", True),
        "background": False,
        "service_tier": "default",
        "top_logprobs": 0,
        "user": asked.get("user"),
        "safety_identifier": asked.get("safety_identifier"),
        "prompt_cache_key": asked.get("prompt_cache_key"),
    }


def _response_events(run: Run, created: int, body: ResponsesRequest,
                     after: str | None) -> tuple[sse.Format, sse.End]:
    numbers = itertools.count()
    text = _Streamed()
    state: dict[str, Any] = {"rid": "", "open": False}

    def emit(kind: str, **fields: Any) -> bytes:
        return _data({"type": kind, "sequence_number": next(numbers), **fields}, kind)

    def shell(status: str, output: list[dict[str, Any]],
              usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return _response_object(state["rid"], run.conversation_id, created, status, output,
                                usage, body)

    def item_id() -> str:
        return f"msg_{state['rid'].removeprefix('resp_')}"

    def delta(piece: str) -> Iterable[bytes]:
        if not state["open"]:
            state["open"] = True
            yield emit("response.output_item.added", output_index=0, item={
                "type": "message", "id": item_id(), "status": "in_progress",
                "role": "assistant", "content": []})
            yield emit("response.content_part.added", item_id=item_id(), output_index=0,
                       content_index=0,
                       part={"type": "output_text", "text": "", "annotations": []})
        if piece:
            yield emit("response.output_text.delta", item_id=item_id(), output_index=0,
                       content_index=0, delta=piece, logprobs=[])

    def each(event: dict[str, Any]) -> Iterable[bytes]:
        kind = event["type"]
        if kind == "start":
            state["rid"] = response_id(run.conversation_id, event["task_id"], after)
            yield emit("response.created", response=shell("in_progress", []))
            yield emit("response.in_progress", response=shell("in_progress", []))
        elif kind == "response_delta":
            piece = text.piece(event["text"], event["restart"])
            if piece:
                yield from delta(piece)
        elif kind == "response":
            yield from delta(text.rest(event["text"]))
            part = {"type": "output_text", "text": text.sent, "annotations": []}
            yield emit("response.output_text.done", item_id=item_id(), output_index=0,
                       content_index=0, text=text.sent, logprobs=[])
            yield emit("response.content_part.done", item_id=item_id(), output_index=0,
                       content_index=0, part=part)
            yield emit("response.output_item.done", output_index=0, item={
                "type": "message", "id": item_id(), "status": "completed",
                "role": "assistant", "content": [part]})

    def end() -> Iterable[bytes]:
        summary = run.summary() if run.failure is None else None
        calls = _client_calls(summary) if summary is not None else None
        if calls is not None:
            for index, call in enumerate(calls):
                item = _function_call(call)
                yield emit("response.output_item.added", output_index=index,
                           item={**item, "arguments": "", "status": "in_progress"})
                yield emit("response.function_call_arguments.delta", item_id=item["id"],
                           output_index=index, delta=item["arguments"])
                yield emit("response.function_call_arguments.done", item_id=item["id"],
                           output_index=index, name=item["name"],
                           arguments=item["arguments"])
                yield emit("response.output_item.done", output_index=index, item=item)
        if summary is not None and (calls is not None or _answered(run)):
            output, status = _output(summary, state["rid"])
            kind = "response.completed" if status == "completed" else "response.incomplete"
            yield emit(kind, response=shell(status, output, summary["usage"]))
            return
        error = _failure(run)
        failed = shell("failed", [], summary["usage"] if summary else None)
        failed["error"] = {"code": error["code"], "message": error["message"]}
        yield emit("response.failed", response=failed)

    return each, end


def _waited_result(message: dict[str, Any]) -> dict[str, Any] | None:
    """The stored result of a call that waited (its ``id``, ``name``, ``args``), or ``None``
    for any other message."""
    if message.get("role") != "tool" or '"id":"call_' not in message.get("content", ""):
        return None
    try:
        result = json.loads(message["content"])
    except ValueError:
        return None
    if not isinstance(result, dict) or not isinstance(result.get("id"), str):
        return None
    return {"id": result["id"], "name": str(result.get("name")),
            "args": result.get("args") or {}}


def _timestamp(stamp: Any) -> int:
    try:
        return int(datetime.fromisoformat(str(stamp)).timestamp())
    except ValueError:
        return int(time.time())
