"""Issue 21, points 1 and 4 at the transport: a write is sent once, its lost response is an unknown
outcome (never a failure), and no write outlives the leadership it was sent under.

The server here is a real HTTP server on 127.0.0.1 that applies a request and then cuts the connection
without answering, as a proxy or a dying API server does; the client is the `kubernetes` client's own
pool, as the controller uses it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

import controller.kube.leader as leader_mod
from controller.kube.leader import WRITE_SAFETY_S, LeaderElector
from controller.kube.outcome import Outcome, write_outcome
from controller.kube.rest import request
from controller.kube.writer import MIN_WRITE_BUDGET_S, WRITE_TIMEOUT_S, NotLeader, Writer


class _CutAfterApply(BaseHTTPRequestHandler):
    applied: dict[str, int]

    def _cut(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.applied[self.command] = self.applied.get(self.command, 0) + 1
        self.connection.shutdown(socket.SHUT_RDWR)  # applied; the response never leaves
        self.close_connection = True

    do_PUT = do_GET = do_POST = do_PATCH = _cut

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def cutting_server() -> Iterator[tuple[Any, dict[str, int]]]:
    applied: dict[str, int] = {}
    handler = type("Handler", (_CutAfterApply,), {"applied": applied})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield k8s.ApiClient(config), applied
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("method", ["PUT", "PATCH", "POST"])
def test_a_write_whose_response_is_lost_is_sent_once_and_its_outcome_unknown(
    cutting_server: tuple[Any, dict[str, int]], method: str
) -> None:
    api, applied = cutting_server
    with pytest.raises(Exception) as caught:
        request(api, method, "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x/status", {"a": 1})
    assert applied == {method: 1}, "the transport re-sent a write that had reached the server"
    assert write_outcome(caught.value) is Outcome.UNKNOWN


def test_a_read_is_retried(cutting_server: tuple[Any, dict[str, int]]) -> None:
    api, applied = cutting_server
    with pytest.raises(Exception):  # noqa: B017 - whichever error urllib3 ends with
        request(api, "GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x")
    assert applied["GET"] > 1


def test_a_write_that_never_connected_was_not_applied() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    api = k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}"))
    with pytest.raises(Exception) as caught:
        request(api, "PUT", "/api/v1/namespaces/ns/pods/p", {"a": 1}, timeout_s=2)
    assert write_outcome(caught.value) is Outcome.NOT_APPLIED


def test_each_write_is_bounded_by_the_leadership_left() -> None:
    sent: list[dict[str, Any]] = []

    def send(_api: Any, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        sent.append(kw)
        return {}

    budget = [3.0]
    writer = Writer(None, send=send, write_budget=lambda: budget[0])
    writer.event({"metadata": {"name": "p", "namespace": "ns"}}, "Pod", "Normal", "R", "m")
    assert sent[-1]["timeout_s"] == 3.0
    assert sent[-1]["query"] == [("timeout", "2800ms")]  # the server gives up first
    budget[0] = 60.0
    writer.event({"metadata": {"name": "p", "namespace": "ns"}}, "Pod", "Normal", "R", "m")
    assert sent[-1]["timeout_s"] == WRITE_TIMEOUT_S
    budget[0] = MIN_WRITE_BUDGET_S / 2
    with pytest.raises(NotLeader):
        writer.event({"metadata": {"name": "p", "namespace": "ns"}}, "Pod", "Normal", "R", "m")
    assert len(sent) == 2


def test_drain_waits_for_the_writes_in_flight() -> None:
    gate = threading.Event()

    def slow(_api: Any, method: str, path: str, body: Any = None, **_kw: Any) -> dict[str, Any]:
        gate.wait(5)
        return {}

    writer = Writer(None, send=slow)
    t = threading.Thread(
        target=writer.event, args=({"metadata": {"name": "p", "namespace": "ns"}}, "Pod", "Normal", "R", "m")
    )
    t.start()
    time.sleep(0.05)
    assert not writer.drain(0.1)
    gate.set()
    assert writer.drain(2)
    t.join()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_write_budget_ends_before_any_candidate_can_take_over(monkeypatch: pytest.MonkeyPatch) -> None:
    lease: dict[str, Any] = {}

    def api(_api: Any, method: str, path: str, body: Any = None, **_kw: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        if method == "GET":
            if not lease:
                raise ApiException(status=404)
            return dict(lease)
        lease.clear()
        lease.update(body)
        lease.setdefault("metadata", {})["resourceVersion"] = "1"
        return dict(lease)

    monkeypatch.setattr(leader_mod, "request", api)
    clock = _Clock()
    e = LeaderElector(None, "ns", "me", name="l", lease_s=15, renew_deadline_s=10, retry_s=2, clock=clock)
    assert e.write_budget() == 0.0
    e._round()
    assert e.is_leader()
    assert e.write_budget() == pytest.approx(15 - WRITE_SAFETY_S)
    clock.now += 9.9  # the last moment it still leads: what is left still ends before a takeover
    assert e.is_leader() and e.write_budget() == pytest.approx(15 - WRITE_SAFETY_S - 9.9)
    assert 9.9 + e.write_budget() < 15
    clock.now += 0.2
    assert not e.is_leader() and e.write_budget() == 0.0
    e._round()  # renewed
    e.resign(release=False)
    assert not e.is_leader() and e.write_budget() == 0.0
    e._round()  # a resigned elector never renews again
    assert not e.is_leader()
    e.release()  # and, told writes may be in flight, leaves the Lease to expire
    assert lease["spec"]["holderIdentity"] == "me"
    e.resign(release=True)
    e.release()
    assert lease["spec"]["holderIdentity"] is None
