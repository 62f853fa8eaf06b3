"""Anthropic's Messages API on the official ``anthropic`` SDK (extra: ``cogency[anthropic]``)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigurationError, RefusalError
from ._provider import Failure, ProviderLLM, require
from ._schema import for_anthropic
from .base import Completion, Message, Usage

log = logging.getLogger("cogency.llm")

ANTHROPIC_CONTEXT = 200_000
DEFAULT_MAX_TOKENS = 4096
"""The Messages API requires a bound on the reply."""
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""The values of ``output_config.effort`` (what ``reasoning_effort`` becomes)."""
STEP_TOOL = "step"
"""The tool whose forced call carries a structured reply."""


class AnthropicLLM(ProviderLLM):
    """A Claude model. ``api_key`` defaults to ``$ANTHROPIC_API_KEY``.

    System messages go to the ``system`` field; consecutive messages of one role (tool
    results are user messages) are merged, since the API wants user and assistant to
    alternate. The step schema is enforced the way the Messages API reliably returns JSON: a
    forced call of a ``step`` tool whose ``input_schema`` is the schema (in the subset the SDK
    documents); its input is the reply. A server that ignores ``tool_choice`` (llama.cpp's
    ``/v1/messages``) answers in text, which is taken as the reply and validated as usual.
    ``temperature``, ``top_p`` (:meth:`with_options`) and ``extra_body`` go into the request
    body (the SDK has no parameter for them); ``reasoning_effort`` becomes
    ``output_config.effort``; there is no ``seed``.
    """

    provider = "anthropic"
    key_hint = "set ANTHROPIC_API_KEY (or pass api_key=) to a valid key"

    def __init__(
        self,
        model: str = "claude-haiku-4-5",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        extra_body: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("context_window", ANTHROPIC_CONTEXT)
        options.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        super().__init__(model, **options)
        sdk = require("anthropic", "anthropic")
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ConfigurationError(
                "Anthropic needs an API key: set ANTHROPIC_API_KEY (or pass api_key=), "
                "or use llm='local' to run offline"
            )
        self.extra_body = extra_body or {}
        self._warned = False
        self._sdk = sdk
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self._client = sdk.AsyncAnthropic(
            api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )

    async def close(self) -> None:
        await self._client.close()

    def _request(self, messages: list[Message], schema: dict[str, Any] | None) -> dict[str, Any]:
        system, chat = split_system(messages)
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": chat,
        }
        if system:
            request["system"] = system
        extra = dict(self.extra_body)
        if self.temperature is not None:
            # The SDK's create() has no temperature parameter: it goes in the body as is.
            extra["temperature"] = self.temperature
        if "top_p" in self.options:
            extra["top_p"] = self.options["top_p"]  # nor top_p
        if "reasoning_effort" in self.options:
            request["output_config"] = {"effort": self.options["reasoning_effort"]}
        if extra:
            request["extra_body"] = extra
        if schema is not None:
            request["tools"] = [{
                "name": STEP_TOOL,
                "description": "Reply with the next step: call this with the reply object.",
                "input_schema": for_anthropic(schema),
            }]
            request["tool_choice"] = {"type": "tool", "name": STEP_TOOL}
        return request

    async def _attempt(
        self, messages: list[Message], schema: dict[str, Any] | None, stream: bool
    ) -> AsyncIterator[str | Completion]:
        request = self._request(messages, schema)
        if not stream:
            reply = await self._client.messages.create(**request)
            self._check_stop(reply.stop_reason)
            calls = [block.input for block in reply.content
                     if getattr(block, "type", "") == "tool_use" and block.name == STEP_TOOL]
            text = json.dumps(calls[0]) if calls else "".join(
                block.text for block in reply.content if getattr(block, "type", "") == "text"
            )
            self._check_enforced(schema, bool(calls))
            yield Completion(text, _usage(reply.usage, None),
                             truncated=reply.stop_reason == "max_tokens",
                             model=getattr(reply, "model", None))
            return
        events = await self._client.messages.create(**request, stream=True)
        parts: list[str] = []
        start_usage = None
        delta_usage = None
        stop_reason = None
        model = None
        in_call = False
        async with events:
            async for event in events:
                kind = event.type
                if kind == "message_start":
                    start_usage = event.message.usage
                    model = getattr(event.message, "model", None)
                elif kind == "content_block_start":
                    block = event.content_block
                    if block.type == "tool_use" and block.name == STEP_TOOL and not in_call:
                        in_call, parts = True, []  # the step's input is the reply, not prose
                elif kind == "content_block_delta":
                    piece = _delta_text(event.delta, in_call)
                    if piece:
                        parts.append(piece)
                        yield piece
                elif kind == "message_delta":
                    delta_usage = event.usage
                    stop_reason = event.delta.stop_reason or stop_reason
        self._check_stop(stop_reason)
        self._check_enforced(schema, in_call)
        yield Completion("".join(parts), _usage(start_usage, delta_usage),
                         truncated=stop_reason == "max_tokens", model=model)

    def _cannot(self, option: str, value: Any) -> str | None:
        if option == "seed":
            return "the Messages API has no seed"
        if option == "reasoning_effort" and value not in ANTHROPIC_EFFORTS:
            return f"Anthropic's effort is one of {', '.join(ANTHROPIC_EFFORTS)}"
        return None

    def _check_enforced(self, schema: dict[str, Any] | None, called: bool) -> None:
        if schema is not None and not called and not self._warned:
            self._warned = True  # once: every reply from this server will be the same
            log.warning("%s answered in text although the step tool was forced: the server "
                        "ignores tool_choice, so structured output is not enforced (replies "
                        "are still validated)", self.name)

    def _check_stop(self, stop_reason: str | None) -> None:
        if stop_reason == "refusal":
            raise RefusalError(f"{self.name} refused to answer (stop_reason 'refusal')")

    def _failure(self, exc: Exception) -> Failure | None:
        return self._sdk_failure(exc, self.base_url or "Anthropic (api.anthropic.com)")


def _delta_text(delta: Any, in_call: bool) -> str:
    """The reply text a delta carries: the step tool's JSON once it began, else prose."""
    if in_call:
        return str(getattr(delta, "partial_json", "") or "") \
            if delta.type == "input_json_delta" else ""
    return str(delta.text or "") if delta.type == "text_delta" else ""


def split_system(messages: list[Message]) -> tuple[str, list[dict[str, str]]]:
    """The system text, and the chat with same-role neighbours merged so roles alternate.

    The chat starts with a user message (a leading assistant message gets a short user
    turn before it), as the Messages API requires.
    """
    system: list[str] = []
    chat: list[dict[str, str]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            system.append(content)
            continue
        role = "assistant" if role == "assistant" else "user"
        if chat and chat[-1]["role"] == role:
            chat[-1]["content"] += "\n\n" + content
        else:
            chat.append({"role": role, "content": content})
    if chat and chat[0]["role"] == "assistant":
        chat.insert(0, {"role": "user", "content": "(earlier conversation)"})
    if not chat:
        chat.append({"role": "user", "content": "(no message)"})
    return "\n\n".join(system), chat


def _usage(start: Any, delta: Any) -> Usage:
    def tokens(source: Any, name: str) -> int:
        return (getattr(source, name, 0) or 0) if source is not None else 0

    input_tokens = sum(
        tokens(start, name) or tokens(delta, name)
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    output = tokens(delta, "output_tokens") or tokens(start, "output_tokens")
    return Usage(input_tokens=input_tokens, output_tokens=output, calls=1)

