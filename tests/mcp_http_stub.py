"""A hostile MCP server over streamable HTTP (plain JSON replies), for the size tests.

Prints its port, then serves: ``bulk`` answers with a 64 MB JSON reply streamed without a
length, ``zipped`` with a gzip reply (nobody asked for) that unpacks to 64 MB; ``blocks``
with 3.7 MB of 120,000 content blocks, ``sse_blocks`` with an event stream whose event holds
30,000 (0.9 MB, under the SDK's 1 MB for an event); ``say`` and ``sse_say`` work.
"""

import gzip
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mcp_hostile import handshake

BIG = 64 * 1024 * 1024
TOOLS = [{"name": name, "description": text, "inputSchema": {"type": "object"}}
         for name, text in [("bulk", "A 64 MB reply."), ("zipped", "A gzip bomb."),
                            ("blocks", "150,000 blocks."), ("sse_blocks", "Blocks, streamed."),
                            ("say", "Say hello."), ("sse_say", "Say hello, streamed.")]]


def answer(request):
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":
        return handshake(params, "hostile")
    if method == "tools/list":
        return {"tools": TOOLS}
    return {"content": [{"type": "text", "text": "hello"}]}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in request:  # a notification
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        name = (request.get("params") or {}).get("name")
        head = json.dumps({"jsonrpc": "2.0", "id": request["id"],
                           "result": {"content": [{"type": "text", "text": ""}]}})
        start, end = head.encode().split(b'""')
        self.send_response(200)
        json_type = ("Content-Type", "application/json")
        if name == "bulk":  # no length: the body ends when the connection does
            self.send_header(*json_type)
            self.end_headers()
            self.wfile.write(start + b'"')
            for _ in range(BIG // 65536):
                self.wfile.write(b"b" * 65536)
            self.wfile.write(b'"' + end)
            return
        if name in ("sse_blocks", "sse_say"):  # an event stream of one message
            blocks = 30_000 if name == "sse_blocks" else 1
            text = "hello" if name == "sse_say" else "b"
            data = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {
                "content": [{"type": "text", "text": text}] * blocks}})
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(f"event: message\ndata: {data}\n\n".encode())
            return
        if name == "blocks":
            body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {
                "content": [{"type": "text", "text": "b"}] * 120_000}}).encode()
        elif name == "zipped":
            body = gzip.compress(start + b'"' + b"z" * BIG + b'"' + end, compresslevel=9)
            self.send_header("Content-Encoding", "gzip")
        else:
            body = json.dumps({"jsonrpc": "2.0", "id": request["id"],
                               "result": answer(request)}).encode()
        self.send_header(*json_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # no stream of server messages; DELETE ends no session
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_DELETE = do_GET

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the client hung up on a reply it would not read: that is the point


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
