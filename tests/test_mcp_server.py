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


def step(response):
    return {"secure": True, "objective": "answer", "understanding": "", "approach": "",
            "discoveries": "", "response": response, "actions": []}


async def test_an_agent_served_over_mcp_remembers_the_conversation(tmp_path, db_path, db):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([step("Hello Ada."), step("You are Ada.")]))
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cogency.cli", "mcp", "--db", str(db_path), "--llm", "cli_models:scripted",
              "--user", "alice"],
        env={"COGENCY_TEST_SCRIPT": str(script),
             "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        cwd=str(tmp_path),
    )
    async with Client(server, read_timeout_seconds=60) as client:
        (ask,) = (await client.list_tools()).tools
        assert ask.name == "ask" and "conversation_id" in ask.input_schema["properties"]
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
