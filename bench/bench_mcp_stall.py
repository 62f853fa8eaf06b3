"""The longest event-loop stall while listing and calling the tools of a hostile MCP server.

Each case is a server (tests/mcp_hostile.py) whose tool schemas or results are built to cost
the most: refs that explode when inlined or checked, schemas and messages just under each of
the limits in cogency.tools._mcp_bounds, and results up to the 4 MB message limit. A watcher
task sleeps 1 ms at a time and records how late it wakes (bench/bench_tool_stall.py's
``StallWatch``) around ``MCPServer.list_tools()`` (the start: the listing is read, every
schema inlined) and around one ``Agent.run`` whose model calls the tool (the arguments are
checked, the result is read). Each case runs in a process of its own, killed after
``--timeout`` seconds: the code before the bounds froze for minutes. Reported: the median
over ``--runs`` of each phase's longest stall (goal: under 50 ms), and what the model saw.

    python -m bench.bench_mcp_stall                          # this tree
    python -m bench.bench_mcp_stall --baseline /work/main/src  # and another tree, same run
    python -m bench.bench_mcp_stall --quick                  # each case once, for CI
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "mcp_hostile.py"
MB4 = 4 * 1024 * 1024 - 200
sys.path.insert(0, str(HOSTILE.parent))

import mcp_hostile  # noqa: E402  (the server's own builders: the bench sizes what it sends)


def cases() -> dict[str, dict[str, Any]]:
    """Name → server spec, the tool the model calls and its arguments. Sizes at the edges
    come from this tree's limits, measured on the very messages the server sends."""
    from cogency.tools import _mcp_bounds as bounds

    nodes, items = bounds.MAX_SCHEMA_NODES, bounds.MAX_MESSAGE_ITEMS
    flat = (nodes - 20) // 4  # ["flat", n] has 4n + 7 nodes
    # Under the server's budget, each tool under its own: the most inlining a listing can ask.
    per_server = bounds.MAX_SERVER_SCHEMA_NODES // (4 * flat + 7)
    bad = {"x": 5}  # fails every branch: the most checking
    return {
        "wide $ref/anyOf (100 x 6)": {
            "tools": {"wide": ["wide", 100, 6]}, "call": "wide", "args": bad},
        "deep $ref/anyOf (2 x 40)": {
            "tools": {"deep": ["deep", 40]}, "call": "deep", "args": bad},
        "wide $ref/anyOf at the node budget": {
            "tools": {"edge": ["wide", 4, 5]}, "call": "edge", "args": bad},
        "flat schema at the node budget": {
            "tools": {"flat": ["flat", flat]}, "call": "flat",
            "args": {f"p{i}": "v" for i in range(flat)}},
        "enum at the step budget": {
            "tools": {"enum": ["big_enum", bounds.MAX_VALIDATION_STEPS - 10]}, "call": "enum",
            "args": {"x": -1}},
        "schemas at the server's budget": {
            "tools": {f"t{i}": ["flat", flat] for i in range(per_server)}, "call": "t0",
            "args": {"p0": "v"}},
        "listing at the message budget": {
            "tools": {f"tool{i}": ["flat", 6] for i in range(_most(
                lambda n: _listing({f"tool{i}": ["flat", 6] for i in range(n)}), items))},
            "call": "tool0", "args": {"p0": "v"}},
        "4 MB text result": {
            "tools": {"text": ["plain"]}, "results": {"text": ["text", MB4 - 100]},
            "call": "text", "args": {}},
        "4 MB of 150,000 blocks": {
            "tools": {"blocks": ["plain"]}, "results": {"blocks": ["blocks", 150_000]},
            "call": "blocks", "args": {}},
        "4 MB of 150,000 blocks (id last)": {
            "tools": {"blocks": ["plain"]}, "results": {"blocks": ["blocks", 150_000]},
            "order": "tail", "call": "blocks", "args": {}},
        "4 MB nested structuredContent": {
            "tools": {"nested": ["plain"]}, "results": {"nested": ["nested", MB4 // 18]},
            "call": "nested", "args": {}},
        "blocks at the block budget": {
            "tools": {"blocks": ["plain"]},
            "results": {"blocks": ["blocks", bounds.MAX_CONTENT_BLOCKS]},
            "call": "blocks", "args": {}},
        "deep JSON at the message budget": {
            "tools": {"deep_json": ["plain"]},
            "results": {"deep_json": ["deep_json", _most(
                lambda n: _message({"deep_json": ["deep_json", n]}), items)]},
            "call": "deep_json", "args": {}},
    }


def _listing(tools: dict[str, Any]) -> bytes:
    listed = mcp_hostile.tools({"tools": tools})
    return json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"tools": listed}}).encode()


def _message(results: dict[str, Any]) -> bytes:
    (spec,) = results.values()
    return json.dumps({"jsonrpc": "2.0", "id": 2, "result": mcp_hostile.result(spec)}).encode()


def _most(message: Any, limit: int) -> int:
    """The largest n whose message(n) has at most ``limit`` JSON items."""
    from cogency.tools._mcp_bounds import json_items

    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if json_items(message(middle), limit) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


# -- one case, in a process of its own ---------------------------------------------------------


async def run_case(spec: dict[str, Any]) -> None:
    from cogency import Agent
    from cogency.storage import SQLiteStore
    from cogency.testing import ScriptedLLM
    from cogency.tools import MCPServer

    from bench.bench_tool_stall import StallWatch

    server_spec = {key: spec[key] for key in ("tools", "results", "order") if key in spec}
    server_spec["tools"] = {**server_spec["tools"], "warm": ["plain"]}
    server = MCPServer([sys.executable, str(HOSTILE), json.dumps(server_spec)], name="hostile",
                       trusted=True, timeout=120, start_timeout=120)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        try:
            # Warm up (imports, the tokenizer, the store) with a harmless server and call,
            # so what is measured is the hostile part alone.
            plain = MCPServer([sys.executable, str(HOSTILE), json.dumps({"tools": {
                "warm": ["plain"]}})], name="plain", trusted=True)
            warm = ScriptedLLM([{"secure": True, "actions": [{"name": "warm", "args": {}}]},
                                {"response": "warm", "actions": []}])
            async with Agent(llm=warm, tools=[plain], store=store) as agent:
                await agent.run("warm up", user_id="bench")
            async with StallWatch() as watch:
                tools = await server.list_tools()
            unavailable = [t.name for t in tools if t.description.startswith("UNAVAILABLE")]
            listed = (f"{len(tools) - len(unavailable)} tools"
                      + (f", {len(unavailable)} refused" if unavailable else ""))
            print(json.dumps({"phase": "list", "stall": watch.worst, "outcome": listed}),
                  flush=True)
            llm = ScriptedLLM([
                {"secure": True, "actions": [{"name": spec["call"], "args": spec["args"]}]},
                {"response": "done", "actions": []},
            ])
            agent = Agent(llm=llm, tools=[server], store=store)
            async with StallWatch() as watch:
                result = await agent.run("call it", user_id="bench")
            rows = await store.load_messages(result.conversation_id, "bench")
            outcome = _outcome(llm.calls, rows)
            print(json.dumps({"phase": "call", "stall": watch.worst, "outcome": outcome}),
                  flush=True)
            await agent.close()
        finally:
            await server.aclose()
            await store.close()


def _outcome(calls: list[Any], rows: list[Any]) -> str:
    tool_rows = [r for r in rows if r["role"] == "tool"]
    if not tool_rows:  # the arguments were refused: the model was asked again
        return "refused: " + calls[1][-1]["content"].split("\n")[0][:90]
    data = json.loads(tool_rows[-1]["content"])
    if data.get("ok"):
        return f"ok, {len(data['output']):,} characters kept"
    return "tool error: " + data["error"][:90]


# -- the runner --------------------------------------------------------------------------------


def measure(name: str, spec: dict[str, Any], src: Path, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "bench.bench_mcp_stall", "--case",
                               json.dumps(spec)], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)
        out, killed = done.stdout, False
        if done.returncode:
            raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    except subprocess.TimeoutExpired as exc:
        out, killed = (exc.stdout or b"").decode(), True
    phases = {p["phase"]: p for p in map(json.loads, filter(None, out.splitlines()))}
    took = time.monotonic() - started
    for phase in ("list", "call"):
        if phase not in phases:  # frozen in that phase: at least as long as it ran
            phases[phase] = {"stall": None, "outcome": f"killed after {took:.0f} s"}
            break
    phases.setdefault("call", {"stall": None, "outcome": "not reached"})
    phases["killed"] = killed
    return phases


def _figure(stalls: list[float | None], timeout: float) -> str:
    known = [s for s in stalls if s is not None]
    if len(known) < len(stalls):
        return f"> {timeout:.0f} s" if not known else f"{statistics.median(known) * 1e3:.1f} ms*"
    return f"{statistics.median(known) * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a case may take before it is killed (a freeze)")
    parser.add_argument("--baseline", type=Path, help="another tree's src/, run the same way")
    parser.add_argument("--quick", action="store_true", help="each case once")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        asyncio.run(run_case(json.loads(args.case)))
        return
    runs = 1 if args.quick else args.runs
    trees = [("this tree", ROOT / "src")] + ([("baseline", args.baseline)] if args.baseline
                                             else [])
    print(f"longest event-loop stall while listing / calling a hostile MCP server's tool, "
          f"median of {runs} run(s); killed after {args.timeout:g} s")
    worst = 0.0
    for name, spec in cases().items():
        if args.only and args.only not in name:
            continue
        for label, src in trees:
            results = [measure(name, spec, src, args.timeout) for _ in range(runs)]
            lists = [r["list"]["stall"] for r in results]
            calls = [r["call"]["stall"] for r in results]
            if label == "this tree":
                worst = max([worst, *[s for s in lists + calls if s is not None]])
            last = results[-1]
            print(f"{name:<38} {label:<10} list {_figure(lists, args.timeout):>10} "
                  f"call {_figure(calls, args.timeout):>10}   "
                  f"{last['list']['outcome']}; {last['call']['outcome']}", flush=True)
    print(f"worst stall in this tree: {worst * 1e3:.1f} ms (goal < 50 ms)")


if __name__ == "__main__":
    main()
