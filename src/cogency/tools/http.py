"""An HTTP GET tool with size, time and redirect limits (standard library only).

Redirects are followed by hand so every hop is checked again: its scheme (http/https only),
and unless ``allow_private`` its address (no loopback, private, link-local or cloud metadata
addresses, checked on the address actually connected to, so DNS cannot swap one in).

The request is asyncio from end to end under one deadline: connecting, every byte of the
headers and the body, and every redirect share ``timeout`` (a server that drips its headers
is cut off at the deadline, not at each read). Name lookups run in the tool's own threads,
never the event loop's shared pool, so hung calls cannot starve other tools.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import ipaddress
import socket
import ssl
import string
import threading
from email.message import Message
from typing import Any
from urllib.parse import SplitResult, quote, urljoin, urlsplit

from ..errors import ToolError
from .base import Tool, in_thread

HTTP_TIMEOUT = 15.0
MAX_HTTP_BYTES = 1_000_000
MAX_REDIRECTS = 5
MAX_HEADER_BYTES = 65_536
LOOKUP_THREADS = 4
"""Name lookups of one http tool at once (``getaddrinfo`` cannot be cancelled)."""
USER_AGENT = "cogency-http-tool/1"
_REDIRECTS = (301, 302, 303, 307, 308)
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript",
               "application/x-www-form-urlencoded", "+json", "+xml")


def http_tool(
    *,
    timeout: float = HTTP_TIMEOUT,
    max_bytes: int = MAX_HTTP_BYTES,
    max_redirects: int = MAX_REDIRECTS,
    allow_private: bool = False,
    name: str = "http_get",
) -> Tool:
    """A tool that GETs an http(s) URL and returns its status, content type and text.

    The whole exchange, redirects included, gets ``timeout`` seconds; bodies over
    ``max_bytes`` are cut (and say so). ``allow_private=True`` lets it reach loopback and
    private networks (needed for local servers; unsafe for untrusted prompts).
    """
    lookups = threading.BoundedSemaphore(LOOKUP_THREADS)

    async def http_get(url: str) -> str:
        try:
            async with asyncio.timeout(timeout):
                current = url
                for hop in range(max_redirects + 1):
                    parts = _check_url(current)
                    address = await _resolve(parts, allow_private, lookups)
                    status, reason, headers, body, cut = await _fetch(parts, address, max_bytes)
                    if status in _REDIRECTS and headers.get("Location"):
                        if hop == max_redirects:
                            raise ToolError(
                                f"more than {max_redirects} redirects; stopped at {current}"
                            )
                        current = urljoin(current, headers["Location"])
                        continue
                    return _describe(current, status, reason, headers, body, cut, max_bytes)
        except TimeoutError:
            raise ToolError(
                f"the request timed out after {timeout:g}s (one deadline for connecting, "
                "headers, body and redirects)"
            ) from None
        raise AssertionError("unreachable")

    return Tool(
        name,
        f"HTTP GET an http(s) URL; returns the status and the text of the page (at most "
        f"{max_bytes} bytes, {timeout:g}s, {max_redirects} redirects).",
        {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "http:// or https:// URL"}},
            "required": ["url"],
            "additionalProperties": False,
        },
        http_get,
        timeout=timeout + 5,
    )


def _check_url(url: str) -> SplitResult:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ToolError(f"cannot read the URL {url[:200]!r}: {exc}") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise ToolError(
            f"only http:// and https:// URLs can be fetched, not {parts.scheme or 'no scheme'!r}"
        )
    if not parts.hostname:
        raise ToolError(f"the URL {url[:200]!r} has no host")
    if any(ord(ch) < 33 for ch in url.strip()):
        raise ToolError("the URL contains spaces or control characters; percent-encode them")
    del port
    return parts


async def _resolve(
    parts: SplitResult, allow_private: bool, lookups: threading.BoundedSemaphore
) -> str:
    """The first address of the host that may be reached; the connection goes to it."""
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        infos = await in_thread(
            lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), lookups,
            "cogency-http-lookup",
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot resolve {host!r}: {exc}") from exc
    for _, _, _, _, address in infos:
        ip = ipaddress.ip_address(str(address[0]).split("%")[0])
        if allow_private or ip.is_global:
            return str(address[0])
    raise ToolError(
        f"{host!r} resolves to a private, loopback or link-local address; refused "
        "(http_tool(allow_private=True) allows it)"
    )


async def _fetch(
    parts: SplitResult, address: str, max_bytes: int
) -> tuple[int, str, Message, bytes, bool]:
    host = parts.hostname or ""
    https = parts.scheme.lower() == "https"
    port = parts.port or (443 if https else 80)
    request = _request(parts, host, https)
    try:
        reader, writer = await asyncio.open_connection(
            address, port, limit=MAX_HEADER_BYTES,
            ssl=ssl.create_default_context() if https else None,
            server_hostname=host if https else None,
        )
    except ssl.SSLError as exc:
        raise ToolError(f"TLS failed: {exc}") from exc
    except OSError as exc:
        raise ToolError(f"the request failed: {type(exc).__name__}: {exc}") from exc
    try:
        writer.write(request)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ToolError(f"the response headers are over {MAX_HEADER_BYTES} bytes") from None
        except asyncio.IncompleteReadError as exc:
            raise ToolError("the server closed the connection before its headers ended") from exc
        status, reason, headers = _parse_head(head)
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            body, cut = await _read_chunked(reader, max_bytes)
        else:
            length = headers.get("Content-Length", "").strip()
            body, cut = await _read_plain(reader, max_bytes, int(length) if length.isdigit() else None)
        return status, reason, headers, body, cut
    except ssl.SSLError as exc:
        raise ToolError(f"TLS failed: {exc}") from exc
    except (OSError, ValueError) as exc:  # ValueError: a line over the stream's limit
        raise ToolError(f"the request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        writer.transport.abort()  # no graceful close: nothing left to wait for


def _request(parts: SplitResult, host: str, https: bool) -> bytes:
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    path = quote(path, safe=string.punctuation)  # non-ASCII percent-encoded, the rest kept
    try:
        name = host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ToolError(f"cannot encode the host name {host!r}: {exc}") from exc
    if ":" in name:
        name = f"[{name}]"
    if parts.port and parts.port != (443 if https else 80):
        name += f":{parts.port}"
    return (
        f"GET {path} HTTP/1.1\r\nHost: {name}\r\nUser-Agent: {USER_AGENT}\r\n"
        "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
    ).encode("ascii")


def _parse_head(head: bytes) -> tuple[int, str, Message]:
    status_line, _, rest = head.partition(b"\r\n")
    words = status_line.decode("latin-1").split(" ", 2)
    if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
        raise ToolError(f"not an HTTP response: {status_line[:100]!r}")
    try:
        headers: Any = http.client.parse_headers(io.BytesIO(rest))
    except http.client.HTTPException as exc:
        raise ToolError(f"unreadable response headers: {exc}") from exc
    return int(words[1]), words[2].strip() if len(words) > 2 else "", headers


async def _read_plain(
    reader: asyncio.StreamReader, max_bytes: int, wanted: int | None
) -> tuple[bytes, bool]:
    body = bytearray()
    goal = max_bytes + 1 if wanted is None else min(wanted, max_bytes + 1)
    while len(body) < goal:
        chunk = await reader.read(min(65_536, goal - len(body)))
        if not chunk:
            break
        body += chunk
    return bytes(body[:max_bytes]), len(body) > max_bytes


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        line = await reader.readline()
        if not line:
            break  # closed before the last chunk: keep what came
        try:
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            raise ToolError(f"a malformed chunk in the response: {line[:40]!r}") from None
        if size <= 0:
            break
        try:
            body += await reader.readexactly(min(size, max_bytes + 1 - len(body)))
        except asyncio.IncompleteReadError as exc:
            body += exc.partial
            break
        if len(body) > max_bytes:
            return bytes(body[:max_bytes]), True
        await reader.readline()  # the CRLF that ends the chunk
    return bytes(body), False


def _describe(url: str, status: int, reason: str, headers: Message, body: bytes, cut: bool,
              max_bytes: int) -> str:
    kind = headers.get("Content-Type", "")
    head = f"HTTP {status} {reason}\nURL: {url}\nContent-Type: {kind or 'unknown'}\n"
    if body and kind and not any(t in kind.lower() for t in _TEXT_TYPES):
        return head + f"\n[{len(body)} bytes of {kind} not shown: not text]"
    charset = headers.get_content_charset() or "utf-8"
    try:
        text = body.decode(charset, "replace")
    except LookupError:
        text = body.decode("utf-8", "replace")
    note = f"\n[cut at {max_bytes} bytes]" if cut else ""
    return head + "\n" + text + note
