"""Google's Gemini API on the official ``google-genai`` SDK (extra: ``cogency[gemini]``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigurationError, RefusalError
from ._provider import Failure, ProviderLLM, require
from ._schema import for_gemini
from .base import Completion, Message, Usage

GEMINI_CONTEXT = 1_048_576
_BLOCKED = {"SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "RECITATION"}


class GeminiLLM(ProviderLLM):
    """A Gemini model. ``api_key`` defaults to ``$GEMINI_API_KEY``, then ``$GOOGLE_API_KEY``.

    System messages go to ``system_instruction``; the step schema to ``response_json_schema``
    (in the subset Gemini documents); ``reasoning_effort`` (:meth:`with_options`) to
    ``thinking_config`` (``"none"`` as a thinking budget of 0, others as its level). ``base_url`` points the SDK at another endpoint (a
    LiteLLM proxy, a gateway) and ``api_version`` chooses the API version (``"v1beta"``, which
    ``response_json_schema`` needs, unless ``$GOOGLE_GENAI_API_VERSION`` says otherwise).
    """

    provider = "gemini"
    key_hint = "set GEMINI_API_KEY (or pass api_key=) to a valid key"

    def __init__(
        self,
        model: str = "gemini-2.5-flash",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_version: str | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("context_window", GEMINI_CONTEXT)
        super().__init__(model, **options)
        genai = require("google.genai", "gemini")
        self._types = require("google.genai.types", "gemini")
        self._errors = require("google.genai.errors", "gemini")
        key = api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
        if not key:
            raise ConfigurationError(
                "Gemini needs an API key: set GEMINI_API_KEY (or pass api_key=), "
                "or use llm='local' to run offline"
            )
        options_: dict[str, Any] = {"timeout": int(self.timeout * 1000)}  # milliseconds; no SDK retries
        if base_url:
            options_["base_url"] = base_url
        self.base_url = base_url
        self.api_version = api_version or os.environ.get("GOOGLE_GENAI_API_VERSION") or "v1beta"
        options_["api_version"] = self.api_version
        self._client = genai.Client(
            api_key=key, http_options=self._types.HttpOptions(**options_)
        )

    async def close(self) -> None:
        await self._client.aio.aclose()

    def _request(self, messages: list[Message], schema: dict[str, Any] | None) -> dict[str, Any]:
        system: list[str] = []
        contents: list[dict[str, Any]] = []
        for message in messages:
            if message["role"] == "system":
                system.append(message["content"])
                continue
            role = "model" if message["role"] == "assistant" else "user"
            if contents and contents[-1]["role"] == role:
                contents[-1]["parts"].append({"text": message["content"]})
            else:
                contents.append({"role": role, "parts": [{"text": message["content"]}]})
        config: dict[str, Any] = {}
        if system:
            config["system_instruction"] = "\n\n".join(system)
        if schema is not None:
            config["response_mime_type"] = "application/json"
            config["response_json_schema"] = for_gemini(schema)
        if self.max_tokens is not None:
            config["max_output_tokens"] = self.max_tokens
        if self.temperature is not None:
            config["temperature"] = self.temperature
        for name in ("top_p", "seed"):
            if name in self.options:
                config[name] = self.options[name]
        effort = self.options.get("reasoning_effort")
        if effort == "none":
            config["thinking_config"] = self._types.ThinkingConfig(thinking_budget=0)
        elif effort is not None:
            config["thinking_config"] = self._types.ThinkingConfig(thinking_level=effort.upper())
        return {
            "model": self.model,
            "contents": contents,
            "config": self._types.GenerateContentConfig(**config),
        }

    async def _attempt(
        self, messages: list[Message], schema: dict[str, Any] | None, stream: bool
    ) -> AsyncIterator[str | Completion]:
        request = self._request(messages, schema)
        models = self._client.aio.models
        if not stream:
            reply = await models.generate_content(**request)
            self._check_blocked(reply)
            yield Completion(_text(reply), _usage(reply.usage_metadata),
                             truncated=_finish(reply) == "MAX_TOKENS",
                             model=getattr(reply, "model_version", None))
            return
        parts: list[str] = []
        usage = Usage(calls=1)
        finish = ""
        model = None
        async for chunk in await models.generate_content_stream(**request):
            self._check_blocked(chunk)
            model = getattr(chunk, "model_version", None) or model
            finish = _finish(chunk) or finish
            text = _text(chunk)
            if text:
                parts.append(text)
                yield text
            if chunk.usage_metadata is not None:
                usage = _usage(chunk.usage_metadata)
        yield Completion("".join(parts), usage, truncated=finish == "MAX_TOKENS", model=model)

    def _cannot(self, option: str, value: Any) -> str | None:
        if option == "reasoning_effort" and value == "max":
            return "Gemini's thinking levels go up to xhigh"
        return None

    def _check_blocked(self, reply: Any) -> None:
        feedback = getattr(reply, "prompt_feedback", None)
        blocked = getattr(feedback, "block_reason", None) if feedback else None
        if blocked:
            raise RefusalError(f"{self.name} refused: the prompt was blocked ({_name(blocked)})")
        for candidate in reply.candidates or ():
            reason = _name(candidate.finish_reason)
            if reason in _BLOCKED:
                raise RefusalError(f"{self.name} refused: the reply was stopped ({reason})")

    def _failure(self, exc: Exception) -> Failure | None:
        if isinstance(exc, self._errors.APIError):
            response = getattr(exc, "response", None)
            return self._status_failure(
                exc.code, exc.message or str(exc), getattr(response, "headers", None)
            )
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & {"TimeoutException", "ServerTimeoutError"}:
            return self._timeout_failure()
        if names & {"TransportError", "ClientConnectionError"}:
            where = self.base_url or "Gemini (generativelanguage.googleapis.com)"
            return self._status_failure(None, f"cannot connect to {where} ({exc})")
        return None


def _finish(reply: Any) -> str:
    for candidate in (reply.candidates or [])[:1]:
        if candidate.finish_reason:
            return _name(candidate.finish_reason)
    return ""


def _text(reply: Any) -> str:
    texts = []
    for candidate in (reply.candidates or [])[:1]:  # one candidate is asked for
        content = candidate.content
        for part in (content.parts if content and content.parts else ()):
            if part.text and not getattr(part, "thought", False):
                texts.append(part.text)
    return "".join(texts)


def _usage(meta: Any) -> Usage:
    if meta is None:
        return Usage(calls=1)
    output = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
    return Usage(input_tokens=meta.prompt_token_count or 0, output_tokens=output, calls=1)


def _name(value: Any) -> str:
    return str(getattr(value, "value", value))
