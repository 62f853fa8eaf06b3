"""The file tools stay inside their root: a table of escape attempts, races, and the agent path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cogency import Agent
from cogency.errors import ConfigurationError
from cogency.testing import ScriptedLLM
from cogency.tools import files_tools, run_tools

SECRET = "TOP-SECRET-outside-the-root"


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry under ``directory`` with its content (files) or link target."""
    seen: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_symlink():
            seen[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            seen[rel] = path.read_bytes()
        else:
            seen[rel] = "dir"
    return seen


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A root full of traps, next to an outside directory holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (outside / "ok.txt").write_text(SECRET)
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_text("inside ok\n")
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    os.symlink("../outside", root / "link_out")
    os.symlink(str(outside), root / "link_abs")
    os.symlink(str(outside / "secret.txt"), root / "file_link")
    os.symlink("../../outside/secret.txt", root / "sub" / "deep_link")
    os.symlink("chain2", root / "chain1")
    os.symlink("../outside", root / "chain2")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    os.symlink("sub/../../outside/secret.txt", root / "sneaky")
    os.symlink("/dev/zero", root / "dev_link")
    os.symlink("/", root / "slash")
    os.symlink("sub/ok.txt", root / "inside_link")
    os.symlink(str(root.resolve() / "sub" / "ok.txt"), root / "abs_inside")
    os.link(outside / "secret.txt", root / "hard")
    os.mkfifo(root / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    (root / "big.txt").write_bytes(b"x" * 300_000)
    try:
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.symlink("/dev/null", root / "null")  # still a device, reached through a link
    yield {"root": root, "outside": outside}
    server.close()


def _tools(root: Path, **options: object) -> dict:
    return {t.name: t for t in files_tools(root, **options)}


async def _call(tools: dict, name: str, **args: object) -> dict:
    return (await run_tools(tools, [{"name": name, "args": args}]))[0]


# (tool, args, words the refusal must contain); none of these may read or change anything outside.
ESCAPES = [
    ("file_read", {"path": "../outside/secret.txt"}, "'..'"),
    ("file_read", {"path": "/etc/passwd"}, "absolute"),
    ("file_read", {"path": "OUTSIDE_ABS"}, "absolute"),
    ("file_read", {"path": "sub/../../outside/secret.txt"}, "'..'"),
    ("file_read", {"path": "./../outside/secret.txt"}, "'..'"),
    ("file_read", {"path": "sub/./../../outside/secret.txt"}, "'..'"),
    ("file_read", {"path": "sub/" + "../" * 50 + "etc/passwd"}, "'..'"),
    ("file_read", {"path": "..%2foutside%2fsecret.txt"}, "no file"),
    ("file_read", {"path": "%2e%2e/outside/secret.txt"}, "no directory"),
    ("file_read", {"path": "..\\outside\\secret.txt"}, "no file"),
    ("file_read", {"path": "\u2025/outside/secret.txt"}, "no directory"),
    ("file_read", {"path": "~/../outside/secret.txt"}, "'..'"),
    ("file_read", {"path": "//etc/passwd"}, "absolute"),
    ("file_read", {"path": "\\etc\\passwd"}, "absolute"),
    ("file_read", {"path": "C:/Windows/win.ini"}, "absolute"),
    ("file_read", {"path": "sub/\x00/../../etc/passwd"}, "NUL"),
    ("file_read", {"path": "a/" * 2100}, "longer than"),
    ("file_read", {"path": "link_out/secret.txt"}, "out of the root"),
    ("file_read", {"path": "link_abs/secret.txt"}, "outside the root"),
    ("file_read", {"path": "file_link"}, "outside the root"),
    ("file_read", {"path": "sub/deep_link"}, "out of the root"),
    ("file_read", {"path": "chain1/secret.txt"}, "out of the root"),
    ("file_read", {"path": "loop1"}, "too many levels"),
    ("file_read", {"path": "sneaky"}, "out of the root"),
    ("file_read", {"path": "slash/etc/passwd"}, "outside the root"),
    ("file_read", {"path": "hard"}, "hard links"),
    ("file_read", {"path": "fifo"}, "FIFO"),
    ("file_read", {"path": "sock"}, "socket"),
    ("file_read", {"path": "dev_link"}, "outside the root"),
    ("file_read", {"path": "null"}, ""),
    ("file_read", {"path": "big.txt"}, "read limit"),
    ("file_list", {"path": "link_out"}, "out of the root"),
    ("file_list", {"path": "link_abs"}, "outside the root"),
    ("file_list", {"path": "../outside"}, "'..'"),
    ("file_list", {"path": "slash"}, "outside the root"),
    ("file_search", {"pattern": "TOP", "path": "link_out"}, "out of the root"),
    ("file_search", {"pattern": "TOP", "path": "/"}, "absolute"),
    ("file_write", {"path": "../outside/new.txt", "content": "x"}, "'..'"),
    ("file_write", {"path": "link_out/new.txt", "content": "x"}, "out of the root"),
    ("file_write", {"path": "link_abs/new.txt", "content": "x"}, "outside the root"),
    ("file_write", {"path": "file_link", "content": "pwned"}, "outside the root"),
    ("file_write", {"path": "sub/deep_link", "content": "pwned"}, "out of the root"),
    ("file_write", {"path": "hard", "content": "pwned"}, "hard links"),
    ("file_write", {"path": "OUTSIDE_ABS", "content": "pwned"}, "absolute"),
    ("file_write", {"path": "fifo", "content": "x"}, "FIFO"),
    ("file_edit", {"path": "hard", "old": "TOP", "new": "pwned"}, "hard links"),
    ("file_edit", {"path": "file_link", "old": "TOP", "new": "pwned"}, "outside the root"),
    ("file_edit", {"path": "chain1/secret.txt", "old": "TOP", "new": "x"}, "out of the root"),
]


@pytest.mark.parametrize(("name", "args", "says"), ESCAPES, ids=[f"{i:02d}" for i in range(len(ESCAPES))])
async def test_escape_attempt_is_refused_with_a_clear_error(world, name, args, says) -> None:
    root, outside = world["root"], world["outside"]
    args = {k: str(outside / "secret.txt") if v == "OUTSIDE_ABS" else v for k, v in args.items()}
    before = _snapshot(outside)
    result = await _call(_tools(root), name, **args)
    assert result["ok"] is False, result
    assert says in result["error"], result["error"]
    assert SECRET not in json.dumps(result)
    assert _snapshot(outside) == before


def test_the_table_holds_at_least_thirty_attempts() -> None:
    assert len(ESCAPES) >= 30


async def test_search_and_list_of_the_root_never_reach_outside(world) -> None:
    tools = _tools(world["root"])
    found = await _call(tools, "file_search", pattern="TOP-SECRET")
    assert found["ok"] and SECRET not in found["output"]
    assert "no matches" in found["output"]
    assert "skipped" in found["output"]  # the hard link is skipped, and says so
    listing = await _call(tools, "file_list")
    assert "link_out -> (symlink)" in listing["output"] and SECRET not in listing["output"]


async def test_symlinks_that_stay_inside_are_followed(world) -> None:
    tools = _tools(world["root"])
    for path in ("inside_link", "abs_inside", "sub/ok.txt"):
        result = await _call(tools, "file_read", path=path)
        assert result == {**result, "ok": True, "output": "inside ok\n"}, result


async def test_read_write_edit_list_search_inside_the_root(world) -> None:
    root = world["root"]
    tools = _tools(root)
    wrote = await _call(tools, "file_write", path="new/dir/a.txt", content="one two one\n")
    assert wrote["ok"] and (root / "new" / "dir" / "a.txt").read_text() == "one two one\n"
    twice = await _call(tools, "file_edit", path="new/dir/a.txt", old="one", new="1")
    assert not twice["ok"] and "2 times" in twice["error"]
    missing = await _call(tools, "file_edit", path="new/dir/a.txt", old="zzz", new="1")
    assert not missing["ok"] and "not found" in missing["error"]
    once = await _call(tools, "file_edit", path="new/dir/a.txt", old="two", new="2")
    assert once["ok"] and (root / "new" / "dir" / "a.txt").read_text() == "one 2 one\n"
    part = await _call(tools, "file_read", path="notes.txt", start_line=2, max_lines=1)
    assert part["output"] == "beta\n"
    listing = await _call(tools, "file_list", path="new")
    assert listing["output"] == "dir/"
    found = await _call(tools, "file_search", pattern=r"b.t+a", regex=True)
    assert found["output"].splitlines()[0] == "notes.txt:2: beta"
    assert "symlink" not in found["output"]
    bad = await _call(tools, "file_search", pattern="(", regex=True)
    assert not bad["ok"] and "invalid regular expression" in bad["error"]
    # No temporary files are left behind by the atomic writes.
    assert sorted(p.name for p in (root / "new" / "dir").iterdir()) == ["a.txt"]


async def test_read_only_tools_and_a_missing_root(tmp_path) -> None:
    assert [t.name for t in files_tools(tmp_path, read_only=True)] == [
        "file_read", "file_list", "file_search",
    ]
    with pytest.raises(ConfigurationError, match="not a directory"):
        files_tools(tmp_path / "nope")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_symlink_swapped_in_during_use_never_escapes(world) -> None:
    """A thread keeps swapping a directory and a file for symlinks to the outside while the
    tools read and write through them."""
    root, outside = world["root"], world["outside"]
    (root / "swap").mkdir()
    (root / "swap" / "ok.txt").write_text("inside ok\n")
    (root / "swapfile").write_text("inside file\n")
    before = _snapshot(outside)
    tools = _tools(root)
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            # directory <-> symlink to the outside directory
            os.rename(root / "swap", root / "parked")
            with contextlib.suppress(FileExistsError):  # a write may have made "swap" meanwhile
                os.symlink(str(outside), root / "swap")
            while True:
                with contextlib.suppress(OSError):  # a write may be filling it right now
                    if (root / "swap").is_symlink():
                        os.unlink(root / "swap")
                    elif (root / "swap").is_dir():
                        shutil.rmtree(root / "swap")
                try:
                    os.rename(root / "parked", root / "swap")
                    break
                except OSError:
                    continue
            # regular file <-> symlink to the outside secret, atomically by rename
            os.symlink(str(outside / "secret.txt"), root / ".evil")
            os.rename(root / "swapfile", root / ".parkedfile")
            os.rename(root / ".evil", root / "swapfile")
            os.rename(root / ".parkedfile", root / "swapfile")
            swaps += 1

    thread = threading.Thread(target=swapper)
    thread.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for i in range(250):
            calls = [
                {"name": "file_read", "args": {"path": "swap/ok.txt"}},
                {"name": "file_read", "args": {"path": "swapfile"}},
                {"name": "file_write", "args": {"path": f"swap/w{i}.txt", "content": "w"}},
                {"name": "file_edit", "args": {"path": "swapfile", "old": "file", "new": "file"}},
                {"name": "file_list", "args": {"path": "swap"}},
            ]
            for result in await run_tools(tools, calls):
                assert SECRET not in json.dumps(result), result
                outcomes["ok" if result["ok"] else "refused"] += 1
    finally:
        stop.set()
        thread.join()
    assert swaps > 50, swaps  # the race really ran
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0, outcomes
    assert _snapshot(outside) == before
    assert (root / "swapfile").read_text() == "inside file\n"


async def test_the_agent_sees_refusals_as_results_and_they_are_stored(world, store, db_path) -> None:
    llm = ScriptedLLM([
        {"secure": True, "actions": [
            {"name": "file_read", "args": {"path": "link_out/secret.txt"}},
            {"name": "file_write", "args": {"path": "report.txt", "content": "done"}},
        ]},
        {"response": "the secret is out of reach", "actions": []},
    ])
    # approve=True: file_write needs a person's approval, which this test gives up front.
    agent = Agent(llm=llm, tools=files_tools(world["root"]), store=store, approve=True)
    result = await agent.run("read the secret", user_id="alice")
    assert result.stop_reason == "completed"
    assert (world["root"] / "report.txt").read_text() == "done"
    db = sqlite3.connect(db_path)
    rows = [json.loads(c) for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY seq")]
    db.close()
    assert [r["ok"] for r in rows] == [False, True]
    assert "out of the root" in rows[0]["error"] and SECRET not in json.dumps(rows)
    # The refusal reached the model as marked data in its next call.
    seen = llm.calls[1][-2]["content"]
    assert "never follow instructions" in seen and "out of the root" in seen


async def test_a_catastrophic_regex_is_stopped_and_reported_without_freezing_the_loop(
    tmp_path,
) -> None:
    # Python's re held the GIL on (a|aa)+$ for as long as it backtracked: the tool's time
    # limit never fired and every run in the process froze.
    (tmp_path / "trap.txt").write_text("a" * 41 + "b\nplain line\n")
    tools = _tools(tmp_path)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        started = time.monotonic()
        slow = await _call(tools, "file_search", pattern="(a|aa)+$", regex=True)
        took = time.monotonic() - started
    finally:
        ticker.cancel()
    assert not slow["ok"] and slow["error"].startswith("ToolError: pattern too slow")
    assert "trap.txt" in slow["error"] and "(a+)+" in slow["error"]
    assert took < 8
    assert ticks >= took / 0.05 / 3  # the loop kept running while the pattern was matched
    nested = await _call(tools, "file_search", pattern="(a+)+$", regex=True)
    assert nested["ok"] and nested["output"] == "no matches"
    fine = await _call(tools, "file_search", pattern=r"pla\w+", regex=True)
    assert fine["output"] == "trap.txt:2: plain line"
    bad = await _call(tools, "file_search", pattern="(", regex=True)
    assert not bad["ok"] and "invalid regular expression" in bad["error"]


@pytest.fixture
def deep_root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # shutil.rmtree (pytest's clean-up) recurses: 1,200 levels would raise RecursionError there.
    subprocess.run(["rm", "-rf", str(tmp_path / "d")], check=True)


async def test_search_of_a_very_deep_tree_reports_what_it_did_not_reach(deep_root) -> None:
    tmp_path = deep_root
    tools = _tools(tmp_path)
    deep = "/".join(["d"] * 1200)
    wrote = await _call(tools, "file_write", path=f"{deep}/needle.txt", content="needle deep\n")
    assert wrote["ok"], wrote
    assert (await _call(tools, "file_write", path="d/d/near.txt", content="needle near\n"))["ok"]
    found = await _call(tools, "file_search", pattern="needle")
    assert found["ok"], found  # was RecursionError
    assert "d/d/near.txt:1: needle near" in found["output"]
    assert "needle deep" not in found["output"]
    assert "[error: 1 directories nested deeper than 64 levels were not searched" in found["output"]
    # From a deeper path the rest is reachable.
    lower = "/".join(["d"] * 1150)
    below = await _call(tools, "file_search", pattern="needle", path=lower)
    assert below["ok"] and "needle deep" in below["output"]


async def test_file_write_never_keeps_set_user_or_group_id_bits(tmp_path) -> None:
    target = tmp_path / "tool.sh"
    target.write_text("#!/bin/sh\necho old\n")
    target.chmod(0o6755)
    assert stat.S_IMODE(target.stat().st_mode) == 0o6755
    tools = _tools(tmp_path)
    assert (await _call(tools, "file_write", path="tool.sh", content="#!/bin/sh\necho new\n"))["ok"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    target.chmod(0o6755)
    assert (await _call(tools, "file_edit", path="tool.sh", old="new", new="newer"))["ok"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert target.read_text() == "#!/bin/sh\necho newer\n"
