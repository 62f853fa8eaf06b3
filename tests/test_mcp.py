"""MCPServer against real MCP servers nobody here wrote: the npm reference servers
(everything, filesystem) run with this machine's Node, and PyPI's mcp-server-time; the
failure cases against tests/mcp_stub.py. Everything goes through Agent.run / the CLI, and
the stored rows are read back from the database."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cogency import Agent, tool
from cogency.errors import UsageError
from cogency.testing import ScriptedLLM

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install -e '.[test]'")

import mcp_servers  # noqa: E402  (tests/ is on sys.path: rootdir conftest)

from cogency.tools import MCPServer  # noqa: E402

TESTS = Path(__file__).parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SECRET = "sk-test-mcp-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def npm_servers() -> None:
    try:
        mcp_servers.install()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if IN_CI:
            raise
        pytest.skip(f"the npm MCP servers cannot be installed here: {exc}")


def step(actions=(), response=None):
    return {"secure": True, "objective": "use the MCP tools", "understanding": "",
            "approach": "", "discoveries": "", "response": response, "actions": list(actions)}


def call(name, **args):
    return {"name": name, "args": args}


def server_pids(marker: str, children: bool = True) -> list[int]:
    """Live processes whose command line contains ``marker``: this test's children only,
    unless ``children`` is False."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and (not children or int(fields[1]) == os.getpid()) and \
                marker in cmdline:
            pids.append(int(entry.name))
    return pids


def stored(db, conversation_id):
    rows = db.execute(
        "SELECT role, content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    ).fetchall()
    return [(role, json.loads(content) if role == "tool" else content) for role, content in rows]


async def test_real_servers_tools_through_agent_run(npm_servers, tmp_path, db_path, db,
                                                    monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # must never reach a server, nor the database
    root = tmp_path / "files"
    root.mkdir()
    everything = MCPServer([mcp_servers.npm_bin("mcp-server-everything")], name="everything",
                           trusted={"echo"})
    files = MCPServer([mcp_servers.npm_bin("mcp-server-filesystem"), str(root)])
    clock = MCPServer([sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])

    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    llm = ScriptedLLM([
        step([call("get-sum", a="two", b=3)]),  # breaks the server's schema: asked again
        step([call("get-sum", a=2, b=3), call("echo", message=f"key {SECRET}"),
              call("get-tiny-image"), call("get-env"), call("shout", text="hi"),
              call("write_file", path=str(root / "notes.txt"), content="MCP wrote this"),
              call("get_current_time", timezone="Europe/Paris")]),
        step([call("read_text_file", path=str(root / "notes.txt")),
              call("write_file", path=str(tmp_path / "outside.txt"), content="no")]),
        step(response="done"),
    ])
    # approve=True: an untrusted server's tools need a person's approval, given up front here
    # (as in every run of this file).
    agent = Agent(llm=llm, tools=[shout, everything, files, clock], store=str(db_path),
                  approve=True)
    assert server_pids("server-everything") == []  # started on first use, not before
    async with agent:
        result = await agent.run("use the servers", user_id="alice")
        running = server_pids("server-everything") + server_pids("mcp_server_time")
        assert len(running) == 2
    assert result.stop_reason == "completed" and result.response == "done"

    # The model saw each server's own tool names, descriptions and schemas.
    system = llm.calls[0][0]["content"]
    assert "- echo(message: string): Echoes back the input string" in system
    assert "get_current_time(timezone: string)" in system
    assert "write_file(path: string, content: string)" in system
    assert "- shout(text: string)" in system
    # The bad call never reached the server: the schema check answered the model.
    assert "args.a must be number, got str 'two'" in llm.calls[1][-1]["content"]

    messages = stored(db, result.conversation_id)
    results = {m["name"]: m for role, m in messages if role == "tool"}
    assert results["get-sum"]["output"] == "The sum of 2 and 3 is 5."
    assert results["echo"]["output"] == "Echo: key [REDACTED]"
    assert "[image: image/png, about" in results["get-tiny-image"]["output"]
    assert "PATH" in results["get-env"]["output"] and SECRET not in results["get-env"]["output"]
    assert results["shout"]["output"] == "HI"
    assert json.loads(results["get_current_time"]["output"])["timezone"] == "Europe/Paris"
    assert results["read_text_file"]["output"] == "MCP wrote this"
    assert (root / "notes.txt").read_text() == "MCP wrote this"
    outside = [m for role, m in messages if role == "tool" and m["name"] == "write_file"][-1]
    assert outside["ok"] is False and not (tmp_path / "outside.txt").exists()
    assert "MCP server 'mcp-server-filesystem': write_file failed" in outside["error"]
    assert "outside allowed directories" in outside["error"]

    # agent.close() stopped every server it started.
    for pid in running:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_mcp_tools_wait_for_approval_unless_trusted(npm_servers, db_path, db):
    everything = MCPServer([mcp_servers.npm_bin("mcp-server-everything")], trusted={"echo"})
    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], trusted=True,
                     start_timeout=20)
    llm = ScriptedLLM([
        step([call("echo", message="trusted tool"), call("say", text="trusted server"),
              call("get-sum", a=1, b=2)]),
        step(response="3"),
    ])
    async with Agent(llm=llm, tools=[everything, stub], store=str(db_path)) as agent:
        paused = await agent.run("add", user_id="alice")
        assert paused.stop_reason == "awaiting_approval"
        (pending,) = paused.pending_approvals
        assert (pending["name"], pending["args"]) == ("get-sum", {"a": 1, "b": 2})
        # Approved later: the call reaches the real server then, once.
        done = await agent.resume(paused.task_id, user_id="alice",
                                  approvals={pending["id"]: True})
    assert done.stop_reason == "completed" and done.response == "3"
    results = [m for role, m in stored(db, done.conversation_id) if role == "tool"]
    assert [(r["name"], r["output"].split(" (pid")[0]) for r in results] == [
        ("echo", "Echo: trusted tool"), ("say", "said: trusted server"),
        ("get-sum", "The sum of 1 and 2 is 3.")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_streamable_http_server(npm_servers, db_path, db):
    port = _free_port()
    process = subprocess.Popen(
        [mcp_servers.npm_bin("mcp-server-everything"), "streamableHttp"],
        env={**os.environ, "PORT": str(port)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP MCP server did not come up"
                await asyncio.sleep(0.1)
        server = MCPServer(url=f"http://127.0.0.1:{port}/mcp")
        llm = ScriptedLLM([step([call("echo", message="over http")]), step(response="ok")])
        async with Agent(llm=llm, tools=[server], store=str(db_path), approve=True) as agent:
            result = await agent.run("echo over http")
        assert result.stop_reason == "completed"
        tool_rows = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
        assert tool_rows == [{"name": "echo", "args": {"message": "over http"}, "ok": True,
                              "output": "Echo: over http"}]
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_failing_servers_are_tool_errors_and_the_run_goes_on(db_path, db):
    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], name="stub", timeout=2,
                     start_timeout=20)
    ghost = MCPServer(["/nonexistent/mcp-server"], name="ghost")
    broken = MCPServer([sys.executable, "-c", "import sys; sys.stderr.write('bad config: "
                        "no token'); sys.exit(2)"], name="broken")
    sleepy = MCPServer([sys.executable, "-c", "import time; time.sleep(60)"], name="sleepy",
                       start_timeout=1)
    llm = ScriptedLLM([
        step([call("ghost"), call("broken"), call("sleepy"), call("die")]),
        step([call("say", text="back"), call("hang")]),
        step([call("flood")]),
        step([call("say", text="again")]),
        step(response="survived"),
    ])
    async with Agent(llm=llm, tools=[stub, ghost, broken, sleepy], store=str(db_path),
                     approve=True) as agent:
        result = await agent.run("try every server")
    assert result.stop_reason == "completed" and result.response == "survived"

    # The model was told up front which servers are unavailable, and why.
    system = llm.calls[0][0]["content"]
    assert "- ghost(): UNAVAILABLE: MCP server 'ghost' failed to start: cannot run" in system
    assert "sleepy(): UNAVAILABLE: MCP server 'sleepy' did not start within 1s" in system

    results = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
    by_step = {r["name"]: r for r in results}
    assert all(not by_step[name]["ok"] for name in ("ghost", "broken", "sleepy", "die", "hang"))
    assert "MCP server 'ghost' failed to start: cannot run '/nonexistent/mcp-server'" in \
        by_step["ghost"]["error"]
    assert "MCP server 'broken' failed to start" in by_step["broken"]["error"]
    assert "bad config: no token" in by_step["broken"]["error"]
    assert "MCP server 'sleepy' did not start within 1s" in by_step["sleepy"]["error"]
    assert "MCP server 'stub' exited (status 3)" in by_step["die"]["error"]
    assert "stub: dying on purpose" in by_step["die"]["error"]
    assert "MCP server 'stub': hang did not answer within 2s" in by_step["hang"]["error"]
    flood = by_step["flood"]
    assert not flood["ok"] and "MCP server 'stub' closed the connection" in flood["error"]
    assert "over 4194304 bytes" in flood["error"]
    said = [r for r in results if r["name"] == "say"]
    assert [r["ok"] for r in said] == [True, True]  # started again after each death
    assert said[0]["output"].startswith("said: back")
    assert said[1]["output"].startswith("said: again")
    assert server_pids("mcp_stub.py") == [] and server_pids("time.sleep") == []


async def test_tool_name_clash_is_a_usage_error_and_prefix_fixes_it(db_path, db):
    @tool
    def say(text: str) -> str:
        """Say it back."""
        return text

    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], start_timeout=20)
    async with Agent(llm=ScriptedLLM([]), tools=[say, stub], store=str(db_path),
                     approve=True) as agent:
        with pytest.raises(UsageError, match="two tools are named 'say'.*prefix="):
            await agent.run("hi")
    prefixed = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], prefix="stub_",
                         start_timeout=20)
    llm = ScriptedLLM([step([call("stub_say", text="x"), call("say", text="y")]),
                       step(response="ok")])
    async with Agent(llm=llm, tools=[say, prefixed], store=str(db_path), approve=True) as agent:
        result = await agent.run("hi")
    assert result.stop_reason == "completed"
    results = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
    assert [(r["name"], r["output"].split(" (pid")[0]) for r in results] == [
        ("stub_say", "said: x"), ("say", "y")]


def test_mcp_flag_on_the_command_line(npm_servers, tmp_path, db_path, db):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([step([call("echo", message="from the cli")]),
                                  step(response="echoed")]))
    env = {**os.environ, "COGENCY_TEST_SCRIPT": str(script), "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "cogency.cli", "run", "echo it", "--db", str(db_path),
         "--llm", "cli_models:scripted", "--no-memory", "--mcp", mcp_servers.npm_bin("mcp-server-everything"),
         "--mcp", f"{sys.executable} {TESTS / 'mcp_stub.py'}", "--yes"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "Echo: from the cli" in done.stdout and "echoed" in done.stdout
    (content,) = db.execute("SELECT content FROM conversation_messages WHERE role = 'tool'"
                            ).fetchone()
    assert json.loads(content)["output"] == "Echo: from the cli"


def test_mcp_server_arguments_are_checked():
    with pytest.raises(UsageError, match="exactly one of"):
        MCPServer()
    with pytest.raises(UsageError, match="http"):
        MCPServer(url="file:///etc/passwd")
    with pytest.raises(UsageError, match="timeout"):
        MCPServer(["x"], timeout=0)
    assert MCPServer("npx -y @modelcontextprotocol/server-everything@1.2").name == \
        "server-everything"


async def test_schemas_with_refs_are_inlined_for_the_model_and_checked_in_full(db_path, db):
    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], start_timeout=20)
    llm = ScriptedLLM([step([call("book", room={"beds": 0})]),
                       step([call("book", room={"beds": 2}), call("notes_count")]),
                       step(response="booked")])
    async with Agent(llm=llm, tools=[stub], store=str(db_path), approve=True) as agent:
        result = await agent.run("book a room")
        (book,) = [t for t in await stub.list_tools() if t.name == "book"]
    # Embedded in a provider's structured-output schema, "#/$defs/..." would point elsewhere.
    assert "$ref" not in json.dumps(book.parameters)
    assert book.parameters["properties"]["room"]["properties"]["beds"]["minimum"] == 1
    assert "args.room.beds must be at least 1, got 0" in llm.calls[1][-1]["content"]
    assert result.stop_reason == "completed"
    outputs = [json.loads(c)["output"] for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY seq")]
    assert outputs == ["booked 2 beds", "3 notes"]  # no terminal control codes
    # A name MCP allows but the step contract does not ("notes.count") is made valid; the
    # call still reaches the server's own name. Descriptions lose their control codes too.
    assert "- notes_count(): Count the notes.\n" in llm.calls[0][0]["content"]


def test_run_sync_starts_the_server_in_each_event_loop_and_stops_it_after(db_path, db):
    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], start_timeout=20)
    llm = ScriptedLLM([step([call("say", text="one")]), step(response="1"),
                       step([call("say", text="two")]), step(response="2")])
    agent = Agent(llm=llm, tools=[stub], store=str(db_path), approve=True)
    assert agent.run_sync("first").stop_reason == "completed"
    assert server_pids("mcp_stub.py") == []  # the loop's end stopped it
    assert agent.run_sync("second").stop_reason == "completed"
    asyncio.run(agent.close())
    outputs = [json.loads(c)["output"] for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY created_at")]
    assert [o.split(" (pid")[0] for o in outputs] == ["said: one", "said: two"]
    assert server_pids("mcp_stub.py") == []


async def test_a_server_whose_call_timed_out_is_replaced_for_the_next_call(db_path, db):
    # "nap" blocks the stub's only thread: the old session can answer nothing more.
    stub = MCPServer([sys.executable, str(TESTS / "mcp_stub.py")], name="stub", timeout=1,
                     start_timeout=20, trusted=True)
    llm = ScriptedLLM([step([call("say", text="before")]), step([call("nap")]),
                       step([call("say", text="after")]), step(response="awake")])
    async with Agent(llm=llm, tools=[stub], store=str(db_path)) as agent:
        result = await agent.run("nap, then talk")
        napping = server_pids("stub-nap", children=False)
    assert result.stop_reason == "completed" and result.response == "awake"
    before, nap, after = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
    assert not nap["ok"]
    assert nap["error"] == ("ToolError: MCP server 'stub': nap did not answer within 1s; it "
                            "is started again on the next call")
    assert after["ok"] and after["output"].startswith("said: after (pid ")
    old_pid = int(before["output"].split("(pid ")[1].rstrip(")"))
    new_pid = int(after["output"].split("(pid ")[1].rstrip(")"))
    assert old_pid != new_pid
    # The timed-out server and the child it left were stopped, not left asleep.
    assert napping == []
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)


async def test_an_http_servers_reply_is_bounded_in_size_and_json_items(db_path, db):
    process = subprocess.Popen([sys.executable, str(TESTS / "mcp_http_stub.py")],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        server = MCPServer(url=f"http://127.0.0.1:{port}/mcp", name="hostile", trusted=True)
        llm = ScriptedLLM([step([call("bulk"), call("zipped")]),
                           step([call("blocks"), call("sse_blocks")]),
                           step([call("say"), call("sse_say")]), step(response="ok")])
        async with Agent(llm=llm, tools=[server], store=str(db_path)) as agent:
            result = await agent.run("take the big replies")
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert result.stop_reason == "completed" and result.response == "ok"
    bulk, zipped, blocks, sse_blocks, say, sse_say = [
        m for role, m in stored(db, result.conversation_id) if role == "tool"]
    assert not bulk["ok"] and "MCP server 'hostile': bulk:" in bulk["error"]
    # Read up to the limit, not on to the end (64 MB), nor unpacked.
    assert "the reply is over 4194304 bytes (MAX_MESSAGE_BYTES); it was not read further" in \
        bulk["error"]
    assert not zipped["ok"] and "MCP server 'hostile': zipped:" in zipped["error"]
    assert "the reply is compressed (gzip), which was not asked for" in zipped["error"]
    # Few bytes, but more JSON items than MAX_MESSAGE_ITEMS: not parsed, as a JSON body and
    # as an event of an event stream (that one answered as an error for its call).
    over = "the server sent a message of over 40,000 JSON items (MAX_MESSAGE_ITEMS)"
    assert not blocks["ok"] and over in blocks["error"]
    assert sse_blocks["error"] == f"ToolError: MCP server 'hostile': sse_blocks: {over}; it " \
        "was not read"
    # The server is still usable after.
    assert (say["output"], sse_say["output"]) == ("hello", "hello")


# -- a hostile server's work is bounded (tests/mcp_hostile.py) ---------------------------------

HOSTILE = TESTS / "mcp_hostile.py"


def hostile(spec, name="hostile", **options):
    options.setdefault("start_timeout", 20)
    return MCPServer([sys.executable, str(HOSTILE), json.dumps(spec)], name=name, trusted=True,
                     **options)


async def test_a_hostile_schema_is_left_out_and_checking_arguments_is_bounded(
        db_path, db, caplog):
    from cogency._jsonschema import (
        SchemaTooLarge,
        SchemaViolation,
        TooCostly,
        inline_refs,
        validate,
    )
    from cogency.tools._mcp_bounds import MAX_SCHEMA_NODES, MAX_VALIDATION_STEPS

    # "wide": 3 kB whose refs multiply to 30**4 values once inlined (the code before these
    # bounds inlined and checked it in full, on the event loop). "checks": 2,000 nodes, but
    # each of 100 items costs its enum of 100 values: 10,000 checks. "deep": two refs a
    # level, 18 levels: past MAX_DEPTH levels it is left to the server to check.
    tools = {"wide": ["wide", 30, 4], "checks": ["enum_items", 20, 100], "deep": ["deep", 18],
             "big": ["flat", 400]}
    server = hostile({"tools": tools})
    llm = ScriptedLLM([
        step([call("checks", x=[99] * 100)]),
        step([call("wide"), call("deep", x=5), call("big", p0="v", p399="w")]),
        step(response="done"),
    ])
    async with Agent(llm=llm, tools=[server], store=str(db_path)) as agent:
        result = await agent.run("use the hostile tools", user_id="alice")
    assert result.stop_reason == "completed"

    refused = ("MCP server 'hostile': tool 'wide' has an input schema over 5,000 nodes once "
               "its $refs are inlined (MAX_SCHEMA_NODES); it is left out")
    assert f"- wide(): UNAVAILABLE: {refused}" in llm.calls[0][0]["content"]
    assert any(refused in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert ("tool 'checks': args.x[49] could not be checked: it and its schema need more than "
            "5,000 checks, so the call was not made") in llm.calls[1][-1]["content"]
    rows = {m["name"]: m for role, m in stored(db, result.conversation_id) if role == "tool"}
    assert not rows["wide"]["ok"] and refused in rows["wide"]["error"]
    assert rows["deep"]["ok"] and rows["deep"]["output"].startswith("deep ok")
    assert rows["big"]["ok"] and rows["big"]["output"].startswith("big ok")
    assert "checks" not in rows  # never called

    # The work stopped at each budget, whatever the schema multiplied to.
    wide = json.loads(subprocess.run(
        [sys.executable, "-c", f"import mcp_hostile, json; print(json.dumps("
         f"mcp_hostile.schema({tools['wide']!r})))"], cwd=TESTS, capture_output=True,
        text=True, check=True).stdout)
    with pytest.raises(SchemaTooLarge) as over:
        inline_refs(wide, budget=MAX_SCHEMA_NODES, strict=False)
    assert over.value.spent == MAX_SCHEMA_NODES + 1
    (checks,) = [t for t in await server.list_tools() if t.name == "checks"]
    with pytest.raises(TooCostly) as costly:
        validate({"x": [99] * 100}, checks.parameters, budget=MAX_VALIDATION_STEPS)
    assert MAX_VALIDATION_STEPS < costly.value.spent <= MAX_VALIDATION_STEPS + 101  # one enum
    parameters, _ = inline_refs({"type": "object", "properties": {"x": {"$ref": "#/$defs/N"}},
                                 "$defs": {"N": {"type": "object", "properties": {
                                     "next": {"$ref": "#/$defs/N"}, "v": {"type": "integer"}}}}},
                                strict=False)
    assert parameters["properties"]["x"]["properties"]["next"] == {}  # recursion: once
    with pytest.raises(SchemaViolation, match="args.x.v must be integer, got str 'one'"):
        validate({"x": {"v": "one"}}, parameters, "args")

    # Each under its own budget, together over the server's: the tool that would pass it is
    # left out, the others kept.
    seven = hostile({"tools": {f"t{i}": ["wide", 5, 4] for i in range(7)}})  # 3,129 nodes each
    try:
        listed = {t.name: t.description for t in await seven.list_tools()}
    finally:
        await seven.aclose()
    assert [name for name, text in listed.items() if text.startswith("UNAVAILABLE")] == ["t6"]
    assert "tool 't6' would take its tools' schemas over 20,000 nodes in all " \
           "(MAX_SERVER_SCHEMA_NODES)" in listed["t6"]


async def test_the_budgets_admit_every_tool_of_the_reference_servers(npm_servers, tmp_path):
    from cogency.tools.mcp import MCPTool

    servers = [MCPServer([mcp_servers.npm_bin("mcp-server-everything")]),
               MCPServer([mcp_servers.npm_bin("mcp-server-filesystem"), str(tmp_path)]),
               MCPServer([sys.executable, "-m", "mcp_server_time"])]
    try:
        listings = [await server.list_tools() for server in servers]
    finally:
        for server in servers:
            await server.aclose()
    for listing in listings:
        assert listing and all(isinstance(t, MCPTool) for t in listing), \
            [t.description for t in listing if not isinstance(t, MCPTool)]
    assert sum(len(listing) for listing in listings) > 20


async def test_hostile_results_are_refused_with_a_clear_tool_error(tmp_path, db_path, db):
    starts = tmp_path / "starts.log"
    results = {"blocks": ["blocks", 150_000],  # 3.9 MB, 1.35 million JSON items
               "nested": ["nested", 200_000],  # 4 MB of nested structuredContent
               "many": ["blocks", 1_001],  # few bytes, one content block too many
               "text": ["text", 4_000_000],  # 4 MB of text is fine
               "shaped": ["structured", {"x": 5}]}
    main = hostile({"tools": {name: ["plain"] for name in [*results, "say"]},
                    "results": results, "output": {"shaped": ["deep", 16]},
                    "log": str(starts)})
    last = hostile({"tools": {"blocks": ["plain"]}, "results": {"blocks": results["blocks"]},
                    "order": "tail"}, name="last", prefix="last_")
    lost = hostile({"tools": {"blocks": ["plain"], "say": ["plain"]},
                    "results": {"blocks": results["blocks"]}, "order": "lost",
                    "log": str(tmp_path / "lost.log")}, name="lost", prefix="lost_")
    llm = ScriptedLLM([
        step([call(name) for name in [*results, "last_blocks", "lost_blocks"]]),
        step([call("say"), call("lost_say")]),
        step(response="done"),
    ])
    async with Agent(llm=llm, tools=[main, last, lost], store=str(db_path)) as agent:
        result = await agent.run("take the results", user_id="alice")
    assert result.stop_reason == "completed"
    rows = {m["name"]: m for role, m in stored(db, result.conversation_id) if role == "tool"}

    over = ("the server sent a message of over 40,000 JSON items (MAX_MESSAGE_ITEMS); it was "
            "not read")
    assert rows["blocks"] == {"name": "blocks", "args": {}, "ok": False,
                              "error": f"ToolError: MCP server 'hostile': blocks: {over}"}
    assert rows["nested"]["error"] == f"ToolError: MCP server 'hostile': nested: {over}"
    assert rows["last_blocks"]["error"] == f"ToolError: MCP server 'last': blocks: {over}"
    assert rows["many"]["error"] == (
        "ToolError: MCP server 'hostile': many: the server sent a result of 1,001 content "
        "blocks, over 1,000 (MAX_CONTENT_BLOCKS); it was not read")
    assert rows["text"]["ok"] and rows["text"]["output"].startswith("tttt")
    assert "more characters]" in rows["text"]["output"]
    # The SDK would check structuredContent against the tool's outputSchema, without bound:
    # output schemas are not used, the result is shown as it came.
    assert rows["shaped"] == {"name": "shaped", "args": {}, "ok": True, "output": '{"x": 5}'}
    # A response whose id cannot be told without parsing it ends the connection, like an
    # over-long line; the server is started again for the next call.
    assert rows["lost_blocks"]["error"].startswith(
        "ToolError: MCP server 'lost' closed the connection; its stderr ends: [cogency: it "
        "sent a message of over 40,000 JSON items (MAX_MESSAGE_ITEMS); it was not read]")
    assert rows["say"]["ok"] and rows["lost_say"]["ok"]
    assert len(starts.read_text().split()) == 1  # refusing a result kept the server
    assert len((tmp_path / "lost.log").read_text().split()) == 2


def test_the_stall_benchmark_runs_its_hostile_cases():
    # bench/bench_mcp_stall.py measures the stalls (not a test: timings); here it must run,
    # and the hostile schema must be left out, as the benchmark reports.
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_mcp_stall", "--quick", "--only", "100 x 6"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")])},
    )
    assert done.returncode == 0, done.stderr
    assert "1 tools, 1 refused; tool error: ToolError: MCP server 'hostile': tool 'wide' has " \
        "an input schema over 5,000 nodes" in done.stdout
    assert "worst stall in this tree:" in done.stdout


async def test_patterns_are_checked_within_a_time_budget_and_never_multiplied(
        db_path, db, monkeypatch):
    import cogency._jsonschema as schemas

    tried = []  # every pattern that reached the regex engine
    engine = schemas._regex

    class Spy:
        error = engine.error

        def compile(self, pattern, *args, **options):
            tried.append(pattern)
            return engine.compile(pattern, *args, **options)

        def search(self, pattern, *args, **options):
            tried.append(pattern)
            return engine.search(pattern, *args, **options)

    monkeypatch.setattr(schemas, "_regex", Spy())
    schemas._compiled.cache_clear()  # what earlier tests compiled is compiled again here
    # "copies": 15 characters that regex's compiler would expand to a million nodes (0.6 s;
    # (a{10000}){10000} takes all the memory). "backtrack": exponential on "aaa…!".
    server = hostile({"tools": {"word": ["pattern", "^[a-z]+$"],
                                "copies": ["pattern", "(a{1000}){1000}"],
                                "backtrack": ["pattern", "^(a|aa)+$"]}})
    llm = ScriptedLLM([
        step([call("word", x=["fine", "NOT FINE"])]),
        step([call("backtrack", x=["a" * 40 + "!"] * 200)]),
        step([call("word", x=["fine"]), call("copies", x=["a" * 1000])]),
        step(response="done"),
    ])
    async with Agent(llm=llm, tools=[server], store=str(db_path)) as agent:
        result = await agent.run("use the patterns", user_id="alice")
    assert result.stop_reason == "completed"
    # The server's patterns are checked (the model is told, the call not made)…
    assert "tool 'word': args.x[1] must match the pattern '^[a-z]+$'" in \
        llm.calls[1][-1]["content"]
    # …all of a check's patterns within one time limit, however many strings…
    assert ("tool 'backtrack': args.x[0] could not be checked: its patterns need more than "
            "20 ms, so the call was not made") in llm.calls[2][-1]["content"]
    # …and one the compiler would multiply is left to the server, never compiled.
    rows = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
    assert [(m["name"], m["ok"]) for m in rows] == [("word", True), ("copies", True)]
    assert "^[a-z]+$" in tried and "(a{1000}){1000}" not in tried


async def test_a_steps_calls_are_checked_with_the_event_loop_free_between_them(db_path):
    from cogency.tools import Tool

    ticks = 0  # turns of the event loop

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    seen = []

    class Watched(Tool):
        def validate(self, args):
            seen.append(ticks)
            return super().validate(args)

    watched = Watched(name="w", description="Watched.", parameters={"type": "object"},
                      func=lambda n: f"ok {n}")
    llm = ScriptedLLM([step([call("w", n=n) for n in range(4)]), step(response="done")])
    running = asyncio.create_task(ticker())
    try:
        async with Agent(llm=llm, tools=[watched], store=str(db_path)) as agent:
            result = await agent.run("check four calls")
    finally:
        running.cancel()
    assert result.stop_reason == "completed"
    # Each check is bounded by its tool's budget; a step holds up to 16 calls: the loop ran
    # between them, so their checks never add up to one stall.
    assert len(seen) == 4 and len(set(seen)) == 4


async def test_with_root_per_user_an_mcp_servers_tools_are_shared_by_every_user(
        tmp_path, db_path, db):
    from cogency.tools import files_tools
    from cogency.tools.rooms import user_directory

    root = tmp_path / "root"
    root.mkdir()
    server = hostile({"tools": {"say": ["plain"]}})
    llm = ScriptedLLM([step([call("say", x="alice"), call("file_write", path="a.txt",
                                                           content="alice's")]),
                       step(response="done"),
                       step([call("say", x="bob"), call("file_list", path=".")]),
                       step(response="done")])
    async with Agent(llm=llm, tools=[*files_tools(root), server], store=str(db_path),
                     approve=True, root_per_user=True) as agent:
        first = await agent.run("say it", user_id="alice")
        second = await agent.run("say it", user_id="bob")
        (say,) = [t for t in await server.list_tools() if t.name == "say"]
    assert first.stop_reason == second.stop_reason == "completed"
    said = [m["output"] for result in (first, second)
            for role, m in stored(db, result.conversation_id) if role == "tool"
            and m["name"] == "say"]
    # One server, started once, for both users (its tools have no root to confine)...
    assert len(said) == 2 and said[0] == said[1] and said[0].startswith("say ok (pid")
    assert say.root is None and say.confined_to(str(tmp_path)) is say
    # ...while each user's files tools work in their own directory.
    assert (user_directory(root, "alice") / "a.txt").read_text() == "alice's"
    listed = [m["output"] for role, m in stored(db, second.conversation_id)
              if role == "tool" and m["name"] == "file_list"]
    assert listed and "a.txt" not in listed[0]


def test_json_items_is_exact_where_it_matters():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cogency.tools._mcp_bounds import json_items

    def items(value):  # strings, and each { [ , : of the text json.dumps makes
        if isinstance(value, dict):
            return 1 + 3 * len(value) - (1 if value else 0) + sum(map(items, value.values()))
        if isinstance(value, list):
            return 1 + max(len(value) - 1, 0) + sum(map(items, value))
        return 1 if isinstance(value, str) else 0

    text = st.text(alphabet='a"\\,:{}[] \n\u00e9\U0001f600', max_size=12)
    values = st.recursive(st.none() | st.booleans() | st.integers() | text,
                          lambda inner: st.lists(inner, max_size=5)
                          | st.dictionaries(text, inner, max_size=5), max_leaves=25)

    @settings(max_examples=80, deadline=None)
    @given(values)
    def check(value):
        data = json.dumps(value, ensure_ascii=False).encode()
        n = items(value)
        assert json_items(data, n) <= n  # within a limit it is not over it
        if n:
            assert json_items(data, n - 1) > n - 1  # and over one it passes

    check()


async def test_a_server_that_never_starts_is_retried_with_backoff_and_no_run_waits_for_it(
        tmp_path, db_path, db):
    from cogency.tools.mcp import START_BACKOFF

    starts = tmp_path / "starts.log"
    hung = hostile({"hang": True, "log": str(starts)}, name="hung", start_timeout=3)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ScriptedLLM([step(response=f"answer {i}") for i in range(9)])
    agent = Agent(llm=llm, tools=[add, hung], store=str(db_path))

    async def timed(user):
        started = time.monotonic()
        result = await agent.run("what is 2 + 2?", user_id=user)
        return result, time.monotonic() - started

    async with agent:
        # Six users at once, none using the server: one run tries to start it and waits for
        # its own attempt; the others go on without its tools.
        first = await asyncio.gather(*(timed(f"user{i}") for i in range(6)))
        assert len(starts.read_text().split()) == 1
        # In its back-off: not tried again, nobody waits.
        during, _ = await timed("user6")
        assert len(starts.read_text().split()) == 1
        await asyncio.sleep(START_BACKOFF + 0.2)
        # The back-off over: tried again in the background; neither this run nor the next
        # one (the start still in flight) waits for it.
        after = [await timed("user7"), await timed("user8")]
        for _ in range(400):  # the new start's process writes its line once it runs
            if len(starts.read_text().split()) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(starts.read_text().split()) == 2

    assert all(r.stop_reason == "completed" for r, _ in [*first, *after])
    took = sorted(seconds for _, seconds in [*first, *after])
    assert took[-1] >= 3 and took[-2] < 3  # only the first start was waited for
    # What each run's model was told, in the order they asked it: five runs went on while
    # the first start was in flight, then the run that waited for it, then the later ones.
    prompts = [calls[0]["content"] for calls in llm.calls]
    said = "UNAVAILABLE: MCP server 'hung'"
    assert all(f"{said} is starting (for" in p for p in prompts[:5] + prompts[8:])
    assert f"{said} did not start within 3s. Its tools cannot be used" in prompts[5]
    assert (f"{said} did not start within 3s; it failed to start once, and is started again "
            "in 1s at the earliest") in prompts[6]
    assert f"{said} did not start within 3s; it is being started again" in prompts[7]
    assert during.stop_reason == "completed"
    answers = db.execute("SELECT content FROM conversation_messages WHERE role = 'assistant'"
                         ).fetchall()
    assert len(answers) == 9
    assert server_pids("mcp_hostile.py") == []


async def test_closing_the_agent_kills_every_process_the_server_started(db_path, db):
    server = hostile({"spawn": True})
    llm = ScriptedLLM([step([call("spawn")]), step(response="spawned")])
    async with Agent(llm=llm, tools=[server], store=str(db_path)) as agent:
        result = await agent.run("start the grandchildren")
        (row,) = [m for role, m in stored(db, result.conversation_id) if role == "tool"]
        pids = json.loads(row["output"])
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        sessions = {_stat(pid)[3] for pid in pids}
        assert len(sessions) >= 2  # out of the server's session and group, one of them bare
    assert result.stop_reason == "completed"
    for _ in range(100):  # SIGKILL is delivered, not awaited: give the kernel a moment
        if not any(alive(pid) for pid in pids):
            break
        await asyncio.sleep(0.05)
    assert [pid for pid in pids if alive(pid)] == []


def _stat(pid):
    raw = (Path("/proc") / str(pid) / "stat").read_bytes()
    return raw[raw.rfind(b")") + 2:].split()


def alive(pid):
    try:
        return _stat(pid)[0] not in (b"Z", b"X")
    except OSError:
        return False
