"""An MCP server (stdio) that misbehaves on request, for the failure tests.

Plain JSON-RPC lines rather than the SDK, so it starts in a few milliseconds: ``die`` exits
mid-call, ``hang`` never answers, ``flood`` sends one line bigger than a client should hold,
``nap`` sleeps (the server reads nothing more) with a child of its own asleep too; ``say``
works (to show the server is started again after ``die``);
``book`` takes an argument described through ``$defs``.
"""

import json
import os
import subprocess
import sys
import time

from mcp_hostile import handshake

TOOLS = [
    {"name": "say", "description": "Say the text back.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                     "required": ["text"]}},
    {"name": "book", "description": "Book a room.",
     "inputSchema": {"type": "object", "properties": {"room": {"$ref": "#/$defs/Room"}},
                     "required": ["room"],
                     "$defs": {"Room": {"type": "object", "required": ["beds"],
                                        "properties": {"beds": {"type": "integer",
                                                                "minimum": 1}}}}}},
    {"name": "notes.count", "description": "\x1b[2JCount the notes.\x07",
     "inputSchema": {"type": "object"}},
    *({"name": name, "description": text, "inputSchema": {"type": "object"}} for name, text in [
        ("die", "Exit in the middle of the call."),
        ("hang", "Never answer."),
        ("flood", "Write a 6 MB line with no end."),
        ("nap", "Sleep for a minute, with a child process asleep too."),
    ]),
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request):
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":
        return handshake(params, "stub")
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        name, args = params["name"], params.get("arguments") or {}
        if name == "say":
            return {"content": [{"type": "text", "text": f"said: {args['text']} "
                                                         f"(pid {os.getpid()})"}]}
        if name == "notes.count":
            return {"content": [{"type": "text", "text": "\x1b[31m3 notes\x1b[0m"}]}
        if name == "book":
            return {"content": [{"type": "text", "text": f"booked {args['room']['beds']} beds"}]}
        if name == "die":
            sys.stderr.write("stub: dying on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        if name == "hang":
            return None  # never answered; the server goes on reading
        if name == "nap":
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # stub-nap"])
            time.sleep(60)
        if name == "flood":
            sys.stdout.write("x" * 6_000_000)
            sys.stdout.flush()
            time.sleep(3600)
    raise LookupError(method)


for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue  # a notification
    try:
        result = answer(request)
        if result is not None:
            send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    except LookupError:
        send({"jsonrpc": "2.0", "id": request["id"],
              "error": {"code": -32601, "message": f"unknown method {request['method']}"}})
