"""``python -m bench.bare_http BODY_FILE``: the floor under any HTTP service, for
``bench.bench_service``: an HTTP/1.1 server with no framework and no work, answering every
request (kept alive, read whole) with the bytes of ``BODY_FILE`` as JSON. A client's round
trip to it is what the client, the loopback and a second process cost by themselves.

Prints ``listening on http://127.0.0.1:PORT`` once it listens. For the benchmark only: it
trusts its client (a request's head and body are not bounded).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


class _Answer(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.pending = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.pending += data
        while True:
            head, blank, rest = self.pending.partition(b"\r\n\r\n")
            if not blank:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.pending = rest[length:]
            assert self.transport is not None
            self.transport.write(self.answer)


async def _serve(body: bytes) -> None:
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(body), body))
    server = await asyncio.get_running_loop().create_server(
        lambda: _Answer(answer), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1]).read_bytes()))
