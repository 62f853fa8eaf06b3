"""Per-user tool directories: names that cannot collide or escape, and an agent whose users'
tools cannot reach each other's files (`Agent(root_per_user=True)`), deleted by a forget."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cogency import Agent
from cogency.errors import UsageError
from cogency.testing import ScriptedLLM
from cogency.tools import files_tools, shell_tool
from cogency.tools.rooms import directory_name, remove_user_directory, user_directory

HOSTILE_IDS = [
    "alice", "../bob", "..", ".", "a/b", "a_b", "a b", "a\\b", "/etc/passwd", "~root",
    "-rf", "ａlice", "аlice",  # fullwidth and Cyrillic look-alikes of "alice"
    "x" * 256, "x" * 255 + "y", "é", "e\u0301", "\u202eecila", "日本", "",
]


def test_directory_names_never_collide_or_leave_the_root(tmp_path):
    names = [directory_name(user) for user in HOSTILE_IDS]
    assert len(set(names)) == len(names)  # two ids, two directories, however alike
    for user, name in zip(HOSTILE_IDS, names):
        assert name.isascii() and name.isprintable() and len(name) <= 73
        assert "/" not in name and "\\" not in name and "\x00" not in name
        assert not name.startswith((".", "-")) and ".." not in name
        path = user_directory(tmp_path, user)
        assert path.parent == tmp_path and os.path.normpath(path) == str(path)
    assert directory_name("alice").startswith("alice-")  # readable where it can be
    assert directory_name("a/b") != directory_name("a_b")


def _writes(path, content):
    """A model that writes `path`, then says what the tool answered."""
    return ScriptedLLM([{"actions": [{"name": "file_write",
                                      "args": {"path": path, "content": content}}]},
                        lambda messages: {"response": messages[-1]["content"][-300:]}])


def _reads(path):
    return ScriptedLLM([{"actions": [{"name": "file_read", "args": {"path": path}}]},
                        {"response": "done"}])


async def test_each_users_tools_work_in_their_own_directory(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    store = str(tmp_path / "agent.db")
    tools = [*files_tools(root), shell_tool(root, sandbox=True)]

    async def run(llm, user):
        """The output of the tool the model called, as the model got it."""
        async with Agent(llm=llm, tools=tools, store=store, approve=True,
                         root_per_user=True) as agent:
            return [event.output async for event in agent.stream("go", user_id=user)
                    if event.type == "result"][0]

    await run(_writes("secret.txt", "alice's secret"), "alice")
    alice = user_directory(root, "alice")
    assert (alice / "secret.txt").read_text() == "alice's secret"
    assert not (root / "secret.txt").exists()
    assert oct(alice.stat().st_mode & 0o777) == "0o700"
    # bob, or anyone whose id looks like an escape, cannot read it by any path
    for user in ("bob", "../alice", "alice/..", "a_b"):
        for path in ("secret.txt", "../" + alice.name + "/secret.txt",
                     str(alice / "secret.txt")):
            seen = await run(_reads(path), user)
            assert seen.startswith("ToolError") and "alice's secret" not in seen
    shell = ScriptedLLM([{"actions": [{"name": "shell", "args": {
        "command": f"cat ../*/secret.txt {alice}/secret.txt; ls -a ..; pwd"}}]},
        {"response": "done"}])
    seen = await run(shell, "bob")
    assert "alice's secret" not in seen and "No such file" in seen
    assert seen.count(alice.name) == 1  # in the error about the path it was given, only
    assert seen.rstrip().endswith(str(user_directory(root, "bob")))  # pwd: bob's own
    # ids the agent refuses never get a directory
    with pytest.raises(UsageError):
        await run(_writes("x", "y"), "nul\x00id")
    assert sorted(p.name for p in root.iterdir()) == sorted(
        directory_name(user) for user in ("alice", "bob", "../alice", "alice/..", "a_b"))


async def test_without_root_per_user_the_root_is_shared_as_before(tmp_path):
    async with Agent(llm=_writes("shared.txt", "hi"), tools=files_tools(tmp_path),
                     store=str(tmp_path / "a.db"), approve=True) as agent:
        await agent.run("go", user_id="alice")
    assert (tmp_path / "shared.txt").read_text() == "hi"


async def test_forgetting_a_user_deletes_their_directory(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    async with Agent(llm=_writes("notes/a.txt", "x"), tools=files_tools(root),
                     store=str(tmp_path / "a.db"), approve=True, root_per_user=True) as agent:
        await agent.run("go", user_id="alice")
        alice = user_directory(root, "alice")
        os.symlink(outside, alice / "link")  # never followed by the deletion
        assert (alice / "notes" / "a.txt").exists()
        receipt = await agent.forget("alice")
        assert not alice.exists()
        # the receipt says it: the directory, and what it held (notes/, a.txt, the link)
        assert (receipt.tool_directory, receipt.tool_files) == (str(alice), 3)
        assert receipt.conversations == 1 and receipt.messages >= 2
        again = await agent.forget("alice")
        assert (again.tool_directory, again.tool_files, again.conversations) == (None, 0, 0)
        assert (outside / "keep.txt").read_text() == "keep"
        assert await agent.store.list_conversations("alice") == []
        # the next run makes it again
        agent.llm = _writes("again.txt", "y")
        await agent.run("go", user_id="alice")
        assert (alice / "again.txt").exists()
    assert remove_user_directory(root, "nobody") is None


async def test_cogency_profile_forget_deletes_the_served_users_directory(tmp_path):
    db = str(tmp_path / "cli.db")
    async with Agent(llm=ScriptedLLM([{"response": "hi"}]), store=db) as agent:
        await agent.run("hello", user_id="alice")
    root = tmp_path / "served"
    alice = user_directory(root, "alice")
    alice.mkdir(parents=True)
    (alice / "work.txt").write_text("w")
    bob = user_directory(root, "bob")
    bob.mkdir()
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "cogency.cli", "profile", "forget", "alice", "--yes",
         "--root", str(root), "--db", db],
        capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    # what was erased: the rows, then the directory with what it held
    assert "forgot 'alice': 1 profile, 0 profile entries, 0 history entries, 1 conversation, " \
        "2 messages, 0 unfinished tasks" in done.stdout
    assert f"their tools' directory {alice} (1 file) deleted; learning" in done.stdout
    assert not alice.exists() and bob.exists()
    # nothing left: nothing to forget; a directory alone (no database) goes too
    done = subprocess.run(
        [sys.executable, "-m", "cogency.cli", "profile", "forget", "alice", "--yes",
         "--root", str(root), "--db", db],
        capture_output=True, text=True, env=env, timeout=60)
    assert "nothing to forget" in done.stdout
    (bob / "a.txt").write_text("b")
    done = subprocess.run(  # the default database, which does not exist
        [sys.executable, "-m", "cogency.cli", "profile", "forget", "bob", "--yes",
         "--root", str(root)],
        capture_output=True, text=True, env={**env, "COGENCY_DB": str(tmp_path / "none.db")},
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"forgot 'bob': their tools' directory {bob} (1 file) deleted" in done.stdout
    assert not bob.exists() and not (tmp_path / "none.db").exists()
