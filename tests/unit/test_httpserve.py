"""driver/httpserve.py, the metrics/liveness port of both processes, over real HTTP on 127.0.0.1:
/metrics, /healthz and /livez answer as documented, anything else is a 404, and each process's wrapper
(controller/runtime/health.py, kubeletplugin/agent/metrics.py) plugs in its own registry and health."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter

from controller.runtime.health import HealthServer
from driver.httpserve import LOOP_NAME, TEXT, ProbeServer
from driver.looprunner import LoopGroup, LoopRunner
from kubeletplugin.agent.metrics import MetricsServer, NodeMetrics


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


@pytest.fixture
def serve() -> Iterator[Callable[[ProbeServer], ProbeServer]]:
    servers: list[ProbeServer] = []

    def start(server: ProbeServer) -> ProbeServer:
        servers.append(server)
        server.start()
        return server

    yield start
    for s in servers:
        s.stop()


def test_endpoints_status_codes_and_content_types(serve: Callable[[ProbeServer], ProbeServer]) -> None:
    health = [(True, "ok   all fine\n")]
    scrapes: list[int] = []

    def metrics() -> bytes:
        scrapes.append(1)
        return b"m_total 3\n"

    server = serve(
        ProbeServer(
            "127.0.0.1",
            0,
            metrics=metrics,
            metrics_content_type="application/x-test",
            healthy=lambda: health[0],
        )
    )
    assert server.port > 0
    assert _get(server.port, "/metrics") == (200, "application/x-test", b"m_total 3\n")
    assert _get(server.port, "/metrics?name[]=x") == (200, "application/x-test", b"m_total 3\n")
    assert len(scrapes) == 2  # rendered per scrape, not cached
    assert _get(server.port, "/healthz") == (200, TEXT, b"ok   all fine\n")
    health[0] = (False, "FAIL loop x is stuck\n")
    assert _get(server.port, "/healthz") == (503, TEXT, b"FAIL loop x is stuck\n")
    assert _get(server.port, "/livez?verbose")[0] == 503
    assert _get(server.port, "/") == (404, TEXT, b"not found: try /metrics or /healthz\n")
    assert _get(server.port, "/metricsx")[0] == 404


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failing_request_does_not_end_the_endpoint(serve: Callable[[ProbeServer], ProbeServer]) -> None:
    calls: list[int] = []

    def healthy() -> tuple[bool, str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("health check blew up")
        return True, "ok\n"

    server = serve(
        ProbeServer("127.0.0.1", 0, metrics=lambda: b"", metrics_content_type=TEXT, healthy=healthy)
    )
    assert isinstance(server.runner, LoopRunner) and server.runner.name == LOOP_NAME
    status, _, body = _get(server.port, "/healthz")  # answered, not a dropped connection
    assert status == 500 and b"health check blew up" in body
    assert _get(server.port, "/healthz") == (200, TEXT, b"ok\n")
    assert server.runner.health().ok


def test_stop_releases_the_port(serve: Callable[[ProbeServer], ProbeServer]) -> None:
    server = ProbeServer(
        "127.0.0.1", 0, metrics=lambda: b"", metrics_content_type=TEXT, healthy=lambda: (True, "")
    )
    server.start()
    port = server.port
    server.stop()
    with pytest.raises(OSError):
        _get(port, "/healthz")
    again = serve(
        ProbeServer(
            "127.0.0.1", port, metrics=lambda: b"x", metrics_content_type=TEXT, healthy=lambda: (True, "")
        )
    )
    assert _get(again.port, "/metrics")[2] == b"x"


def test_controller_wrapper_serves_its_registry_and_loop_group(
    serve: Callable[[ProbeServer], ProbeServer],
) -> None:
    registry = CollectorRegistry()
    Counter("flexmig_test_things", "things", registry=registry).inc(2)
    loops = LoopGroup()
    server = serve(HealthServer(registry, "127.0.0.1", 0, loops))
    assert server.runner in loops.loops()  # the accept loop is one of the loops /healthz checks
    status, ctype, body = _get(server.port, "/metrics")
    assert status == 200 and ctype == CONTENT_TYPE_LATEST and b"flexmig_test_things_total 2.0" in body
    status, _, text = _get(server.port, "/healthz")
    assert status == 200 and b"loop metrics-http" in text


def test_plugin_wrapper_renders_node_metrics_and_counts_loop_errors(
    serve: Callable[[ProbeServer], ProbeServer],
) -> None:
    metrics = NodeMetrics()
    refreshed: list[int] = []
    metrics.add_refresher(lambda: refreshed.append(1))
    server = serve(MetricsServer(metrics, "127.0.0.1", 0, lambda: (False, "FAIL plugin not registered\n")))
    status, ctype, body = _get(server.port, "/metrics")
    assert status == 200 and ctype == CONTENT_TYPE_LATEST and b"flexmig_build_info" in body
    assert refreshed == [1]  # NodeMetrics.render ran its refreshers for the scrape
    assert _get(server.port, "/healthz") == (503, TEXT, b"FAIL plugin not registered\n")
    hook = server.runner._on_error  # what the accept loop calls when an iteration fails
    assert hook is not None
    hook(RuntimeError("accept failed"))
    assert metrics.registry.get_sample_value("flexmig_node_loop_errors_total", {"loop": "metrics-http"}) == 1


def test_a_failing_collector_or_check_answers_500_and_the_server_keeps_serving(
    serve: Callable[[ProbeServer], ProbeServer],
) -> None:
    def broken_metrics() -> bytes:
        raise RuntimeError("collector exploded")

    def broken_check() -> tuple[bool, str]:
        raise KeyError("loop")

    server = serve(
        ProbeServer("127.0.0.1", 0, metrics=broken_metrics, metrics_content_type=TEXT, healthy=broken_check)
    )
    status, ctype, body = _get(server.port, "/metrics")
    assert (status, ctype) == (500, TEXT) and b"RuntimeError: collector exploded" in body
    assert _get(server.port, "/healthz")[0] == 500
    assert _get(server.port, "/nothing")[0] == 404  # still serving after the failures


def test_an_idle_client_is_dropped_after_the_connection_timeout(
    serve: Callable[[ProbeServer], ProbeServer],
) -> None:
    import socket

    from driver.boundedhttp import Limits

    limits = Limits(max_connections=4, request_deadline_s=0.3, idle_timeout_s=0.3, poll_s=0.05)
    server = serve(
        ProbeServer(
            "127.0.0.1",
            0,
            metrics=lambda: b"",
            metrics_content_type=TEXT,
            healthy=lambda: (True, ""),
            limits=limits,
        )
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
        # Sends nothing: the server closes it after its deadline instead of holding a thread forever.
        assert idle.recv(1) == b""
