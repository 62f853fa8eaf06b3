"""OpenAI, and any server that speaks its chat-completions API (Ollama, vLLM, llama.cpp's
server, OpenRouter, Groq…), on the official ``openai`` SDK (extra: ``cogency[openai]``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigurationError, RefusalError
from ._provider import Failure, ProviderLLM, require
from ._schema import for_openai
from .base import Completion, Message, Usage

OPENAI_CONTEXT = 128_000
OLLAMA_DEFAULT_CONTEXT = 4096
"""What Ollama serves a model with unless ``num_ctx`` says otherwise (it cuts longer prompts
silently, so the model's own maximum would be a promise Ollama does not keep)."""
MAX_PROBE_BYTES = 1 << 20
"""A server's answer about its window is read up to this size (it could send anything)."""

log = logging.getLogger("cogency.llm")


class OpenAILLM(ProviderLLM):
    """A chat model behind the OpenAI API or an OpenAI-compatible ``base_url``.

    ``api_key`` defaults to ``$OPENAI_API_KEY`` (servers that need none get a placeholder
    when ``base_url`` is given). With the official API the step schema is sent in OpenAI's
    strict subset; compatible servers get the full schema (llama.cpp, vLLM and Ollama turn
    it into a grammar, length bounds included).

    ``context_window`` defaults to 128,000 for the official API; for another ``base_url``
    the server is asked on the first call (llama.cpp's ``/props``, ``max_model_len`` from
    vLLM's ``/v1/models``, Ollama's ``/api/show``: its ``num_ctx``, else Ollama's default of
    4,096), falling back to 128,000 with a warning.
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
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        official = base_url is None or "api.openai.com" in base_url
        if official:
            options.setdefault("context_window", OPENAI_CONTEXT)
        super().__init__(model, **options)
        sdk = require("openai", "openai")
        self.base_url = base_url
        self.official = official
        self._probed = official or self.window_given
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
        self._key = key
        self._client = sdk.AsyncOpenAI(
            api_key=key, base_url=base_url, timeout=self.timeout, max_retries=0
        )

    async def start(self) -> None:
        """Learn the context window from the server, once (see the class docstring)."""
        if self._probed:
            return
        self._probed = True
        found = await asyncio.to_thread(
            server_context_window, str(self.base_url), self.model, self._key
        )
        if found is None:
            log.warning("%s: the server did not say its context window; assuming %d tokens "
                        "(pass context_window= to set it)", self.name, OPENAI_CONTEXT)
        self.context_window = found or OPENAI_CONTEXT

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
        request.update(self.options)  # top_p, seed, reasoning_effort: the wire's own names
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
            finish = choice.finish_reason if choice else None
            self._check_refusal(getattr(message, "refusal", None), finish)
            yield Completion((message.content if message else None) or "", usage,
                             truncated=finish == "length", model=getattr(reply, "model", None))
            return
        chunks = await create(**request, stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        refusal: list[str] = []
        finish = None
        usage = Usage(calls=1)
        model = None
        async with chunks:
            async for chunk in chunks:
                model = getattr(chunk, "model", None) or model
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
        yield Completion("".join(parts), usage, truncated=finish == "length", model=model)

    def _check_refusal(self, refusal: str | None, finish_reason: str | None) -> None:
        if refusal:
            raise RefusalError(f"{self.name} refused: {refusal}")
        if finish_reason == "content_filter":
            raise RefusalError(f"{self.name} refused: the provider's content filter stopped it")

    def _failure(self, exc: Exception) -> Failure | None:
        return self._sdk_failure(exc, self.base_url or "api.openai.com")


def server_context_window(base_url: str, model: str, key: str = "") -> int | None:
    """The context window an OpenAI-compatible server reports for ``model``, if it does.

    Blocking (run it in a thread); each question is bounded to a few seconds and 1 MB.
    """
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def ask(url: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            url, data=data, headers={**headers, "Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=3) as reply:
                return json.loads(reply.read(MAX_PROBE_BYTES))
        except (OSError, ValueError):
            return None

    def positive(value: Any) -> int | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return int(value) if ok else None

    listing = ask(f"{base}/models")
    models = listing.get("data") if isinstance(listing, dict) else None
    if isinstance(models, list):
        entries = [m for m in models if isinstance(m, dict)]
        mine = [m for m in entries if m.get("id") == model] or (entries if len(entries) == 1
                                                                else [])
        for entry in mine:
            meta = entry.get("meta")
            meta = meta if isinstance(meta, dict) else {}
            for value in (entry.get("max_model_len"), meta.get("n_ctx"),
                          entry.get("context_length"), entry.get("max_context_length")):
                if (found := positive(value)) is not None:
                    return found
    props = ask(f"{root}/props")  # llama.cpp
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if isinstance(settings, dict) and (found := positive(settings.get("n_ctx"))) is not None:
        return found
    shown = ask(f"{root}/api/show", {"model": model})  # Ollama
    if isinstance(shown, dict):
        for line in str(shown.get("parameters") or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "num_ctx" and value.strip().isdigit():
                return int(value.strip())
        info = shown.get("model_info")
        if isinstance(info, dict):
            for name, value in info.items():
                if str(name).endswith(".context_length") and (found := positive(value)):
                    return min(found, OLLAMA_DEFAULT_CONTEXT)
    return None


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage(calls=1)
    return Usage(
        input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        calls=1,
    )

