"""The metrics/liveness port (driver/httpserve.py on driver/boundedhttp.py) against hostile clients,
over raw sockets on 127.0.0.1 with small limits: slow clients beyond the cap displace the oldest and
a probe is still answered, every connection busy sheds a new one with a quick 503, a request line
trickled past the deadline is closed, oversized headers get 431; each refusal reaches `on_reject`."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from driver.boundedhttp import Limits
from driver.httpserve import PROBE_LIMITS, TEXT, ProbeServer

CAP = 4
SMALL = Limits(
    max_connections=CAP, request_deadline_s=0.6, idle_timeout_s=0.6, max_header_bytes=2048, poll_s=0.05
)


class Probe:
    def __init__(self, healthy: Callable[[], tuple[bool, str]], limits: Limits) -> None:
        self.rejected: list[str] = []
        self.server = ProbeServer(
            "127.0.0.1",
            0,
            metrics=lambda: b"m 1\n",
            metrics_content_type=TEXT,
            healthy=healthy,
            limits=limits,
            on_reject=self.rejected.append,
        )
        self.port = self.server.port
        self.clients: list[socket.socket] = []

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.clients.append(s)
        return s

    def slow(self) -> socket.socket:
        """Sends half a request line and waits."""
        s = self.connect()
        s.sendall(b"GET /heal")
        return s


@pytest.fixture
def probe() -> Iterator[Callable[..., Probe]]:
    started: list[Probe] = []

    def start(
        healthy: Callable[[], tuple[bool, str]] = lambda: (True, "ok\n"), limits: Limits = SMALL
    ) -> Probe:
        p = Probe(healthy, limits)
        p.server.start()
        started.append(p)
        return p

    yield start
    for p in started:
        for c in p.clients:
            c.close()
        p.server.stop()


def get(port: int, path: str = "/healthz") -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.status, resp.read()


def closed_within(s: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing `s`, or None if it is still open after `seconds`."""
    s.settimeout(seconds)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except OSError:
        pass
    return got


def test_the_default_limits_bound_the_probe_port() -> None:
    assert PROBE_LIMITS.max_connections <= 64 and PROBE_LIMITS.request_deadline_s <= 30
    assert PROBE_LIMITS.max_body == 0  # GETs only: no body is ever read


def test_slow_clients_beyond_the_cap_displace_the_oldest_and_a_probe_is_answered(
    probe: Callable[..., Probe],
) -> None:
    p = probe(limits=Limits(max_connections=CAP, request_deadline_s=30, idle_timeout_s=30, poll_s=0.05))
    baseline = threading.active_count()
    slow = [p.slow() for _ in range(3 * CAP)]
    end = time.monotonic() + 5
    while threading.active_count() - baseline > CAP and time.monotonic() < end:
        time.sleep(0.02)  # displaced connections' threads are ending
    assert threading.active_count() - baseline <= CAP
    assert closed_within(slow[0], 3) is not None  # displaced: it was waiting longest
    started = time.monotonic()
    assert get(p.port) == (200, b"ok\n")
    assert time.monotonic() - started < 5
    assert p.rejected.count("evicted") >= 2 * CAP


def test_when_every_connection_is_being_answered_a_new_one_gets_a_quick_503(
    probe: Callable[..., Probe],
) -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def blocking() -> tuple[bool, str]:
        entered.release()
        gate.wait(10)
        return True, "ok\n"

    p = probe(blocking)
    results: list[tuple[int, bytes]] = []
    workers = [threading.Thread(target=lambda: results.append(get(p.port))) for _ in range(CAP)]
    for w in workers:
        w.start()
    for _ in range(CAP):
        assert entered.acquire(timeout=5)
    started = time.monotonic()
    got = closed_within(p.connect(), 3)
    assert got is not None and got.startswith(b"HTTP/1.1 503"), got
    assert b"Retry-After: 1" in got
    assert time.monotonic() - started < 2
    assert p.rejected == ["capacity"]
    gate.set()
    for w in workers:
        w.join(5)
    assert results == [(200, b"ok\n")] * CAP


def test_a_request_line_trickled_past_the_deadline_is_closed(probe: Callable[..., Probe]) -> None:
    p = probe()
    s = p.connect()
    started = time.monotonic()
    closed = False
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" * 10:  # a byte every 50 ms
        try:
            s.send(bytes([byte]))
        except OSError:
            closed = True
            break
        if closed_within(s, 0.05) is not None:
            closed = True
            break
    assert closed
    assert time.monotonic() - started < 3
    assert p.rejected == ["deadline"]


def test_headers_beyond_their_budget_are_refused_431(probe: Callable[..., Probe]) -> None:
    p = probe()
    s = p.connect()
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 3000 + b"\r\n\r\n")
    got = closed_within(s, 5)
    assert got is not None and got.startswith(b"HTTP/1.0 431"), got
    assert p.rejected == ["headers_too_large"]
    assert get(p.port) == (200, b"ok\n")


def test_each_process_counts_what_its_port_refused() -> None:
    from prometheus_client import CollectorRegistry

    from controller.runtime.health import HealthServer
    from driver.looprunner import LoopGroup
    from kubeletplugin.agent.metrics import MetricsServer, NodeMetrics

    registry, node = CollectorRegistry(), NodeMetrics()
    servers: list[ProbeServer] = [
        HealthServer(registry, "127.0.0.1", 0, LoopGroup()),
        MetricsServer(node, "127.0.0.1", 0, lambda: (True, "ok\n")),
    ]
    try:
        for server in servers:
            server.start()
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (PROBE_LIMITS.max_header_bytes + 1))
                got = closed_within(s, 5)
                assert got is not None and b" 431 " in got.split(b"\r\n")[0]
    finally:
        for server in servers:
            server.stop()
    labels = {"reason": "headers_too_large"}
    assert registry.get_sample_value("flexmig_controller_http_connections_rejected_total", labels) == 1
    assert node.registry.get_sample_value("flexmig_node_http_connections_rejected_total", labels) == 1
