"""Model strings, the environment's choice, missing extras, and the schema dialects."""

from __future__ import annotations

import sys
import textwrap

import pytest

from cogency import Agent, tool
from cogency.errors import ConfigurationError
from cogency.llm import AnthropicLLM, GeminiLLM, LocalLLM, OpenAILLM, resolve_llm
from cogency.llm._local import local_schema
from cogency.llm._schema import for_anthropic, for_openai
from cogency.reason import step_schema
from cogency.testing import ScriptedLLM

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY",
        "COGENCY_LLM", "OPENAI_BASE_URL", "OLLAMA_HOST")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)


async def test_provider_strings(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-a")
    monkeypatch.setenv("GEMINI_API_KEY", "g")
    cases = {
        "openai:gpt-4o-mini": (OpenAILLM, "openai:gpt-4o-mini"),
        "anthropic:claude-haiku-4-5": (AnthropicLLM, "anthropic:claude-haiku-4-5"),
        "gemini:gemini-2.5-flash": (GeminiLLM, "gemini:gemini-2.5-flash"),
        "ollama:llama3.1": (OpenAILLM, "ollama:llama3.1"),
        "openai:qwen@http://127.0.0.1:8000/v1": (OpenAILLM, "openai:qwen"),
    }
    for spec, (kind, name) in cases.items():
        llm, owned = resolve_llm(spec)
        assert isinstance(llm, kind) and llm.name == name and owned
        await llm.close()
    ollama, _ = resolve_llm("ollama:llama3.1")
    assert ollama.base_url == "http://localhost:11434/v1"
    await ollama.close()
    compatible, _ = resolve_llm("openai:qwen@http://127.0.0.1:8000/v1")
    assert compatible.base_url == "http://127.0.0.1:8000/v1" and not compatible.official
    await compatible.close()


def test_local_strings(tmp_path):
    assert isinstance(resolve_llm("local")[0], LocalLLM)
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    llm, _ = resolve_llm(f"local:{model}")
    assert llm.name == f"local:{model}" and llm.model_path == model
    with pytest.raises(ConfigurationError, match="no model file"):
        resolve_llm(f"local:{tmp_path / 'missing.gguf'}")


async def test_none_picks_from_the_environment(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-a")
    llm, owned = resolve_llm(None)
    assert isinstance(llm, AnthropicLLM) and owned
    await llm.close()
    monkeypatch.setenv("GEMINI_API_KEY", "g")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    llm, _ = resolve_llm(None)
    assert isinstance(llm, OpenAILLM)  # OpenAI first
    await llm.close()
    monkeypatch.setenv("COGENCY_LLM", "gemini:gemini-2.5-pro")
    llm, _ = resolve_llm(None)
    assert llm.name == "gemini:gemini-2.5-pro"
    await llm.close()


def test_none_without_keys_is_the_local_model_or_a_clear_error(monkeypatch):
    assert isinstance(resolve_llm(None)[0], LocalLLM)  # the local extra is a test dependency
    import cogency.llm._local as local

    monkeypatch.setattr(local, "local_available", lambda: False)
    with pytest.raises(ConfigurationError) as caught:
        resolve_llm(None)
    message = str(caught.value)
    assert "OPENAI_API_KEY" in message and "cogency[local]" in message


def test_missing_api_keys_say_what_to_set():
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        resolve_llm("anthropic:claude-haiku-4-5")
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY"):
        resolve_llm("gemini:gemini-2.5-flash")
    with pytest.raises(ConfigurationError, match="GROQ_API_KEY"):
        resolve_llm("groq:llama-3.1-8b-instant")


@pytest.mark.parametrize("module, spec, extra", [
    ("openai", "openai:gpt-4o-mini", "cogency[openai]"),
    ("anthropic", "anthropic:claude-haiku-4-5", "cogency[anthropic]"),
    ("google.genai", "gemini:gemini-2.5-flash", "cogency[gemini]"),
])
def test_a_missing_sdk_names_the_extra(monkeypatch, module, spec, extra):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(name, "k")
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ConfigurationError, match=extra.replace("[", r"\[").replace("]", r"\]")):
        resolve_llm(spec)


def test_unknown_strings_and_bad_types():
    with pytest.raises(ConfigurationError, match="unknown model 'nosuch:thing'"):
        resolve_llm("nosuch:thing")
    with pytest.raises(ConfigurationError, match="unknown model"):
        resolve_llm("gpt4")
    with pytest.raises(ValueError):
        resolve_llm(42)  # type: ignore[arg-type]


async def test_a_factory_named_module_attribute(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from cogency.testing import ScriptedLLM
        SHARED = ScriptedLLM([{"response": "shared"}])
        def make():
            return ScriptedLLM([{"response": "from the factory"}])
        def broken():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    made, owned = resolve_llm("my_models:make")
    assert isinstance(made, ScriptedLLM) and owned
    shared, owned = resolve_llm("my_models:SHARED")
    assert isinstance(shared, ScriptedLLM) and not owned
    with pytest.raises(ConfigurationError, match="not an LLM"):
        resolve_llm("my_models:broken")
    with pytest.raises(ConfigurationError, match="no attribute"):
        resolve_llm("my_models:absent")
    async with Agent(llm="my_models:make") as agent:
        result = await agent.run("hi")
    assert result.response == "from the factory"


@tool
def lookup(query: str, limit: int = 3) -> str:
    """Look something up."""
    return query


@tool
def exact(name: str) -> str:
    """Every argument required."""
    return name


def test_openai_strict_only_when_the_schema_allows_it():
    schema, strict = for_openai(step_schema([exact], True))
    assert strict and "maxLength" not in str(schema)
    _, strict = for_openai(step_schema([lookup], True))  # an optional argument
    assert not strict
    schema, strict = for_openai(step_schema([], False))
    assert strict and schema["properties"]["actions"]["items"] == {"type": "null"}


def test_anthropic_subset_keeps_tool_names_as_enums():
    schema = for_anthropic(step_schema([exact, lookup], True))
    variants = schema["properties"]["actions"]["items"]["anyOf"]
    assert [v["properties"]["name"]["enum"] for v in variants] == [["exact"], ["lookup"]]


def test_local_schema_is_bounded_ordered_and_answers_without_tools():
    schema = local_schema(step_schema([], True), judge_security=False)
    props = schema["properties"]
    # Only these: a small model asked for the workspace notes copies their descriptions.
    assert list(props) == ["secure", "actions", "response"]  # acts, or answers
    assert schema["required"] == list(props)
    assert props["secure"] == {"type": "boolean", "enum": [True]}
    assert props["response"]["type"] == "string" and props["response"]["minLength"] == 1
    assert props["response"]["maxLength"] <= 400
    with_tools = local_schema(step_schema([lookup], True), judge_security=True)
    assert with_tools["properties"]["secure"] == {"type": "boolean"}
    assert with_tools["properties"]["actions"]["maxItems"] == 2
    args = with_tools["properties"]["actions"]["items"]["anyOf"][0]["properties"]["args"]
    assert args["properties"]["query"]["maxLength"] <= 240
    assert args["additionalProperties"] is False
