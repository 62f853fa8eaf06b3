"""``cogency mcp``: the real command in a subprocess, driven by the official SDK's client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[test]'")

from mcp import Client, StdioServerParameters  # noqa: E402

TESTS = Path(__file__).parent


def step(response, actions=()):
    return {"secure": True, "objective": "answer", "understanding": "", "approach": "",
            "discoveries": "", "response": response, "actions": list(actions)}


def cogency_mcp(tmp_path, db_path, script, *extra, memory=False):
    """``cogency mcp`` as an MCP host starts it, its model replaying ``script`` (and not
    learning, unless ``memory``: learning would take replies of the script)."""
    (tmp_path / "script.json").write_text(json.dumps(script))
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "cogency.cli", "mcp", "--db", str(db_path), "--llm", "cli_models:scripted",
              "--user", "alice", *extra, *([] if memory else ["--no-memory"])],
        env={"COGENCY_TEST_SCRIPT": str(tmp_path / "script.json"),
             "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        cwd=str(tmp_path),
    )


async def test_an_agent_served_over_mcp_remembers_the_conversation(tmp_path, db_path, db):
    server = cogency_mcp(tmp_path, db_path, [step("Hello Ada."), step("You are Ada.")])
    async with Client(server, read_timeout_seconds=60) as client:
        ask, decide = (await client.list_tools()).tools
        assert (ask.name, decide.name) == ("ask", "decide")
        assert "conversation_id" in ask.input_schema["properties"]
        assert ask.input_schema["required"] == ["query"]

        first = await client.call_tool("ask", {"query": "I am Ada."})
        assert not first.is_error
        answer = first.structured_content
        assert answer["answer"] == "Hello Ada." and answer["stop_reason"] == "completed"
        conversation = answer["conversation_id"]

        second = await client.call_tool(
            "ask", {"query": "Who am I?", "conversation_id": conversation}
        )
        assert second.structured_content["answer"] == "You are Ada."
        assert second.structured_content["conversation_id"] == conversation

        blank = await client.call_tool("ask", {"query": "   "})
        assert blank.is_error and "UsageError: query must be a non-empty string" in \
            blank.content[0].text

    rows = db.execute(
        "SELECT m.role, m.content, c.user_id FROM conversation_messages m "
        "JOIN conversations c USING (conversation_id) WHERE conversation_id = ? ORDER BY seq",
        (conversation,),
    ).fetchall()
    assert rows == [("user", "I am Ada.", "alice"), ("assistant", "Hello Ada.", "alice"),
                    ("user", "Who am I?", "alice"), ("assistant", "You are Ada.", "alice")]
    assert db.execute("SELECT count(*) FROM task_workspaces").fetchone() == (0,)


async def test_calls_that_need_approval_are_decided_by_the_mcp_host(tmp_path, db_path, db):
    write = {"name": "file_write", "args": {"path": "note.txt", "content": "from the host"}}
    server = cogency_mcp(tmp_path, db_path, [step(None, [write]), step("Written.")],
                         "--tools", "files", "--root", str(tmp_path))
    async with Client(server, read_timeout_seconds=60) as client:
        paused = (await client.call_tool("ask", {"query": "Write a note."})).structured_content
        assert paused["stop_reason"] == "awaiting_approval" and paused["answer"] is None
        (pending,) = paused["pending_approvals"]
        assert (pending["name"], pending["args"]) == ("file_write", write["args"])
        assert not (tmp_path / "note.txt").exists()  # nothing ran before the decision

        wrong = await client.call_tool("decide", {"task_id": paused["task_id"],
                                                  "approve": ["no-such-call"]})
        assert wrong.is_error and "no-such-call" in wrong.content[0].text

        done = await client.call_tool("decide", {"task_id": paused["task_id"],
                                                 "approve": [pending["id"]]})
        assert done.structured_content["answer"] == "Written."
        assert done.structured_content["stop_reason"] == "completed"
    assert (tmp_path / "note.txt").read_text() == "from the host"
    (result,) = db.execute("SELECT content FROM conversation_messages WHERE role = 'tool'"
                           ).fetchone()
    assert json.loads(result)["ok"] is True


async def test_ask_refuses_a_conversation_the_user_does_not_have(tmp_path, db_path, db):
    server = cogency_mcp(tmp_path, db_path, [step("Hello.")])
    async with Client(server, read_timeout_seconds=60) as client:
        refused = await client.call_tool("ask", {"query": "Go on.",
                                                 "conversation_id": "no-such-conversation"})
        assert refused.is_error
        assert ("NotFoundError: no conversation 'no-such-conversation' for this user; pass a "
                "conversation_id that ask returned, or leave it out" in refused.content[0].text)
        fine = await client.call_tool("ask", {"query": "Hi."})  # the script was not used up
        assert fine.structured_content["answer"] == "Hello."
    assert db.execute("SELECT conversation_id FROM conversations").fetchall() == [
        (fine.structured_content["conversation_id"],)]


async def test_mcp_learns_the_profile_unless_told_not_to(tmp_path, db_path, db):
    learned = {"preferences": [], "goals": [], "expertise": [], "communication_style": "",
               "project_context": [], "interests": ["chess"], "constraints": [],
               "success_pattern": "", "failure_pattern": ""}
    quiet = cogency_mcp(tmp_path, db_path, [step("Noted."), learned])
    async with Client(quiet, read_timeout_seconds=60) as client:
        await client.call_tool("ask", {"query": "I play chess."})
    profile = db.execute("SELECT profile_data FROM user_profiles").fetchone()[0]
    assert "chess" not in profile  # --no-memory learned nothing
    taught = cogency_mcp(tmp_path, db_path, [step("Noted."), learned], memory=True)
    async with Client(taught, read_timeout_seconds=60) as client:
        await client.call_tool("ask", {"query": "I play chess."})
    # The server's shutdown waits for the learning it started (Agent.close).
    profile = json.loads(db.execute("SELECT profile_data FROM user_profiles").fetchone()[0])
    assert profile["interests"] == ["chess"]
