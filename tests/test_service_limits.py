"""What a server open to anyone needs, through a real `cogency serve` and raw sockets: a
request arrives in time or its connection is closed (slow clients), the connections are
capped (in all, and per address), and one request is one escaped log line."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

from serverutil import Server

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    server = Server(str(tmp / "limits.db"), tmp, "--header-timeout", "1", "--body-timeout", "1")
    parts = urlsplit(server.url)
    yield server, (parts.hostname, parts.port)
    server.stop()


def connect(address, source="127.0.0.1"):
    sock = socket.create_connection(address, timeout=15, source_address=(source, 0))
    return sock


def until_closed(sock, send=b""):
    """Everything the server sends until it closes the connection (sending ``send`` a byte at
    a time meanwhile, a slow client's way); fails if it is still open after 15 s."""
    sock.settimeout(0.1)
    received, deadline = b"", time.monotonic() + 15
    while time.monotonic() < deadline:
        if send:
            try:
                sock.sendall(send[:1])
                send = send[1:]
            except OSError:
                send = b""
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the connection is still open; received {received!r}")


def health(address, source="127.0.0.1"):
    with connect(address, source) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        return until_closed(sock)


def test_a_request_that_does_not_arrive_in_time_is_cut_off(served):
    server, address = served
    with connect(address) as silent:  # sends nothing at all
        answer = until_closed(silent)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"headers did not arrive" in answer
    with connect(address) as trickle:  # headers a byte at a time, past the time limit
        answer = until_closed(trickle, b"GET /health HTTP/1.1\r\nx-slow: " + b"a" * 200)
    assert answer.startswith(b"HTTP/1.1 408 ")
    with connect(address) as half_body:  # headers, then half the body it announced
        half_body.sendall(b"POST /api/runs HTTP/1.1\r\nhost: x\r\ncontent-type: "
                          b"application/json\r\ncontent-length: 100\r\n\r\n{\"query\": ")
        answer = until_closed(half_body)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"body did not arrive" in answer
    with connect(address) as kept:  # a kept-alive connection, then half a second request
        kept.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):
            first += kept.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(b"GET /health HTTP/1.1\r\nhost:")
        assert until_closed(kept).startswith(b"HTTP/1.1 408 ")
    assert health(address).startswith(b"HTTP/1.1 200 ")
    assert "closed connections whose request's headers did not arrive within 1 s" in \
        server.log()


def test_connections_are_capped_in_all_and_per_address(tmp_path):
    server = Server(str(tmp_path / "caps.db"), tmp_path, "--max-connections", "12",
                    "--max-connections-per-client", "4", name="caps")
    parts = urlsplit(server.url)
    address = (parts.hostname, parts.port)
    held = []
    try:
        held += [connect(address, "127.0.0.2") for _ in range(4)]
        with connect(address, "127.0.0.2") as fifth:
            answer = until_closed(fifth)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"from your address" in answer
        held += [connect(address, f"127.0.0.{n}") for n in (3, 3, 3, 3, 4, 4, 4)]
        assert health(address, "127.0.0.5").startswith(b"HTTP/1.1 200 ")  # the 12th
        held.append(connect(address, "127.0.0.5"))
        time.sleep(0.3)  # all 12 taken, each waiting for its request
        # one more: the connection that has waited longest for its request makes room
        assert health(address, "127.0.0.6").startswith(b"HTTP/1.1 200 ")
        cut = until_closed(held.pop(0))
        assert cut.startswith(b"HTTP/1.1 408 ") and b"the server was full" in cut
        # when every connection has a request in hand, one more is refused
        for sock in held:
            sock.sendall(b"POST /api/runs HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
        held.append(connect(address, "127.0.0.6"))
        held[-1].sendall(b"POST /api/runs HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
        time.sleep(0.3)
        with connect(address, "127.0.0.7") as over:
            answer = until_closed(over)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"as many connections" in answer
    finally:
        for sock in held:
            sock.close()
        server.stop()
    log = server.log()
    assert "refused connections: too many connections from your address" in log


def test_one_request_is_one_escaped_log_line(served):
    server, address = served
    forged = (b"/health%0A2026-01-01%2000:00:00,000%20INFO%20cogency.server:%20POST%20"
              b"/api/runs%20200%200.1ms%1B%5B2J%E2%80%AE")
    with connect(address) as sock:
        sock.sendall(b"GET " + forged + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert until_closed(sock).startswith(b"HTTP/1.1 404 ")
    log = server.log()
    lines = [line for line in log.splitlines() if "cogency.server: POST /api/runs 200" in line]
    assert lines == [], lines  # no forged line
    [line] = [line for line in log.splitlines() if "%0A2026-01-01" in line]
    assert line.endswith("404 " + line.rsplit(" ", 1)[-1]) and " GET /health%0A" in line
    assert "\x1b" not in log and "\u202e" not in log and "%1B%5B2J%E2%80%AE" in line
