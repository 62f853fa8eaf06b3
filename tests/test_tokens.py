"""Token counts without the start-up bill: a process loads the exact encoding only when a
count must be exact, and every window stays what exact counts make it.

A stored count is the exact count, or (in a process that never loaded the encoding) the text's
UTF-8 length: an upper bound of its tokens, since no token is shorter than a byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import subprocess
import sys
import textwrap
import zlib
from importlib import resources
from pathlib import Path

import pytest
from cli_run import Cli, step
from hypothesis import given, settings
from hypothesis import strategies as st

from cogency import Agent
from cogency.errors import ContextWindowError
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tokens import loaded, most_tokens

SRC = str(Path(__file__).resolve().parents[1] / "src")
PUBLISHED_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
"""tiktoken's published hash of cl100k_base.tiktoken (tiktoken_ext/openai_public.py)."""


def test_the_shipped_ranks_are_tiktokens_published_cl100k_base():
    data = zlib.decompress(resources.files("cogency._data").joinpath(
        "cl100k_base.ranks").read_bytes())
    count = int.from_bytes(data[:4], "little")
    lengths, body = data[4:4 + count], data[4 + count:]
    lines, at = [], 0
    for rank, length in enumerate(lengths):
        lines.append(base64.b64encode(body[at:at + length]) + b" %d" % rank)
        at += length
    assert at == len(body) and count == 100_256
    assert hashlib.sha256(b"\n".join(lines) + b"\n").hexdigest() == PUBLISHED_SHA256


def test_a_fresh_process_answering_a_short_query_never_loads_the_encoding(tmp_path):
    """Agent.run in a fresh process, two turns of one conversation on a SQLite file: the
    answer comes and is stored, and neither the encoding nor tiktoken was ever loaded."""
    db = tmp_path / "a.db"
    program = textwrap.dedent(f"""
        import asyncio, json, sys
        from cogency import Agent
        from cogency.testing import ScriptedLLM
        from cogency.tokens import loaded

        async def main():
            llm = ScriptedLLM([{{"response": "Paris."}}, {{"response": "About 2 million."}}])
            async with Agent(llm, store={str(db)!r}) as agent:
                first = await agent.run("What is the capital of France?", "alice")
                second = await agent.run("How many people live there?", "alice",
                                         first.conversation_id)
            print(json.dumps({{"answers": [first.response, second.response],
                               "seen": len(llm.calls[-1]), "loaded": loaded(),
                               "tiktoken": "tiktoken" in sys.modules}}))

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["answers"] == ["Paris.", "About 2 million."]
    assert report["seen"] == 4  # the system message, the first turn and the new query
    assert report["loaded"] is False and report["tiktoken"] is False
    with sqlite3.connect(db) as check:
        stored = check.execute("SELECT content, tokens FROM conversation_messages "
                               "ORDER BY seq").fetchall()
    # Stored with the upper bound of their counts (their UTF-8 length): never below the count.
    assert [tokens for _, tokens in stored] == [len(content.encode()) for content, _ in stored]
    assert len(stored) == 4


def test_the_cli_answering_a_short_query_never_loads_the_encoding(tmp_path, db_path):
    report = tmp_path / "report.json"
    done = Cli(tmp_path, db_path)("run", "What is the capital of France?",
                                  script=[step(response="Paris.")], llm="cli_models:reporting",
                                  COGENCY_TEST_REPORT=str(report))
    assert done.returncode == 0, done.stderr
    assert "Paris." in done.stdout
    facts = json.loads(report.read_text())
    assert facts["loaded"] is False and facts["tiktoken"] is False, facts


async def test_the_history_window_stays_exact_near_its_budget(tmp_path, tokenizer_unloaded):
    """Turns of one conversation under a 120-token history window, starting as a fresh
    process: while the stored bounds fit, nothing is counted; past that, the model sees
    exactly the newest messages that fit by exact counts (bounds are 4 times the count here),
    also after another process (a subprocess) that stored bounds took a turn."""
    exact = tokenizer_unloaded
    db = tmp_path / "w.db"
    budget = 120
    texts = [f"turn {n}: " + "the quick brown fox jumps over the lazy dog " * 2 for n in range(12)]

    def reply(messages):
        return {"response": "answer " + messages[-1]["content"]}

    llm = ScriptedLLM([reply] * 20)
    store = SQLiteStore(db)
    conversation = None
    try:
        async with Agent(llm, store=store, history_tokens=budget) as agent:
            for turn, text in enumerate(texts):
                if turn == 8:  # another process takes a turn, storing bounds
                    await _turn_in_another_process(db, conversation)
                result = await agent.run(text, "alice", conversation)
                conversation = result.conversation_id
                with sqlite3.connect(db) as check:
                    rows = check.execute(
                        "SELECT content, tokens FROM conversation_messages ORDER BY seq DESC"
                    ).fetchall()
                rows = rows[1:]  # the window was read before this turn's answer was stored
                expected, used = [], 0
                for content, tokens in rows:
                    assert tokens in (exact(content), most_tokens(content))
                    if used + exact(content) > budget:
                        break
                    used += exact(content)
                    expected.append(content)
                seen = [m["content"] for m in llm.calls[-1][1:]]
                assert seen == expected[::-1], turn
                bounds = sum(most_tokens(content) for content, _ in rows)
                if bounds <= budget:  # everything fits whatever the counts: nothing counted
                    assert not loaded() and len(seen) == len(rows), turn
            assert loaded() and len(seen) < len(rows)  # the window did fill
        # Stored once the encoding was loaded: the last turn's query and answer (lines of
        # words, counted by their words) hold tiktoken's own counts.
        import cogency.tokens as tokens

        with sqlite3.connect(db) as check:
            newest = check.execute("SELECT content, tokens FROM conversation_messages "
                                   "ORDER BY seq DESC LIMIT 2").fetchall()
        assert [content for content, _ in newest] == ["answer " + texts[-1], texts[-1]]
        for content, stored in newest:
            assert stored == len(tokens._encoding().encode_ordinary(content)) < len(content)
    finally:
        await store.close()


async def _turn_in_another_process(db: Path, conversation: str | None) -> None:
    program = textwrap.dedent(f"""
        import asyncio
        from cogency import Agent
        from cogency.testing import ScriptedLLM

        async def main():
            async with Agent(ScriptedLLM([{{"response": "from elsewhere " * 6}}]),
                             store={str(db)!r}, history_tokens=120) as agent:
                await agent.run("another process asks " + "a b c d " * 8, "alice",
                                {conversation!r})

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


async def test_a_prompt_near_the_model_window_is_counted_exactly(tokenizer_unloaded):
    """Earlier turns stored with bounds (the encoding not loaded), then a model with a small
    window: the query, whose UTF-8 length alone is beyond the window, reaches the model whole,
    and the earlier turn comes too because its exact count fits (its bound would not). A
    query whose tokens do not fit is refused with its exact count."""
    exact = tokenizer_unloaded
    earlier = "hello " + "word " * 170  # 856 bytes, about 170 tokens
    query = "please " + "word " * 900  # 4,507 bytes, about 900 tokens
    llm = ScriptedLLM([{"response": "ok"}] * 3)  # a 128,000-token window for the first turn
    async with Agent(llm, store=":memory:") as agent:
        first = await agent.run(earlier, "alice")
        assert not loaded()  # everything fit by the bounds: nothing counted
        llm.context_window = 3_800
        second = await agent.run(query, "alice", first.conversation_id)
        assert second.response == "ok"
        sent = llm.calls[-1]
        assert [m["content"] for m in sent[1:]] == [earlier, "ok", query]  # all of it, whole
        system = most_tokens(sent[0]["content"])
        assert system + most_tokens(query) + most_tokens(earlier) > 3_800 - 1_024  # bounds
        too_long = "word " * 2_000
        try:
            await agent.run(too_long, "alice", first.conversation_id)
        except ContextWindowError as exc:
            assert f"the query is {exact(too_long):,} tokens" in str(exc)
        else:
            raise AssertionError("a query of 2,000 tokens cannot fit a 3,800-token window")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400) | st.text(alphabet="ab \n1é中😀", max_size=600))
def test_the_utf8_length_bounds_the_count_from_above(text):
    """What every shortcut rests on: no token is shorter than a byte, long runs cut included."""
    from cogency.tokens import count_tokens, exact_tokens, is_estimate, truncate_tokens

    assert count_tokens(text) <= most_tokens(text) == len(text.encode("utf-8", "surrogatepass"))
    assert exact_tokens(text, most_tokens(text)) == count_tokens(text)
    if count_tokens(text) != most_tokens(text):
        assert not is_estimate(text, count_tokens(text))  # an exact count is never recounted
    assert truncate_tokens(text, most_tokens(text)) == text


_PIECES = st.sampled_from(["a", "é", "中", "😀", " ", "\n", "\u3000", "\u00a0", "\x1c", "-"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_PIECES, st.integers(1, 140)), max_size=8))
def test_the_quick_look_for_long_runs_never_misses_one(parts):
    """Counting skips the search for runs of 128+ non-space characters (which it cuts) when a
    look at aligned blocks shows there is none: it must never say so of a text that has one."""
    from cogency.tokens import _LONG_RUN, _may_have_long_run

    text = "".join(piece * count for piece, count in parts)
    if _LONG_RUN.search(text) is not None:
        assert _may_have_long_run(text), text


def test_the_quick_look_finds_a_run_of_exactly_128_wherever_it_starts():
    from cogency.tokens import _may_have_long_run

    for start in range(130):
        for run in ("x" * 128, "é" * 128, "中" * 127 + "x"):
            assert _may_have_long_run(" " * start + run + " \n"), (start, run[0])
    assert not _may_have_long_run("ledger harbor quartz meadow " * 40)  # prose: no search


_ASCII = st.sampled_from([chr(c) for c in range(128)])
_ASCII_EDGES = st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f'sStTdDmMlLvVeErR09.!-_ "))


@settings(max_examples=600, deadline=None)
@given(st.lists(_ASCII_EDGES | _ASCII | st.sampled_from(["'ll", "'VE", "  ", " \n", "123456"]),
                max_size=120).map("".join))
def test_ascii_text_is_counted_as_tiktoken_counts_it(text):
    """ASCII text is counted by its pieces (Python's ``re``, the encoding's pattern spelled out
    for ASCII) and a cache of each piece's tokens: always tiktoken's own count of the text,
    whether the pieces were cached or not, at every kind of whitespace and contraction."""
    import cogency.tokens as tokens

    tokens.count_tokens("load")  # the pieces path runs once the encoding is loaded
    truth = len(tokens._encoding().encode_ordinary(text))
    assert tokens.count_tokens(text) == truth  # pieces new to the cache, or not
    assert tokens.count_tokens(text) == truth  # every piece cached now


_WORD = st.lists(_ASCII_EDGES | _ASCII | st.sampled_from(["'ll", "'S", "123456", "don't"]),
                 min_size=1, max_size=12).map("".join).map(lambda w: w.replace(" ", "x"))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(_WORD | st.sampled_from(["", "a" * 64, "b" * 65, "c" * 130, "1" * 70]),
                          st.sampled_from([" ", " ", " ", "  ", "   "])),
                min_size=1, max_size=40).map(lambda parts: "".join(w + s for w, s in parts)[:-1]))
def test_a_line_of_words_is_counted_by_its_words_as_tiktoken_counts_it(text):
    """Text whose only whitespace is single spaces is counted a word at a time (each word's
    tokens with the space before it, cached): always tiktoken's count, at digits,
    punctuation, contractions and control characters next to a space, spaces at the edges
    included, and with words too long to cache (a long run is then cut as everywhere). Other
    whitespace, and two spaces in a row (one piece), take the pieces' way."""
    import cogency.tokens as tokens

    tokens.count_tokens("load")
    spaced = not any(c in text for c in "\t\n\x0b\x0c\r") and "  " not in text
    by_words = []
    words = tokens._count_words
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokens, "_count_words", lambda text: by_words.append(text) or words(text))
        truth = (len(tokens._encode(text)) if tokens._may_have_long_run(text)
                 else len(tokens._encoding().encode_ordinary(text)))
        assert tokens.count_tokens(text) == truth
        assert tokens.count_tokens(text) == truth  # every word cached now
    assert by_words == ([text, text] if spaced and text else [])
    if spaced and text and max(map(len, text.split(" "))) <= tokens._PIECE_KEPT:
        assert words(text) == truth  # by its words, not handed on


def test_prose_and_code_are_counted_as_tiktoken_counts_them_and_the_cache_stays_bounded(
        monkeypatch):
    """This package's own source, cut in pieces, counted through a cache too small to hold
    their pieces: every count is tiktoken's, and the cache never holds more than its bound
    (one text with more new pieces than that adds none of them)."""
    import cogency.tokens as tokens

    tokens.count_tokens("load")
    monkeypatch.setattr(tokens, "_PIECE_TOKENS", {})
    monkeypatch.setattr(tokens, "_PIECES_KEPT", 500)
    encoding = tokens._encoding()
    source = "\n".join(path.read_text() for path in sorted(Path(SRC, "cogency").rglob("*.py")))
    texts = [part for at in range(0, len(source), 700)
             if (part := source[at:at + 700]).isascii() and not tokens._may_have_long_run(part)]
    assert len(texts) > 500
    for text in texts:
        assert tokens.count_tokens(text) == len(encoding.encode_ordinary(text))
        assert len(tokens._PIECE_TOKENS) <= 500
    words = [chr(97 + n % 26) + chr(97 + n // 26 % 26) + chr(97 + n // 676) for n in range(2_000)]
    many = "q " + " ".join(words)  # 2,000 pieces (" abc"), none seen
    assert tokens.count_tokens(many) == len(encoding.encode_ordinary(many))
    assert len(tokens._PIECE_TOKENS) <= 500
    for word in words:  # one new piece a text, each counted as the lookup meets it
        text = f"the answer is {word}, as before"
        assert tokens.count_tokens(text) == len(encoding.encode_ordinary(text))
        assert len(tokens._PIECE_TOKENS) <= 500


def test_a_long_text_is_counted_by_tiktoken_which_lets_the_gil_go(monkeypatch):
    """Counting by pieces holds the GIL (``re``, the lookups); tiktoken lets it go while it
    encodes. A long query is counted in a thread (``State.start_task``), so a text longer than
    ``_PIECES_TEXT`` goes to tiktoken: the event loop runs on meanwhile. Both counts are
    tiktoken's."""
    import cogency.tokens as tokens

    tokens.count_tokens("load")
    by_pieces: list[int] = []
    counted = tokens._count_ascii
    monkeypatch.setattr(tokens, "_count_ascii",
                        lambda text: by_pieces.append(len(text)) or counted(text))
    short = "the quick brown fox jumps over the lazy dog, 42 times. " * 100
    long = short * 4
    assert len(short) <= tokens._PIECES_TEXT < len(long)
    encoding = tokens._encoding()
    for text in (short, long):
        assert tokens.count_tokens(text) == len(encoding.encode_ordinary(text))
    assert by_pieces == [len(short)]
