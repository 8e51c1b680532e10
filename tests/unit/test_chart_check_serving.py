"""The chart's `helm test` script (deployments/helm/flexmig/files/check_serving.py) against real servers.

The script runs in the test pod; here its parts run against real local HTTP and HTTPS servers (the
HTTPS one with a CA and certificate made by the controller's own certificate code), so what it
accepts and refuses is what it would accept and refuse in the cluster.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import importlib.util
import ssl
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from controller.webhook.certs import generate

SCRIPT = Path(__file__).resolve().parents[2] / "deployments/helm/flexmig/files/check_serving.py"


@pytest.fixture(scope="module")
def cs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_serving", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_serving"] = mod  # dataclasses look their module up while decorating
    spec.loader.exec_module(mod)
    return mod


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(routes: dict[str, tuple[int, bytes]], tls: ssl.SSLContext | None = None) -> Iterator[int]:
    handler = type("H", (_Handler,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def plain() -> Iterator[int]:
    yield from _serve(
        {"/healthz": (200, b"ok\n"), "/metrics": (200, b'flexmig_build_info{version="0.1.0"} 1\n')}
    )


@pytest.fixture
def sick() -> Iterator[int]:
    yield from _serve(
        {"/healthz": (503, b"loop publisher is stuck\n"), "/metrics": (200, b"other_metric 1\n")}
    )


def _pod(name: str, ip: str | None, ready: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name}, "spec": {"nodeName": f"node-{name}"}, "status": status}


def test_pod_probes_cover_every_ready_pod_and_name_the_others(cs: ModuleType) -> None:
    ds = {"metadata": {"name": "flexmig-kubelet-plugin"}, "status": {"desiredNumberScheduled": 3}}
    plan = cs.pod_probes(
        "DaemonSet", ds, [_pod("a", "10.0.0.1"), _pod("b", "10.0.0.2", ready=False)], 31992, "/healthz", ""
    )
    assert [p.url for p in plan.probes] == ["http://10.0.0.1:31992/healthz"]
    assert plan.problems == [
        "DaemonSet flexmig-kubelet-plugin: 2 of 3 pods exist",
        "DaemonSet flexmig-kubelet-plugin: pod b (node-b) is not Ready",
    ]
    empty = cs.pod_probes("DaemonSet", {"metadata": {"name": "p"}, "status": {}}, [], 1, "/healthz", "")
    assert empty.problems == [
        "DaemonSet p: runs no pod (no node matches the plugin's node affinity or nodeSelector)"
    ]
    v6 = cs.pod_probes(
        "Deployment",
        {"metadata": {"name": "c"}, "spec": {"replicas": 1}},
        [_pod("c", "fd00::1")],
        31993,
        "/metrics",
        "x",
    )
    assert v6.probes[0].url == "http://[fd00::1]:31993/metrics"


def test_fetch_needs_200_and_the_expected_body(cs: ModuleType, plain: int, sick: int) -> None:
    assert cs.fetch(cs.Probe("plugin", f"http://127.0.0.1:{plain}/healthz")) is None
    assert cs.fetch(cs.Probe("ctl", f"http://127.0.0.1:{plain}/metrics", "flexmig_build_info")) is None
    bad = cs.fetch(cs.Probe("plugin", f"http://127.0.0.1:{sick}/healthz")) or ""
    assert "answered 503" in bad and "stuck" in bad
    other = cs.fetch(cs.Probe("ctl", f"http://127.0.0.1:{sick}/metrics", "flexmig_build_info")) or ""
    assert "without 'flexmig_build_info'" in other


def test_webhook_probe_verifies_the_ca_and_host_of_the_configuration(cs: ModuleType, tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    bundle = generate(["localhost"], now)
    (tmp_path / "c.pem").write_bytes(bundle.cert_pem)
    (tmp_path / "k.pem").write_bytes(bundle.key_pem)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    for port in _serve({"/healthz": (200, b"ok\n")}, tls):
        config = {
            "metadata": {"name": "flexmig.gpu.flexmig.dev"},
            "webhooks": [
                {
                    "clientConfig": {
                        "url": f"https://localhost:{port}/mutate-pods",
                        "caBundle": base64.b64encode(bundle.ca_pem).decode(),
                    }
                }
            ],
        }
        probe = cs.webhook_probe(config)
        assert probe.url == f"https://localhost:{port}/healthz"
        assert cs.fetch(probe) is None
        # Another CA (a stale caBundle): refused like the API server would refuse it.
        other = generate(["localhost"], now)
        assert "CERTIFICATE_VERIFY_FAILED" in (cs.fetch(cs.Probe("w", probe.url, "ok", other.ca_pem)) or "")
        # A name the certificate does not carry.
        assert "failed" in (
            cs.fetch(cs.Probe("w", f"https://127.0.0.1:{port}/healthz", "ok", bundle.ca_pem)) or ""
        )
    svc = {
        "metadata": {"name": "x"},
        "webhooks": [
            {
                "clientConfig": {
                    "service": {"name": "flexmig-webhook", "namespace": "ns", "port": 443},
                    "caBundle": "Zm9v",
                }
            }
        ],
    }
    assert cs.webhook_probe(svc).url == "https://flexmig-webhook.ns.svc:443/healthz"
    unpatched = {
        "metadata": {"name": "x"},
        "webhooks": [{"clientConfig": {"service": {"name": "s", "namespace": "n"}}}],
    }
    assert "caBundle is empty" in cs.webhook_probe(unpatched)


def test_check_retries_until_the_deadline_and_reports_the_last_round(
    cs: ModuleType, plain: int, sick: int
) -> None:
    rounds = [
        cs.Plan(problems=["DaemonSet p: runs no pod"]),
        cs.Plan(probes=[cs.Probe("p", f"http://127.0.0.1:{plain}/healthz")]),
    ]
    slept: list[float] = []
    assert cs.check(lambda: rounds.pop(0), 60, slept.append) == []
    assert len(slept) == 1
    failing = cs.check(
        lambda: cs.Plan(probes=[cs.Probe("p", f"http://127.0.0.1:{sick}/healthz")]), 0, slept.append
    )
    assert len(failing) == 1 and "answered 503" in failing[0]
