"""What a hostile client can hold on the webhook's HTTPS port, driven over real TLS sockets on
127.0.0.1 with small limits: connections beyond the cap displace the slowest (threads stay bounded)
or are shed when every connection is being answered, a request not complete within its deadline is
closed while it still trickles, an oversized body is refused 413 unread, the body budget sheds with
503, and a prompt review is answered while slow clients hold every connection."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from controller.webhook.certs import CertBundle, generate
from controller.webhook.server import LIMITS, TlsState, WebhookServer
from driver.boundedhttp import Limits

CAP = 4
SMALL = Limits(
    max_connections=CAP,
    request_deadline_s=0.6,
    idle_timeout_s=0.6,
    max_header_bytes=4096,
    max_body=64 * 1024,
    body_budget=128 * 1024,
    poll_s=0.05,
)
BUNDLE = generate(("127.0.0.1", "localhost"), dt.datetime.now(dt.UTC))
REVIEW = json.dumps({"kind": "AdmissionReview"}).encode()


def client_context(bundle: CertBundle) -> ssl.SSLContext:
    with tempfile.NamedTemporaryFile(suffix=".crt") as f:
        f.write(bundle.ca_pem)
        f.flush()
        return ssl.create_default_context(cafile=f.name)


CTX = client_context(BUNDLE)


class Served:
    def __init__(self, limits: Limits, handler: Callable[[bytes], tuple[int, bytes]]) -> None:
        self.registry = CollectorRegistry()
        tls = TlsState()
        tls.update(BUNDLE)
        self.server = WebhookServer(
            "127.0.0.1", 0, "/mutate-pods", handler, tls, limits=limits, registry=self.registry
        )
        self.port = self.server.port
        self.clients: list[socket.socket] = []

    def rejected(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "flexmig_webhook_connections_rejected_total", {"reason": reason}
        )
        return value or 0.0

    def tls(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.clients.append(raw)
        s = CTX.wrap_socket(raw, server_hostname="127.0.0.1")
        self.clients.append(s)
        return s

    def slow(self, announce: int = 1000, sent: bytes = b"{") -> ssl.SSLSocket:
        """A client that announces a body and sends only the start of it."""
        s = self.tls()
        s.sendall(head(announce) + sent)
        return s


def head(length: int) -> bytes:
    return (
        f"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def echo(body: bytes) -> tuple[int, bytes]:
    return 200, json.dumps({"got": len(body)}).encode()


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(limits: Limits = SMALL, handler: Callable[[bytes], tuple[int, bytes]] = echo) -> Served:
        served = Served(limits, handler)
        served.server.start()
        started.append(served)
        return served

    yield start
    for served in started:
        for c in served.clients:
            c.close()
        served.server.stop()


def post(port: int, body: bytes, timeout: float = 10) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=CTX, timeout=timeout)
    try:
        conn.request("POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


def closed_within(s: socket.socket, seconds: float) -> bool:
    """True once the server closed `s` (end of file or reset), False if it is still open after `seconds`."""
    s.settimeout(seconds)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset, or TLS torn down without close_notify
        return True


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_slow_clients_beyond_the_cap_displace_the_oldest_and_threads_stay_bounded(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    baseline = threading.active_count()
    slow = []
    for _ in range(3 * CAP):  # each announces a body and sends one byte of it
        slow.append(served.slow())
        assert served.server.connections <= CAP
    assert eventually(lambda: threading.active_count() - baseline <= CAP)
    # The oldest were closed to make room; the newest still hold their connections.
    assert closed_within(slow[0], 3) and closed_within(slow[CAP - 1], 3)
    assert served.rejected("evicted") >= 2 * CAP
    # A prompt review still gets its answer while the slow ones hold every connection.
    started = time.monotonic()
    assert post(served.port, REVIEW)[:2] == (200, b'{"got": %d}' % len(REVIEW))
    assert time.monotonic() - started < 5


def test_a_prompt_review_is_answered_while_slow_clients_hold_every_connection(
    serve: Callable[..., Served],
) -> None:
    served = serve(Limits(max_connections=CAP, request_deadline_s=30, idle_timeout_s=30, max_body=1024))
    slow = [served.slow() for _ in range(CAP)]
    assert eventually(lambda: served.server.connections == CAP)
    for _ in range(3):  # over and over: each displaces the connection waiting longest on its client
        assert post(served.port, REVIEW)[0] == 200
        assert eventually(lambda: served.server.connections < CAP)  # the review's connection closed
        slow.append(served.slow())  # and the slow clients take every connection again
        assert served.server.connections <= CAP
    assert all(closed_within(s, 3) for s in slow[:3])
    assert not closed_within(slow[3], 0.2)  # one slow client keeps its connection: no blanket reset


def test_a_request_trickled_past_its_deadline_is_closed(serve: Callable[..., Served]) -> None:
    served = serve()
    s = served.slow(announce=100, sent=b"")
    started = time.monotonic()
    closed = False
    while not closed and time.monotonic() - started < 5:
        try:
            s.send(b" ")  # one byte every 50 ms: no single read ever waits long
        except OSError:
            closed = True
            break
        closed = closed_within(s, 0.05)
    assert closed
    assert time.monotonic() - started < 3  # the 0.6 s deadline, not a per-read timeout reset by each byte
    assert served.rejected("deadline") == 1


def test_a_silent_connection_is_closed_at_the_deadline_handshake_included(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    served.clients.append(raw)
    assert closed_within(raw, 3)  # never sent a ClientHello


def test_a_body_above_the_default_limit_is_refused_413_without_being_read(
    serve: Callable[..., Served],
) -> None:
    served = serve(LIMITS)
    assert LIMITS.max_body < 5 * 1024 * 1024
    s = served.tls()
    s.sendall(head(5 * 1024 * 1024))  # announces 5 MiB, sends none of it
    s.settimeout(5)
    got = s.recv(4096)
    assert got.startswith(b"HTTP/1.1 413"), got[:80]
    assert served.rejected("body_too_large") == 1


def test_request_headers_beyond_their_budget_are_refused_431(serve: Callable[..., Served]) -> None:
    served = serve()
    s = served.tls()
    s.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 1000 + b"\r\n" * 1)
    for _ in range(10):
        s.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
    s.settimeout(5)
    assert s.recv(4096).startswith(b"HTTP/1.1 431")
    assert served.rejected("headers_too_large") == 1


def test_bodies_beyond_the_budget_are_shed_503_and_slow_senders_give_way(
    serve: Callable[..., Served],
) -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def blocking(body: bytes) -> tuple[int, bytes]:
        entered.release()
        gate.wait(10)
        return echo(body)

    served = serve(handler=blocking)
    # Two slow senders announcing 64 KiB each hold the whole 128 KiB budget...
    slow = [served.slow(announce=64 * 1024) for _ in range(2)]
    assert eventually(lambda: served.server._server.connections.reserved == 128 * 1024)
    # ...yet a complete 64 KiB review takes the place of the oldest of them.
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(post(served.port, b" " * 64 * 1024)[0]))
    worker.start()
    assert entered.acquire(timeout=5)
    assert closed_within(slow[0], 3)
    # With the budget held by reviews being answered, one more body is refused at once, unread.
    worker2 = threading.Thread(target=lambda: results.append(post(served.port, b" " * 64 * 1024)[0]))
    worker2.start()
    assert entered.acquire(timeout=5)  # the second slow sender gave way too
    status, body, headers = post(served.port, b" " * 1024, timeout=5)
    assert (status, headers.get("Retry-After")) == (503, "1"), body
    assert served.rejected("busy") == 1
    gate.set()
    worker.join(5)
    worker2.join(5)
    assert results == [200, 200]


def test_when_every_connection_is_being_answered_a_new_one_is_shed_at_once(
    serve: Callable[..., Served],
) -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def blocking(body: bytes) -> tuple[int, bytes]:
        entered.release()
        gate.wait(10)
        return echo(body)

    served = serve(handler=blocking)
    results: list[int] = []
    workers = [
        threading.Thread(target=lambda: results.append(post(served.port, REVIEW)[0])) for _ in range(CAP)
    ]
    for w in workers:
        w.start()
    for _ in range(CAP):
        assert entered.acquire(timeout=5)
    started = time.monotonic()
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    served.clients.append(raw)
    assert closed_within(raw, 3)
    assert time.monotonic() - started < 2  # shed, not queued
    assert served.rejected("capacity") == 1
    gate.set()
    for w in workers:
        w.join(5)
    assert results == [200] * CAP  # the reviews being answered were not touched
    assert post(served.port, REVIEW)[0] == 200


def test_a_kept_alive_connection_serves_several_reviews_and_ends_idle_without_counting(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    s = served.tls()
    s.settimeout(5)
    for _ in range(3):
        s.sendall(head(len(REVIEW)) + REVIEW)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        assert (resp.status, resp.read()) == (200, b'{"got": %d}' % len(REVIEW))
    assert closed_within(s, 3)  # idle past 0.6 s
    assert served.rejected("deadline") == served.rejected("evicted") == 0
