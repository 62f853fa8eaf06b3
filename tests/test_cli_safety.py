"""Hostile text never drives the terminal; ids that look alike are refused (issue 11)."""

from __future__ import annotations

import json

import pytest
from cli_run import Cli, rows, step

from cogency import Agent
from cogency.cli import _has_secret
from cogency.errors import UsageError
from cogency.testing import ScriptedLLM

HOSTILE = ("\x1b[2J\x1b]0;pwned\x07\r\u2713 fake line\b\b\u202eevil\u200b\x9b31m\x1b[?1049h"
           "\u2028end")
RAW = [b"\x1b", b"\x07", b"\x08", b"\r", "\u202e".encode(), "\u200b".encode(),
       "\x9b".encode(), "\u2028".encode()]
"""What must never reach the terminal: ESC, BEL, backspace, CR, bidi override, zero-width
space, the C1 CSI, a line separator."""


@pytest.fixture
def cli(tmp_path, db_path):
    return Cli(tmp_path, db_path)


def assert_inert(raw: bytes) -> None:
    for code in RAW:
        assert code not in raw, f"{code!r} reached the terminal"


def test_model_tool_and_stored_text_is_shown_not_interpreted(cli, tmp_path, db_path):
    (tmp_path / "notes.txt").write_text(f"file says {HOSTILE}\n")
    done = cli("run", "read notes.txt", "--tools", "files", script=[
        step(actions=[{"name": "file_read", "args": {"path": "notes.txt"}},
                      {"name": "file_read", "args": {"path": HOSTILE}}], u=HOSTILE),
        step(response=f"answer {HOSTILE} \ud800 done"),
    ])
    assert done.returncode == 0, done.stderr  # a lone surrogate in the answer prints fine
    assert_inert(done.raw)
    out = done.stdout
    assert "understanding: \\x1b[2J\\x1b]0;pwned\\x07" in out  # the workspace, visibly
    assert "✓ file_read: file says \\x1b[2J" in out  # the tool's output, visibly
    assert "answer \\x1b[2J\\x1b]0;pwned\\x07\\r✓ fake line\\x08\\x08\\u202eevil\\u200b\\x9b31m" in out
    assert "\\ud800 done" in out and "\\u2028end" in out

    stalled = cli("run", f"stored {HOSTILE}", "--user", "mallory", "--json", "--max-iterations",
                  "1", script=[step(objective=HOSTILE)])
    assert stalled.returncode == 1
    assert_inert(stalled.raw + stalled.stderr.encode())
    events = [json.loads(line) for line in stalled.stdout.splitlines()]
    assert events[0]["query"] == f"stored {HOSTILE}"  # JSON escapes lose nothing
    assert events[1]["workspace"]["objective"] == HOSTILE

    listed = cli("tasks")
    assert listed.returncode == 0
    assert_inert(listed.raw)
    assert "stored \\x1b[2J\\x1b]0;pwned\\x07" in listed.stdout
    as_json = cli("tasks", "--json")
    assert_inert(as_json.raw)
    assert json.loads(as_json.stdout)["query"] == f"stored {HOSTILE}"

    (conversation,) = rows(db_path, "SELECT conversation_id FROM conversations "
                                    "WHERE user_id = 'default'")[0]
    shown = cli("conversations", conversation)
    assert shown.returncode == 0
    assert_inert(shown.raw)
    assert "assistant: answer \\x1b[2J" in shown.stdout and "\ufffd done" in shown.stdout  # stored as U+FFFD


def test_on_a_terminal_colours_are_ours_and_hostile_sequences_stay_inert(cli):
    status, screen = cli.tty("run", "hi", script=[step(response=f"answer {HOSTILE}")])
    assert status == 0, screen
    assert "\x1b[1manswer \\x1b[2J\\x1b]0;pwned\\x07\\r✓ fake line" in screen  # bold: ours
    for sequence in ("\x1b[2J", "\x1b]0;", "\x07", "\x08", "\u202e", "\x9b", "\x1b[?1049h"):
        assert sequence not in screen


LOOKALIKES = [("ａlice", "alice"), ("al\u200bice", "alice"), ("\u202ealice", "alice"),
              ("alice\u2060", "alice"), ("e\u0301ve", "\u00e9ve")]
"""Ids that print like another one, and the id each passes for."""


@pytest.mark.parametrize(("lookalike", "plain"), LOOKALIKES)
async def test_agent_refuses_ids_that_look_like_others(lookalike, plain, db_path, db):
    async with Agent(llm=ScriptedLLM([step(response="hi")]), store=str(db_path)) as agent:
        await agent.run("hello", user_id=plain)
        with pytest.raises(UsageError, match=repr(plain)):
            await agent.run("hello", user_id=lookalike)
        with pytest.raises(UsageError):
            await agent.run("hello", user_id=plain, conversation_id=lookalike)
    assert db.execute("SELECT user_id FROM user_profiles").fetchall() == [(plain,)]


def test_cli_refuses_ids_that_look_like_others(cli, db_path):
    done = cli("run", "hello", "--user", "ａlice", script=[step(response="hi")])
    assert done.returncode == 1
    assert done.stderr == ("error: --user 'ａlice' has characters that look like others (e.g. "
                           "fullwidth letters); ids must be in Unicode NFKC form: use 'alice'\n")
    assert not db_path.exists() or rows(db_path, "SELECT COUNT(*) FROM user_profiles") == [(0,)]
    shown = cli("profile", "show", "al\u200bice")
    assert shown.returncode == 1 and "invisible characters" in shown.stderr
    assert_inert(shown.stderr.encode())


@pytest.mark.parametrize(("spec", "secret"), [
    ("openai:gpt-4o-mini", False), ("openai:m@http://host:8000/v1", False),
    ("npx -y @modelcontextprotocol/server-everything", False),
    ("openai:m@http://user:pw@host/v1", True), ("npx server --api-key=sk-1", True),
    ("npx server --token abc", True), ("server API_KEY=abc", True),
])
def test_specs_with_credentials_are_not_stored_with_a_task(spec, secret):
    assert _has_secret(spec) is secret
