"""OpenAI, and any server that speaks its chat-completions API (Ollama, vLLM, llama.cpp's
server, OpenRouter, Groq…), on the official ``openai`` SDK (extra: ``cogency[openai]``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigurationError, RefusalError
from ._provider import Failure, ProviderLLM, require
from ._schema import for_openai
from .base import Completion, Message, Usage

OPENAI_CONTEXT = 128_000


class OpenAILLM(ProviderLLM):
    """A chat model behind the OpenAI API or an OpenAI-compatible ``base_url``.

    ``api_key`` defaults to ``$OPENAI_API_KEY`` (servers that need none get a placeholder
    when ``base_url`` is given). With the official API the step schema is sent in OpenAI's
    strict subset; compatible servers get the full schema (llama.cpp, vLLM and Ollama turn
    it into a grammar, length bounds included).
    """

    provider = "openai"
    key_hint = "set OPENAI_API_KEY (or pass api_key=) to a valid key"

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        provider: str | None = None,
        extra_body: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if provider:
            self.provider = provider
        options.setdefault("context_window", OPENAI_CONTEXT)
        super().__init__(model, **options)
        sdk = require("openai", "openai")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.base_url = base_url
        self.official = base_url is None or "api.openai.com" in base_url
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self.official:
                raise ConfigurationError(
                    "OpenAI needs an API key: set OPENAI_API_KEY (or pass api_key=), "
                    "or use llm='local' to run offline"
                )
            key = "not-needed"  # local servers accept any key
        self.extra_body = extra_body or {}
        self._sdk = sdk
        self._client = sdk.AsyncOpenAI(
            api_key=key, base_url=base_url, timeout=self.timeout, max_retries=0
        )

    async def close(self) -> None:
        await self._client.close()

    def _request(self, messages: list[Message], schema: dict[str, Any] | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        }
        if schema is not None:
            if self.official:
                schema, strict = for_openai(schema)
            else:
                strict = True
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "step", "schema": schema, "strict": strict},
            }
        if self.max_tokens is not None:
            key = "max_completion_tokens" if self.official else "max_tokens"
            request[key] = self.max_tokens
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.extra_body:
            request["extra_body"] = self.extra_body
        return request

    async def _attempt(
        self, messages: list[Message], schema: dict[str, Any] | None, stream: bool
    ) -> AsyncIterator[str | Completion]:
        request = self._request(messages, schema)
        create = self._client.chat.completions.create
        if not stream:
            reply = await create(**request)
            usage = _usage(reply.usage)
            choice = reply.choices[0] if reply.choices else None
            message = choice.message if choice else None
            self._check_refusal(
                getattr(message, "refusal", None), choice.finish_reason if choice else None
            )
            yield Completion((message.content if message else None) or "", usage)
            return
        chunks = await create(**request, stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        refusal: list[str] = []
        finish = None
        usage = Usage(calls=1)
        async with chunks:
            async for chunk in chunks:
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta is not None and delta.content:
                        parts.append(delta.content)
                        yield delta.content
                    if delta is not None and getattr(delta, "refusal", None):
                        refusal.append(delta.refusal)
                    finish = choice.finish_reason or finish
        self._check_refusal("".join(refusal) or None, finish)
        yield Completion("".join(parts), usage)

    def _check_refusal(self, refusal: str | None, finish_reason: str | None) -> None:
        if refusal:
            raise RefusalError(f"{self.name} refused: {refusal}")
        if finish_reason == "content_filter":
            raise RefusalError(f"{self.name} refused: the provider's content filter stopped it")

    def _failure(self, exc: Exception) -> Failure | None:
        return self._sdk_failure(exc, self.base_url or "api.openai.com")


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage(calls=1)
    return Usage(
        input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        calls=1,
    )

