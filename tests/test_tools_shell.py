"""The shell tool: its directory, time limit, output cap, clean environment and sandbox."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sqlite3
import sys
import threading
import uuid
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
    assert len(result["output"]) < 1000 + 400  # the output, and the status line with its note


@pytest.mark.parametrize("sandbox", [False, pytest.param("auto", marks=needs_sandbox)])
async def test_its_environment_is_an_allow_list(tmp_path, monkeypatch, sandbox) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-proj-abcdefghijklmnopqrstu",
        "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz012345",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "DB_PASSWORD": "hunter2hunter2",
        "DATABASE_URL": "postgresql://app:pw123456@db/app",
        "COGENCY_DB": str(tmp_path / "agent.db"),
        "MY_CONFIG": "https://user:s3cretpass@example.com/",
        # kept by the old deny-list: a password with an empty user, and bare names
        "REDIS_URL": "redis://:redispass99@cache:6379",
        "TOKEN": "bare-token-value", "SECRET": "bare-secret-value", "APIKEY": "bare-apikey-value",
        "HARMLESS_SETTING": "not-passed-unless-named",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    tool = shell_tool(tmp_path, sandbox=sandbox, env={"GREETING": "passed-on-purpose"})
    result = await _run(tool, "env; echo HOME is $HOME")
    out = result["output"]
    assert "GREETING=passed-on-purpose" in out
    assert f"HOME is {tmp_path.resolve()}" in out
    assert "PATH=" in out and "LANG=" in out
    for name, value in secrets.items():
        assert name not in out and value not in out, name
    assert "redispass99" not in out


@needs_sandbox
async def test_in_the_sandbox_its_parent_environment_is_out_of_reach(tmp_path, monkeypatch) -> None:
    # Without a sandbox, /proc/$PPID/environ is this process's environment: base64 of it got
    # a secret past redaction.
    monkeypatch.setenv("PAYMENT_TOKEN", "tok-in-the-parent-process")
    tool = shell_tool(tmp_path, sandbox="auto")
    result = await _run(
        tool, "for p in /proc/[0-9]*; do cat $p/environ; done 2>/dev/null | base64 -w0"
    )
    leaked = base64.b64decode(result["output"].split("\n", 1)[1] or "")
    assert b"tok-in-the-parent-process" not in leaked
    assert b"COGENCY_SHELL_RUN" in leaked  # it did read the sandbox's own processes


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


def _listen_unix(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    return server


@needs_sandbox
async def test_the_sandbox_shows_only_the_root_and_a_minimal_system(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "private.txt").write_text("outside the root")
    service = _listen_unix(outside / "service.sock")  # like /var/run/postgresql or docker.sock
    try:
        tool = shell_tool(root, sandbox="auto")
        result = await _run(tool, (
            "ls -a / | tr '\\n' ' '; echo; "
            f"cat {outside}/private.txt || echo NO-OUTSIDE; "
            f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect(\"{outside}/service.sock\")' 2>/dev/null && echo CONNECTED "
            "|| echo NO-SOCKET; "
            "for p in /run /var/run /home /root /etc/postgresql /etc/shadow /var/lib; do "
            "test -e $p && echo VISIBLE $p; done; "
            "test -r /etc/passwd && echo PASSWD; echo ok > /tmp/scratch && cat /tmp/scratch; "
            "grep CapEff /proc/self/status"
        ))
    finally:
        service.close()
    out = result["output"]
    listing = set(out.split("\n")[1].split())
    assert listing <= {".", "..", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
                       "etc", "dev", "proc", "tmp", "var"}, listing
    assert "NO-OUTSIDE" in out and "outside the root" not in out
    assert "NO-SOCKET" in out and "CONNECTED" not in out
    assert "VISIBLE" not in out
    assert "PASSWD" in out and "\nok" in out
    assert "CapEff:\t0000000000000000" in out  # root in the sandbox holds no capability


@needs_sandbox
async def test_the_agents_store_is_hidden_even_inside_the_root(tmp_path) -> None:
    # The default way to run: the database in the directory the shell works in.
    from cogency.storage import SQLiteStore

    store = SQLiteStore(tmp_path / "agent.db")
    llm = ScriptedLLM([
        {"secure": True, "actions": [{"name": "shell", "args": {"command": (
            "ls agent.db*; for f in agent.db*; do cat $f > /dev/null 2>&1 && echo READ $f; done; "
            "echo bytes $(cat agent.db* 2>/dev/null | wc -c); "
            "echo junk > agent.db 2>/dev/null || echo READ-ONLY")}}]},
        {"response": "looked", "actions": []},
    ])
    try:
        agent = Agent(llm=llm, tools=[shell_tool(tmp_path, sandbox="auto")], store=store,
                      approve=True)  # the shell needs a person's approval: given up front
        await agent.run("peek at the database", user_id="alice")
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "agent.db")
    stored = [json.loads(c) for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool'")]
    queries = [q for (q,) in db.execute("SELECT content FROM conversation_messages "
                                        "WHERE role = 'user'")]
    db.close()
    out = stored[0]["output"]
    assert "agent.db-wal" in out  # the files are there, in name only
    assert "READ " not in out and "bytes 0" in out and "READ-ONLY" in out
    assert queries == ["peek at the database"]  # the database is intact


@needs_sandbox
async def test_hidden_paths_are_hidden_or_refused(tmp_path) -> None:
    root = tmp_path / "root"
    (root / "creds").mkdir(parents=True)
    (root / "creds" / "key.txt").write_text("secret key")
    (root / "token.txt").write_text("secret token")
    (root / "open.txt").write_text("open")
    tool = shell_tool(root, sandbox="auto", hidden=[root / "creds", root / "token.txt",
                                                     tmp_path / "not-in-view"])
    out = (await _run(tool, "ls creds; cat token.txt; cat open.txt"))["output"]
    assert "secret" not in out and "key.txt" not in out and "open" in out
    # A file was silently ignored before; so was a directory containing the root.
    for impossible in (tmp_path, root):
        with pytest.raises(ConfigurationError, match="is inside it"):
            shell_tool(root, sandbox="auto", hidden=[impossible])
    with pytest.raises(ConfigurationError, match="need the sandbox"):
        shell_tool(root, sandbox=False, hidden=[root / "creds"])


@pytest.mark.parametrize("sandbox", [False, pytest.param("auto", marks=needs_sandbox)])
async def test_a_process_that_leaves_the_session_is_killed_too(tmp_path, sandbox) -> None:
    # setsid put a child outside the process group: it kept running after "killed".
    tool = shell_tool(tmp_path, timeout=1, sandbox=sandbox)
    sleep = f"sleep 300.{uuid.uuid4().int % 10**9}"  # no other process sleeps exactly this long
    command = (
        f"setsid sh -c 'echo $$ > escaped.pid; echo started > started; exec {sleep}' & "
        f"(setsid sh -c '{sleep} & echo $! > orphan.pid' &); {sleep}"
    )
    result = await _run(tool, command)
    assert "timed out after 1s" in result["output"]
    assert (tmp_path / "started").exists()
    for name in ("escaped.pid", "orphan.pid"):
        pid = int((tmp_path / name).read_text())
        if sandbox == "auto":
            # pids inside the sandbox are its own: look the process up by its marker instead
            continue
        assert not _running(pid), f"{name}: {pid} is still running"
    assert _alive_with(sleep.replace(" ", "\x00")) == []


async def test_cancelling_a_command_kills_what_it_started(tmp_path) -> None:
    tool = shell_tool(tmp_path, timeout=30, sandbox=False)
    sleep = f"sleep 301.{uuid.uuid4().int % 10**9}"
    task = asyncio.ensure_future(_run(tool, f"setsid sh -c 'echo $$ > pid; exec {sleep}' & {sleep}"))
    for _ in range(100):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _running(int((tmp_path / "pid").read_text()))
    assert _alive_with(sleep.replace(" ", "\x00")) == []


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


@needs_sandbox
def test_cogency_run_with_the_shell_cannot_read_its_database(tmp_path) -> None:
    # `cogency run --tools shell` in the directory holding the database: it read every
    # user's messages before.
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"secure": True, "actions": [{"name": "shell", "args": {
            "command": "cat cogency.db* 2>/dev/null | wc -c; ls cogency.db"}}]},
        {"secure": True, "response": "done", "actions": []},
    ]))
    seed = sqlite3.connect(tmp_path / "cogency.db")  # a row of another user, to be sure
    seed.close()
    env = {**os.environ, "COGENCY_TEST_SCRIPT": str(script), "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "cogency.cli", "run", "peek", "--tools", "shell",
         "--llm", "cli_models:scripted", "--db", "cogency.db", "--json", "--yes",
         "--no-memory"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines() if '"result"' in line]
    [output] = [event["output"] for event in results if event.get("type") == "result"]
    assert output.split("\n")[1] == "0" and "sandboxed" in output
    assert (tmp_path / "cogency.db").stat().st_size > 0
