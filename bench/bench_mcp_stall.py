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

It also times item 9 of issue 23: six runs of six users at once, with a server that never
answers its handshake among the tools (none of them uses it), start_timeout=2.

    python -m bench.bench_mcp_stall                          # this tree
    python -m bench.bench_mcp_stall --baseline /work/main/src  # and another tree, same run
    python -m bench.bench_mcp_stall --quick                  # each case once
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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
STARTS, START_TIMEOUT = 6, 2.0
sys.path.insert(0, str(HOSTILE.parent))

import mcp_hostile  # noqa: E402  (the server's own builders: the bench sizes what it sends)


def cases() -> dict[str, dict[str, Any]]:
    """Name → server spec, the tool the model calls and its arguments. Sizes at the edges
    come from this tree's limits, measured on the very messages the server sends."""
    from cogency._jsonschema import MAX_PATTERN_CHARS
    from cogency.tools import _mcp_bounds as bounds

    nodes, items = bounds.MAX_SCHEMA_NODES, bounds.MAX_MESSAGE_ITEMS
    patterns = (nodes - 20) // 8  # {"pN": {"type": "string", "pattern": P}}: 8 nodes each
    flat = (nodes - 20) // 4  # ["flat", n] has 4n + 7 nodes
    # Under the server's budget, each tool under its own: the most inlining a listing can ask.
    per_server = bounds.MAX_SERVER_SCHEMA_NODES // (4 * flat + 7)
    bad = {"x": 5}  # fails every branch: the most checking
    return {
        "wide $ref/anyOf (100 x 6)": {  # left out: the model calls what stands in for it
            "tools": {"wide": ["wide", 100, 6]}, "call": "wide", "args": {}},
        "deep $ref/anyOf (2 x 40)": {
            "tools": {"deep": ["deep", 40]}, "call": "deep", "args": bad},
        "wide $ref/anyOf at the node budget": {
            "tools": {"edge": ["wide", _largest(lambda k: _inlines(["wide", k, 5])), 5]},
            "call": "edge", "args": bad},
        "flat schema at the node budget": {
            "tools": {"flat": ["flat", flat]}, "call": "flat",
            "args": {f"p{i}": "v" for i in range(flat)}},
        "arguments at the step budget": {
            "tools": {"enum": ["enum_items", 1, 99]}, "call": "enum",
            "args": {"x": [98] * _largest(lambda n: _checks(["enum_items", 1, 99], 98, n))}},
        "16 calls (a step's most), each at the step budget": {
            "tools": {"either": ["either", 1_000]}, "call": "either", "times": 16,
            "args": {"x": ["a"] * _largest(lambda n: _checks(["either", 1_000], "a", n))}},
        "a pattern the regex compiler multiplies": {
            "tools": {"copies": ["pattern", "(a{1000}){1000}"]}, "call": "copies",
            "args": {"x": ["a" * 1000]}},
        "a backtracking pattern, 200 strings": {
            "tools": {"backtrack": ["pattern", "^(a|aa)+$"]}, "call": "backtrack",
            "args": {"x": ["a" * 40 + "!"] * 200}},
        f"{patterns} patterns of {MAX_PATTERN_CHARS:,} characters": {
            "tools": {"compile": ["patterns", patterns, MAX_PATTERN_CHARS]},
            "call": "compile", "args": {f"p{i}": f"{i:05d}" for i in range(patterns)}},
        "schemas at the server's budget": {
            "tools": {f"t{i}": ["flat", flat] for i in range(per_server)}, "call": "t0",
            "args": {"p0": "v"}},
        "listing at the message budget": {
            "tools": {f"tool{i}": ["flat", 6] for i in range(_most(
                lambda n: _listing({f"tool{i}": ["flat", 6] for i in range(n)}), items))},
            "call": "tool0", "args": {"p0": "v"}},
        "200 tools, 1,000-character descriptions": {
            "tools": {f"tool{i}": ["plain"] for i in range(200)}, "describe": 62,
            "call": "tool0", "args": {}},
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


def _inlines(spec: list[Any]) -> bool:
    from cogency._jsonschema import SchemaTooLarge, inline_refs
    from cogency.tools._mcp_bounds import MAX_DEPTH, MAX_SCHEMA_NODES

    try:
        inline_refs(mcp_hostile.schema(spec), budget=MAX_SCHEMA_NODES, strict=False,
                    max_depth=MAX_DEPTH)
    except SchemaTooLarge:
        return False
    return True


def _checks(spec: list[Any], item: Any, n: int) -> bool:
    """Whether {"x": [item] * n} checks within the step budget."""
    from cogency._jsonschema import TooCostly, inline_refs, validate
    from cogency.tools._mcp_bounds import MAX_DEPTH, MAX_VALIDATION_STEPS

    schema, _ = inline_refs(mcp_hostile.schema(spec), strict=False, max_depth=MAX_DEPTH)
    try:
        validate({"x": [item] * n}, schema, budget=MAX_VALIDATION_STEPS)
    except TooCostly:
        return False
    return True


def _largest(fits: Any) -> int:
    """The largest n from 1 for which fits(n) holds (it holds for 1, and fails past it)."""
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


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
    from cogency.tokens import count_tokens
    from cogency.tools import MCPServer

    from bench.bench_tool_stall import StallWatch

    server_spec = {key: spec[key] for key in ("tools", "results", "order", "describe")
                   if key in spec}
    server_spec["tools"] = {**server_spec["tools"], "warm": ["plain"]}
    server = MCPServer([sys.executable, str(HOSTILE), json.dumps(server_spec)], name="hostile",
                       trusted=True, timeout=120, start_timeout=120)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        try:
            # Warm up (imports, the tokenizer, the store) with a harmless server and call,
            # so what is measured is the hostile part alone. The tokenizer is loaded on the
            # first count that must be exact (~0.1 s, once per process, whatever asks for
            # it), which a short warm-up run does not need: loaded here.
            count_tokens("warm up")
            plain = MCPServer([sys.executable, str(HOSTILE), json.dumps({"tools": {
                "warm": ["plain"]}})], name="plain", trusted=True)
            warm = ScriptedLLM([{"secure": True, "actions": [{"name": "warm", "args": {}}]},
                                {"response": "warm", "actions": []}])
            async with Agent(llm=warm, tools=[plain], store=store) as agent:
                await agent.run("warm up", user_id="bench")
            with GarbageWatch() as collector:
                async with StallWatch() as watch:
                    tools = await server.list_tools()
                    await asyncio.sleep(0.005)  # a stall at the very end is seen too
            unavailable = [t.name for t in tools if t.description.startswith("UNAVAILABLE")]
            listed = (f"{len(tools) - len(unavailable)} tools"
                      + (f", {len(unavailable)} refused" if unavailable else ""))
            print(json.dumps({"phase": "list", "stall": watch.worst, "gc": collector.worst,
                              "outcome": listed}), flush=True)
            llm = ScriptedLLM([
                {"secure": True, "actions": [{"name": spec["call"], "args": spec["args"]}]
                 * spec.get("times", 1)},
                {"response": "done", "actions": []},
            ])
            agent = Agent(llm=llm, tools=[server], store=store)
            with GarbageWatch() as collector:
                async with StallWatch() as watch:
                    result = await agent.run("call it", user_id="bench")
                    await asyncio.sleep(0.005)
            rows = await store.load_messages(result.conversation_id, "bench")
            outcome = _outcome(llm.calls, rows)
            print(json.dumps({"phase": "call", "stall": watch.worst, "gc": collector.worst,
                              "outcome": outcome}), flush=True)
            await agent.close()
        finally:
            await server.aclose()
            await store.close()


class GarbageWatch:
    """The longest pause of the garbage collector meanwhile: a full collection walks every
    object of the process (~0.1 s here, more on a busy machine), whatever triggered it."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._started = 0.0

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.worst = max(self.worst, time.perf_counter() - self._started)

    def __enter__(self) -> GarbageWatch:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)


def _outcome(calls: list[Any], rows: list[Any]) -> str:
    tool_rows = [r for r in rows if r["role"] == "tool"]
    if not tool_rows:  # the arguments were refused: the model was asked again
        return "refused: " + calls[1][-1]["content"].split("\n")[0][:90]
    data = json.loads(tool_rows[-1]["content"])
    if data.get("ok"):
        return f"ok, {len(data['output']):,} characters kept"
    return "tool error: " + data["error"][:90]


async def run_starts(runs: int, start_timeout: float) -> None:
    """``runs`` runs of as many users at once, with a server that never answers its handshake
    among the agent's tools (none of them uses it): when each finished, and how often the
    server was started."""
    from cogency import Agent
    from cogency.storage import SQLiteStore
    from cogency.testing import ScriptedLLM
    from cogency.tools import MCPServer

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "starts.log"
        server = MCPServer([sys.executable, str(HOSTILE), json.dumps({"hang": True,
                                                                     "log": str(log)})],
                           name="hung", start_timeout=start_timeout)
        store = SQLiteStore(Path(tmp) / "bench.db")
        try:
            warm = ScriptedLLM([{"secure": True, "response": "warm", "actions": []}])
            async with Agent(llm=warm, store=store) as agent:  # the store, the tokenizer
                await agent.run("warm up", user_id="bench")
            llm = ScriptedLLM([{"secure": True, "response": f"answer {i}", "actions": []}
                               for i in range(runs)])
            async with Agent(llm=llm, tools=[server], store=store) as agent:
                started = time.monotonic()

                async def one(user: str) -> float:
                    result = await agent.run("What is 2 + 2?", user_id=user)
                    assert result.stop_reason == "completed", result
                    return time.monotonic() - started

                finished = await asyncio.gather(*(one(f"user{i}") for i in range(runs)))
                starts = len(log.read_text().split()) if log.exists() else 0
            print(json.dumps({"finished": sorted(finished), "starts": starts}), flush=True)
        finally:
            await store.close()


# -- the runner --------------------------------------------------------------------------------


def _child(args: list[str], src: Path, timeout: float) -> tuple[str, bool]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    try:
        done = subprocess.run([sys.executable, "-m", "bench.bench_mcp_stall", *args],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"").decode(), True
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout, False


def measure(spec: dict[str, Any], src: Path, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    out, killed = _child(["--case", json.dumps(spec)], src, timeout)
    phases = {p["phase"]: p for p in map(json.loads, filter(None, out.splitlines()))}
    took = time.monotonic() - started
    for phase in ("list", "call"):
        if phase not in phases:  # frozen in that phase: at least as long as it ran
            phases[phase] = {"stall": None, "gc": None, "outcome": f"killed after {took:.0f} s"}
            break
    phases.setdefault("call", {"stall": None, "gc": None, "outcome": "not reached"})
    phases["killed"] = killed
    return phases


def _figure(values: list[float | None], timeout: float) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return f"> {timeout:.0f} s"
    figure = statistics.median(known)
    text = f"{figure * 1e3:.1f} ms" if figure < 10 else f"{figure:.1f} s"
    return text + ("*" if len(known) < len(values) else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a case may take before it is killed (a freeze)")
    parser.add_argument("--baseline", type=Path, help="another tree's src/, run the same way")
    parser.add_argument("--quick", action="store_true", help="each case once")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--starts", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        asyncio.run(run_case(json.loads(args.case)))
        return
    if args.starts:
        asyncio.run(run_starts(args.starts, START_TIMEOUT))
        return
    runs = 1 if args.quick else args.runs
    trees = [("this tree", ROOT / "src")] + ([("baseline", args.baseline)] if args.baseline
                                             else [])
    print(f"longest event-loop stall while listing / calling a hostile MCP server's tool "
          f"(and the longest garbage-collector pause within it), median of {runs} run(s); "
          f"a case is killed after {args.timeout:g} s")
    worst = 0.0
    for name, spec in cases().items():
        if args.only and args.only not in name:
            continue
        for label, src in trees:
            results = [measure(spec, src, args.timeout) for _ in range(runs)]
            figures = []
            for phase in ("list", "call"):
                stalls = [r[phase]["stall"] for r in results]
                pauses = [r[phase]["gc"] for r in results]
                figures.append(f"{phase} {_figure(stalls, args.timeout):>10} "
                               f"(gc {_figure(pauses, args.timeout)})")
                if label == "this tree":
                    worst = max([worst, *[x for x in stalls if x is not None]])
            last = results[-1]
            print(f"{name:<36} {label:<9} {figures[0]:<28} {figures[1]:<28} "
                  f"{last['list']['outcome']}; {last['call']['outcome']}", flush=True)
    print(f"worst stall in this tree: {worst * 1e3:.1f} ms (goal < 50 ms)")
    if args.only:
        return
    print(f"\n{STARTS} runs of {STARTS} users at once, none using a server that never answers "
          f"its handshake (start_timeout={START_TIMEOUT:g}): seconds until each finished")
    for label, src in trees:
        out, killed = _child(["--starts", str(STARTS)], src, args.timeout * 4)
        if killed:
            print(f"{label:<9} killed after {args.timeout * 4:g} s")
            continue
        data = json.loads(out.splitlines()[-1])
        print(f"{label:<9} {' '.join(f'{t:.1f}' for t in data['finished'])}; "
              f"the server was started {data['starts']} time(s)")


if __name__ == "__main__":
    main()
