"""Defect 3 (node): every background loop survives any exception with backoff, and /healthz reports a
dead or stuck loop. The publisher talks to a real TCP endpoint that drops every request, so the
kubernetes client raises what it raises when the API server is down (urllib3's MaxRetryError after
its own retries), not an exception the test made up."""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client as k8s
from sim_node import FakeApi, make_node

from api.constants import DRIVER_NAME
from driver.looprunner import LoopRunner
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.agent.main import NodeAgent
from kubeletplugin.agent.metrics import MetricsServer, NodeMetrics
from kubeletplugin.grpcserver import ClaimRef, PluginServers
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.publish.publisher import SlicePublisher
from kubeletplugin.publish.slices import NodeSlices
from kubeletplugin.settings.config import add_flags, load_config


class DroppingServer:
    """Accepts TCP connections, reads the request, closes without answering; counts requests."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.requests = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    if conn.recv(4096):
                        self.requests += 1
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def dropping() -> Iterator[DroppingServer]:
    server = DroppingServer()
    yield server
    server.close()


def _wait(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_publisher_survives_max_retry_errors(dropping: DroppingServer) -> None:
    config = k8s.Configuration(host=dropping.url)
    api_client = k8s.ApiClient(config)
    metrics = NodeMetrics()
    publisher = SlicePublisher(api_client, "n1", lambda gen: NodeSlices((), ()), metrics)
    publisher.start()
    try:
        # One sync = the client's own retries (a few requests), then MaxRetryError. A publisher whose
        # thread died on the first one stops there; a surviving loop keeps trying with backoff.
        assert _wait(lambda: dropping.requests >= 1, 10)
        first_call = _wait(lambda: publisher.runner.failures >= 1, 10)
        assert first_call
        after_first = dropping.requests
        assert _wait(lambda: dropping.requests > after_first and publisher.runner.failures >= 3, 20), (
            f"publisher stopped retrying after {dropping.requests} requests"
        )
        health = publisher.runner.health()
        assert health.ok and "retrying after" in health.reason
        assert "MaxRetryError" in publisher.runner.last_error
        assert metrics.registry.get_sample_value(
            "flexmig_node_loop_errors_total", {"loop": "slice-publisher"}
        ) == float(publisher.runner.failures)
    finally:
        publisher.stop()
        api_client.close()


def _agent(tmp_path: Path) -> NodeAgent:
    boot = tmp_path / "boot_id"
    boot.write_text("b\n")
    sim = tmp_path / "sim.json"
    sim.write_text("{}")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        [
            *("--node-name", "n1", "--boot-id-path", str(boot), "--nvml", f"sim:{sim}"),
            *("--registry-dir", str(tmp_path / "reg"), "--plugins-dir", str(tmp_path / "plugins")),
        ]
    )
    return NodeAgent(load_config(args, env={}))


def test_healthz_is_503_naming_a_dead_loop(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.servers = PluginServers(object(), registry_dir=tmp_path / "reg", plugins_dir=tmp_path / "plugins")  # type: ignore[arg-type]

    def dies() -> None:
        raise SystemExit("a BaseException no loop can retry")

    healthy = LoopRunner("healthy-loop", lambda: None, interval_s=0.05)
    dead = LoopRunner("doomed-loop", dies)
    agent.loops.add(healthy)
    agent.loops.add(dead)
    healthy.start()

    def run_until_it_dies() -> None:
        # The thread ends as a loop thread would; only the loop's health may tell.
        with contextlib.suppress(SystemExit):
            dead.run()

    thread = threading.Thread(target=run_until_it_dies)
    thread.start()
    thread.join(5)
    server = MetricsServer(agent.metrics, "127.0.0.1", 0, agent.healthy)
    server.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
        assert err.value.code == 503
        body = err.value.read().decode()
        assert "loop doomed-loop is dead" in body and "loop healthy-loop ok" in body
    finally:
        healthy.stop()
        server.stop()


def test_healthz_is_503_naming_a_stuck_loop(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.servers = PluginServers(object(), registry_dir=tmp_path / "reg", plugins_dir=tmp_path / "plugins")  # type: ignore[arg-type]
    release = threading.Event()
    stuck = LoopRunner("wedged-loop", lambda: bool(release.wait(10)) and None, stuck_after_s=0.2)
    agent.loops.add(stuck)
    stuck.start()
    try:
        assert _wait(lambda: not agent.healthy()[0], 5)
        _, text = agent.healthy()
        assert "loop wedged-loop is stuck" in text
    finally:
        release.set()
        stuck.stop()


class UnreachableApi(FakeApi):
    """What KubeClaimApi raises while the API server is down."""

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        raise urllib3.exceptions.MaxRetryError(None, f"/apis/resource.k8s.io/v1/{name}", "refused")  # type: ignore[arg-type]


def test_startup_reconcile_keeps_claims_while_the_api_server_is_unreachable(tmp_path: Path) -> None:
    api = FakeApi()
    node = make_node(tmp_path, "n1", [SimGpuSpec("A100-40GB")], api=api)
    try:
        uid = "00000000-0000-4000-8000-000000000001"
        dev = AllocatedDevice("gpu", DRIVER_NAME, "n1", "gpu-0-mig-1g5gb-19-3")
        api.claims[("ns", "c")] = ClaimView("ns", "c", uid, (dev,), (PodRef("ns", "c", "pod-1"),))
        assert node.preparer.prepare([ClaimRef("ns", uid, "c")])[uid].error == ""
        down = UnreachableApi()
        report = node.reconcile(api=down)
        assert report.adopted == [uid] and report.released == []
        assert len(node.admin.snapshot().gpus[0].gpu_instances) == 1
    finally:
        node.preparer.close()
