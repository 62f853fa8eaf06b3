"""The client counterpart of ``bench.bare_http``, for ``bench.bench_service``: HTTP/1.1 over one
kept-alive connection with no framework (asyncio's streams), so that a round trip costs what
the loopback and the server cost, and little of the client's own. A client library adds its
own cost to every request (httpx's is measured beside this one, as most Python users' client);
no server change can cut it, so the service's figures are judged with this client.

For the benchmark only: it trusts its server (a response's head and body are not bounded) and
reads only bodies sent with a ``content-length``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class LeanConnection:
    """One connection to ``url``'s host, kept alive; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 host: str) -> None:
        self._reader = reader
        self._writer = writer
        self._host = host

    @classmethod
    async def open(cls, url: str) -> LeanConnection:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"an http://HOST:PORT address, not {url!r}")
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def post(self, path: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST ``body`` as JSON; the response's status and body."""
        data = json.dumps(body).encode()
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self._host}\r\n{head}content-type: "
            f"application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
        answer = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *lines = answer[:-4].split(b"\r\n")
        length = None
        for line in lines:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise ValueError(f"a response without a content-length: {status_line!r}")
        return int(status_line.split()[1]), await self._reader.readexactly(length)

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()
