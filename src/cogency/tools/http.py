"""An HTTP GET tool with size, time and redirect limits (standard library only).

Redirects are followed by hand so every hop is checked again: its scheme (http/https only),
and unless ``allow_private`` its address (no loopback, private, link-local or cloud metadata
addresses, checked on the address actually connected to, so DNS cannot swap one in).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from email.message import Message
from urllib.parse import urljoin, urlsplit

from ..errors import ToolError
from .base import Tool

HTTP_TIMEOUT = 15.0
MAX_HTTP_BYTES = 1_000_000
MAX_REDIRECTS = 5
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

    def http_get(url: str) -> str:
        deadline = time.monotonic() + timeout
        current = url
        for hop in range(max_redirects + 1):
            parts = _check_url(current)
            status, reason, headers, body, cut = _fetch(parts, deadline, max_bytes, allow_private)
            if status in _REDIRECTS and headers.get("Location"):
                if hop == max_redirects:
                    raise ToolError(f"more than {max_redirects} redirects; stopped at {current}")
                current = urljoin(current, headers["Location"])
                continue
            return _describe(current, status, reason, headers, body, cut, max_bytes)
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


def _check_url(url: str):  # -> SplitResult
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


def _fetch(parts, deadline: float, max_bytes: int, allow_private: bool):
    host = parts.hostname
    https = parts.scheme.lower() == "https"
    port = parts.port or (443 if https else 80)
    address = _resolve(host, port, allow_private, _remaining(deadline))
    sock = socket.create_connection(address[:2], timeout=_remaining(deadline))
    try:
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        connection = http.client.HTTPConnection(host, port, timeout=_remaining(deadline))
        connection.sock = sock  # connected to the checked address, not a second lookup
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.putheader("User-Agent", USER_AGENT)
        connection.putheader("Accept-Encoding", "identity")
        connection.putheader("Connection", "close")
        connection.endheaders()
        response = connection.getresponse()
        chunks, total, cut = [], 0, False
        while True:
            sock.settimeout(_remaining(deadline))
            chunk = response.read1(65_536) if hasattr(response, "read1") else response.read(65_536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                cut = True
                break
        return response.status, response.reason, response.headers, b"".join(chunks)[:max_bytes], cut
    except (TimeoutError, socket.timeout) as exc:
        raise ToolError("the request timed out") from exc
    except ssl.SSLError as exc:
        raise ToolError(f"TLS failed: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise ToolError(f"the request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sock.close()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ToolError("the request timed out")
    return left


def _resolve(host: str, port: int, allow_private: bool, timeout: float) -> tuple:
    # getaddrinfo has no timeout of its own; the tool's own time limit bounds it.
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve {host!r}: {exc}") from exc
    for family, _, _, _, address in infos:
        ip = ipaddress.ip_address(str(address[0]).split("%")[0])
        if allow_private or ip.is_global:
            return address
    raise ToolError(
        f"{host!r} resolves to a private, loopback or link-local address; refused "
        "(http_tool(allow_private=True) allows it)"
    )


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
