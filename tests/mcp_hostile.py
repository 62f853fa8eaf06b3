"""A hostile MCP server (stdio, plain JSON-RPC lines), for the bounded-work tests and
bench/bench_mcp_stall.py.

``python mcp_hostile.py SPEC`` where SPEC is JSON, every key optional::

    {"tools": {NAME: SCHEMA_SPEC}, "results": {NAME: RESULT_SPEC},
     "output": {NAME: SCHEMA_SPEC}, "describe": N, "order": "head" | "tail" | "lost",
     "hang": false, "log": PATH, "spawn": false}

Each spec is ``[KIND, ARG...]``, built here so that a few bytes make a schema or a result of
any size:

- schemas: ``["plain"]``; ``["wide", K, LEVELS]`` ($defs whose ``anyOf`` holds K refs to the
  next, LEVELS deep: K**LEVELS nodes once inlined, a few kB as sent); ``["deep", LEVELS]``
  (two refs to the next at each level: 2**LEVELS checks for a value that fails them all);
  ``["flat", N]`` (an object of N string properties: 4N+7 nodes); ``["big_enum", N]``;
  ``["enum_items", OPTIONS, N]`` (an array whose items are any of OPTIONS enums of N values:
  N * OPTIONS checks per item that matches none); ``["either", N]`` (an array whose
  items are any of N integer options or a string: a string fails N options first, the
  costliest check there is, with few bytes of arguments); ``["pattern", PATTERN]`` (an array of
  strings matching PATTERN); ``["patterns", N, CHARS]`` (N string properties, each with a
  pattern of its own of CHARS characters, matched by the property's number: ``00007``).
- results: ``["text", BYTES]``; ``["blocks", N]`` (N one-character text blocks);
  ``["nested", N]`` (structuredContent: N small nested objects); ``["deep_json", N]``
  (structuredContent: N arrays 8 deep, the costliest to parse); ``["numbers", N]``;
  ``["structured", VALUE]``. Other tools answer "NAME ok (pid PID)".

``output`` gives tools an ``outputSchema``; ``describe`` adds N sentences to each description. ``order`` puts a response's ``id`` before (head)
or after (tail) its ``result``, as the Python and TypeScript SDKs do, or after another key
(lost). ``hang`` never answers the handshake; ``log`` gets one line per start; ``spawn`` adds
a tool that starts grandchildren out of the server's session and group (one with no
environment at all) and answers with their pids.
"""

import json
import os
import subprocess
import sys


def schema(spec):
    kind, *args = spec
    if kind == "plain":
        return {"type": "object", "properties": {"x": {"type": "string"}}}
    if kind == "wide":
        width, levels = args
        defs = {f"D{i}": {"anyOf": [{"$ref": f"#/$defs/D{i + 1}"}] * width}
                for i in range(levels)}
        defs[f"D{levels}"] = {"type": "string"}
        return {"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs}
    if kind == "deep":
        (levels,) = args
        defs = {f"D{i}": {"anyOf": [{"$ref": f"#/$defs/D{i + 1}"},
                                    {"$ref": f"#/$defs/D{i + 1}"}]} for i in range(levels)}
        defs[f"D{levels}"] = {"type": "string"}
        return {"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs}
    if kind == "flat":
        (count,) = args
        return {"type": "object", "additionalProperties": False,
                "properties": {f"p{i}": {"type": "string"} for i in range(count)}}
    if kind == "big_enum":
        (count,) = args
        return {"type": "object", "properties": {"x": {"enum": list(range(count))}}}
    if kind == "enum_items":
        options, count = args
        return {"type": "object", "properties": {"x": {"type": "array", "items": {
            "anyOf": [{"enum": list(range(count))}] * options}}}}
    if kind == "either":
        (count,) = args
        return {"type": "object", "properties": {"x": {"type": "array", "items": {
            "anyOf": [{"type": "integer"}] * count + [{"type": "string"}]}}}}
    if kind == "pattern":
        (pattern,) = args
        return {"type": "object", "properties": {"x": {"type": "array", "items": {
            "type": "string", "pattern": pattern}}}}
    if kind == "patterns":
        count, chars = args
        return {"type": "object", "properties": {
            f"p{i}": {"type": "string", "pattern": f"^{i:05d}" + "(a|b)?" * ((chars - 6) // 6)}
            for i in range(count)}}
    raise ValueError(kind)


def result(spec):
    kind, *args = spec
    if kind == "text":
        return {"content": [{"type": "text", "text": "t" * args[0]}]}
    if kind == "blocks":
        return {"content": [{"type": "text", "text": "b"}] * args[0]}
    if kind == "nested":
        return {"content": [], "structuredContent": {"x": [{"a": [1, {"b": 2}]}] * args[0]}}
    if kind == "deep_json":
        return {"content": [], "structuredContent": {"x": [[[[[[[[1]]]]]]]] * args[0]}}
    if kind == "numbers":
        return {"content": [], "structuredContent": {"x": [1] * args[0]}}
    if kind == "structured":
        return {"content": [], "structuredContent": args[0]}
    raise ValueError(kind)


def tools(spec):
    words = spec.get("describe", 0)
    listed = [{"name": name, "inputSchema": schema(kind),
               "description": f"The {name} tool." + " It does things." * words}
              for name, kind in spec.get("tools", {"say": ["plain"]}).items()]
    for item in listed:
        if item["name"] in spec.get("output", {}):
            item["outputSchema"] = schema(spec["output"][item["name"]])
    if spec.get("spawn"):
        listed.append({"name": "spawn", "description": "Start grandchildren.",
                       "inputSchema": {"type": "object"}})
    return listed


def send(request_id, key, value):
    body = json.dumps(value, separators=(",", ":"))
    if SPEC.get("order") == "tail":
        line = f'{{"{key}":{body},"jsonrpc":"2.0","id":{json.dumps(request_id)}}}'
    elif SPEC.get("order") == "lost":  # the id where it cannot be found without parsing
        line = f'{{"jsonrpc":"2.0","x":0,"id":{json.dumps(request_id)},"{key}":{body}}}'
    else:
        line = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"{key}":{body}}}'
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def spawn():
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)  # hostile-grandchild"]
    kids = [
        subprocess.Popen(sleeper, start_new_session=True),  # a session of its own
        subprocess.Popen(sleeper, process_group=0),  # a process group of its own
        subprocess.Popen(sleeper, start_new_session=True, env={}),  # and no environment
    ]
    return {"content": [{"type": "text", "text": json.dumps([kid.pid for kid in kids])}]}


def handshake(params, name):
    """The answer to ``initialize`` of a server that has tools (the other stubs use it too)."""
    return {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}}, "serverInfo": {"name": name, "version": "1"}}


def answer(request):
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":
        return handshake(params, "hostile")
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        name = params["name"]
        if name == "spawn":
            return spawn()
        spec = SPEC.get("results", {}).get(name)
        if spec:
            return result(spec)
        return {"content": [{"type": "text", "text": f"{name} ok (pid {os.getpid()})"}]}
    raise LookupError(method)


def serve():
    if SPEC.get("log"):
        with open(SPEC["log"], "a") as log:
            log.write(f"{os.getpid()}\n")
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request or SPEC.get("hang"):
            continue  # a notification, or a server that never answers
        try:
            send(request["id"], "result", answer(request))
        except LookupError:
            send(request["id"], "error", {"code": -32601,
                                          "message": f"unknown method {request['method']}"})


if __name__ == "__main__":
    SPEC = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    TOOLS = tools(SPEC)
    serve()
