"""The shell tool: its directory, time limit, output cap, clean environment and sandbox."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from cogency import Agent
from cogency.errors import ConfigurationError
from cogency.testing import ScriptedLLM
from cogency.tools import run_tools, sandbox_available, shell_tool
from conftest import IN_CI

needs_sandbox = pytest.mark.skipif(
    not sandbox_available() and not IN_CI,
    reason="bubblewrap (apt-get install bubblewrap) is missing or cannot create namespaces here",
)


async def _run(tool, command: str) -> dict:
    return (await run_tools({tool.name: tool}, [{"name": tool.name, "args": {"command": command}}]))[0]


def _alive_with(marker: str) -> list[int]:
    """Pids of processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"sh\x00-c" not in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("sandbox", [False, pytest.param("auto", marks=needs_sandbox)])
async def test_runs_in_the_root_and_reports_the_exit_code(tmp_path, sandbox) -> None:
    tool = shell_tool(tmp_path, sandbox=sandbox)
    result = await _run(tool, "pwd; echo made > made.txt; exit 3")
    assert result["ok"]
    assert result["output"].startswith("[exit code 3;")
    assert str(tmp_path.resolve()) in result["output"]
    assert (tmp_path / "made.txt").read_text() == "made\n"


@pytest.mark.parametrize("sandbox", [False, pytest.param("auto", marks=needs_sandbox)])
async def test_the_time_limit_kills_the_whole_process_group(tmp_path, sandbox) -> None:
    marker = f"31.{os.getpid()}{len(str(tmp_path))}"
    tool = shell_tool(tmp_path, timeout=1, sandbox=sandbox)
    result = await _run(tool, f"sleep {marker} & sleep {marker}; echo never")
    assert result["ok"] and "timed out after 1s" in result["output"]
    assert "never" not in result["output"]
    assert _alive_with(marker) == []


async def test_output_is_capped_and_the_command_stopped(tmp_path) -> None:
    tool = shell_tool(tmp_path, max_output=1000, sandbox=False)
    result = await _run(tool, "yes")
    assert "output passed 1000 bytes" in result["output"]
    assert len(result["output"]) < 1300


async def test_secrets_are_not_in_its_environment(tmp_path, monkeypatch) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-proj-abcdefghijklmnopqrstu",
        "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz012345",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "DB_PASSWORD": "hunter2hunter2",
        "DATABASE_URL": "postgresql://app:pw123456@db/app",
        "COGENCY_DB": str(tmp_path / "agent.db"),
        "MY_CONFIG": "https://user:s3cretpass@example.com/",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HARMLESS_SETTING", "visible-value")
    result = await _run(shell_tool(tmp_path, sandbox=False), "env")
    assert "HARMLESS_SETTING=visible-value" in result["output"]
    for name, value in secrets.items():
        assert name not in result["output"]
        assert value not in result["output"]


@needs_sandbox
async def test_the_sandbox_denies_writes_outside_the_root_and_the_network(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    tool = shell_tool(root, sandbox="auto")
    assert "sandboxed: no network" in tool.description
    result = await _run(
        tool,
        f"echo in > inside.txt; echo out > {outside}/escaped.txt; echo tmp > /tmp/x.txt; "
        f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' "
        "&& echo CONNECTED || echo NO-NETWORK",
    )
    thread = threading.Thread(target=accept)
    thread.start()
    thread.join()
    server.close()
    assert "sandboxed" in result["output"]
    assert (root / "inside.txt").read_text() == "in\n"
    assert not (outside / "escaped.txt").exists()
    assert "NO-NETWORK" in result["output"] and "CONNECTED" not in result["output"]
    assert accepted == []


async def test_without_a_sandbox_it_says_so_plainly(tmp_path, monkeypatch) -> None:
    tool = shell_tool(tmp_path, sandbox=False)
    assert "NOT sandboxed" in tool.description
    assert "NOT sandboxed" in (await _run(tool, "true"))["output"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    with pytest.raises(ConfigurationError, match="bubblewrap"):
        shell_tool(tmp_path, sandbox=True)


async def test_secrets_in_its_output_are_redacted_before_they_are_stored(
    tmp_path, store, db_path, monkeypatch
) -> None:
    monkeypatch.setenv("PAYMENTS_SERVICE_TOKEN", "tok-live-9f8e7d6c5b4a")
    (tmp_path / "creds.txt").write_text(
        "openai=sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA\n"
        "aws=AKIAIOSFODNN7EXAMPLE\n"
        "payments=tok-live-9f8e7d6c5b4a\n"
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abcdef\n"
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----\n"
        "gh=ghp_abcdefghijklmnopqrstuvwxyz0123456789\n"
        "slack=xoxb-1234567890-abcdefghij\n"
        "plain=hello\n"
    )
    llm = ScriptedLLM([
        {"secure": True, "actions": [{"name": "shell", "args": {"command": "cat creds.txt"}}]},
        {"response": "read them", "actions": []},
    ])
    agent = Agent(llm=llm, tools=[shell_tool(tmp_path, sandbox=False)], store=store,
                  approve=True)  # the shell needs a person's approval: given up front
    outputs = [e.output async for e in agent.stream("show creds", user_id="u") if e.type == "result"]
    db = sqlite3.connect(db_path)
    stored = [c for (c,) in db.execute("SELECT content FROM conversation_messages")]
    db.close()
    seen = json.dumps([outputs, stored, [m["content"] for call in llm.calls for m in call]])
    for secret in ("sk-proj-AAAA", "AKIAIOSFODNN7EXAMPLE", "tok-live-9f8e7d6c5b4a",
                   "eyJhbGciOiJIUzI1NiJ9abcdef", "MIIEvQIBADANBg", "ghp_abcdefghij",
                   "xoxb-1234567890"):
        assert secret not in seen, secret
    assert "plain=hello" in outputs[0] and outputs[0].count("[REDACTED]") >= 7
