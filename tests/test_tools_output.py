"""Tool output and tool threads: redaction never freezes the event loop, credentials in every
URL form are redacted, and a hung synchronous tool never starves other tools."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

from cogency import Agent, tool
from cogency.testing import ScriptedLLM
from cogency.tools import files_tools, run_tools


class StallWatch:
    """The longest time the loop took to wake a 1 ms sleep (what every other run waits)."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - started)


async def test_hostile_file_text_never_freezes_the_event_loop(tmp_path, store, db_path) -> None:
    # 24 KB of "1.1.1…" froze the loop for 22 s (a redaction pattern rescanned the run from
    # every position); 200 KB of it, and other shapes, must pass without a noticeable stall.
    # The bound here is 20x the benchmark's goal (bench/bench_tool_stall.py measures it): this
    # checks that the loop is never frozen, not how fast it is.
    shapes = {"dots.txt": "1.1.", "colons.txt": "://a:", "labels.txt": "token token= "}
    for name, unit in shapes.items():
        (tmp_path / name).write_text(unit * (200_000 // len(unit)))
    llm = ScriptedLLM([
        {"secure": True, "actions": [
            {"name": "file_read", "args": {"path": name}} for name in shapes
        ]},
        {"response": "read", "actions": []},
    ])
    agent = Agent(llm=llm, tools=files_tools(tmp_path), store=store)
    watch = StallWatch()
    watcher = asyncio.create_task(watch.watch())
    try:
        result = await asyncio.wait_for(agent.run("read them", user_id="u"), 60)
    finally:
        watcher.cancel()
    assert result.stop_reason == "completed"
    assert watch.worst < 1.0, f"the event loop stalled for {watch.worst:.2f}s"
    db = sqlite3.connect(db_path)
    outputs = [json.loads(c)["output"] for (c,) in db.execute(
        "SELECT content FROM conversation_messages WHERE role = 'tool' ORDER BY seq")]
    db.close()
    assert len(outputs) == 3 and all("more characters]" in out for out in outputs)
    assert outputs[0].startswith("1.1.1.1.")


async def test_credentials_in_urls_and_secret_named_variables_are_redacted(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:redispw123@cache:6379/0")
    monkeypatch.setenv("TOKEN", "plain-token-value-1")
    monkeypatch.setenv("SECRET", "plain-secret-value-2")
    monkeypatch.setenv("APIKEY", "plain-apikey-value-3")
    (tmp_path / "conf.txt").write_text(
        "a redis://:emptyuserpw@host:6379\n"
        "b postgres://app:p@ss@word1@db.internal/app\n"
        "c amqp://guest:guestpw99@rabbit/\n"
        "d the bare password: redispw123\n"
        "e values plain-token-value-1 plain-secret-value-2 plain-apikey-value-3\n"
        "f https://example.com/path?q=1 user@example.com\n"
    )
    read = files_tools(tmp_path)[0]
    [result] = await run_tools({read.name: read}, [{"name": "file_read",
                                                    "args": {"path": "conf.txt"}}])
    out = result["output"]
    for secret in ("emptyuserpw", "p@ss@word1", "ss@word1", "guestpw99", "redispw123",
                   "plain-token-value-1", "plain-secret-value-2", "plain-apikey-value-3"):
        assert secret not in out, secret
    assert "redis://:[REDACTED]@host:6379" in out
    assert "postgres://app:[REDACTED]@db.internal/app" in out
    assert "f https://example.com/path?q=1 user@example.com" in out


async def test_a_hung_sync_tool_never_starves_other_tools_or_the_loop_pool() -> None:
    release = threading.Event()

    @tool(timeout=0.5)
    def hang(n: int) -> str:
        """Never returns until released."""
        release.wait(30)
        return "late"

    @tool(timeout=2)
    def quick(n: int) -> str:
        """Returns at once."""
        return f"quick {n}"

    tools = {"hang": hang, "quick": quick}
    try:
        # Twelve hung calls: more than the loop's default thread pool holds (6 on 2 cores).
        hung = await run_tools(tools, [{"name": "hang", "args": {"n": i}} for i in range(12)])
        assert all(not r["ok"] and "timed out after 0.5s" in r["error"] for r in hung)
        started = time.monotonic()
        done = await run_tools(tools, [{"name": "quick", "args": {"n": i}} for i in range(4)])
        assert [r["output"] for r in done] == [f"quick {i}" for i in range(4)]
        # The loop's own pool is free too (other libraries and users rely on it).
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "pool free"), 2) == "pool free"
        assert time.monotonic() - started < 2
        assert "8 earlier calls of it are still running" in hung[-1]["error"]
    finally:
        release.set()
