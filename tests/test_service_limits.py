"""What a server open to anyone needs, through a real `cogency serve` and raw sockets: a
request arrives in time or its connection is closed (slow clients), the connections are
capped (in all, and per address), and one request is one escaped log line."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest

from serverutil import Server, create_key

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


def until_closed(sock, send=b"", piece=1):
    """Everything the server sends until it closes the connection (sending ``send`` ``piece``
    bytes at a time meanwhile: a byte, a slow client's way); fails if it is still open after
    15 s."""
    sock.settimeout(0.1)
    received, deadline = b"", time.monotonic() + 15
    while time.monotonic() < deadline:
        if send:
            try:
                sock.sendall(send[:piece])
                send = send[piece:]
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


def test_a_request_head_over_the_limit_is_refused(served):
    server, address = served
    with connect(address) as headers:  # one header of 100 KiB that never ends
        answer = until_closed(headers, b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: "
                                         + b"a" * 100 * 1024, piece=8192)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"over 65536 bytes" in answer
    with connect(address) as url:  # a whole request, its URL 100 KiB long
        answer = until_closed(url, b"GET /health?q=" + b"a" * 100 * 1024
                                     + b" HTTP/1.1\r\nhost: x\r\n\r\n", piece=200 * 1024)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"too_large" in answer
    assert health(address).startswith(b"HTTP/1.1 200 ")
    assert "closed connections whose request's head was over 65536 bytes" in server.log()


def test_pipelined_requests_are_answered_in_order(served):
    server, address = served
    with connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
                     b"GET /nothing-here HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answers = until_closed(sock)
    assert answers.startswith(b"HTTP/1.1 200 ") and answers.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 404 " in answers.split(b"\r\n\r\n", 1)[1]


def test_a_pipelined_request_is_not_timed_while_the_one_before_is_answered(served):
    server, address = served
    tmp = server.log_path.parent
    key, gate = create_key(str(tmp / "limits.db"), "pipeliner"), tmp / "pipelined.gate"
    held, second = (json.dumps({"query": q}).encode() for q in (f"gate:{gate} held", "next"))
    head = (b"POST /api/runs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + key.encode()
            + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n")
    with connect(address) as sock:
        # a run held in flight, and behind it a request whose body is still to come
        sock.sendall(head % len(held) + b"\r\n" + held
                     + head % len(second) + b"connection: close\r\n\r\n" + second[:1])
        time.sleep(1.5)  # longer than both time limits (1 s): the second must still wait
        gate.touch()
        first = b""
        while b"opened:" not in first:
            chunk = sock.recv(65536)
            assert chunk, f"the connection was closed; received {first!r}"
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(second[1:])  # the second request's body, once its turn came
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"echo: next" in answer


def test_a_websocket_upgrade_is_answered_as_a_plain_request(served):
    server, address = served
    with connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\n"
                     b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
                     b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower()
    assert health(address).startswith(b"HTTP/1.1 200 ")
