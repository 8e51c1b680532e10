"""Crash matrix: kill -9 the plugin process at each step of prepare and unprepare, restart, converge.

The plugin is started with `FLEXMIG_CRASHPOINTS=<point>` (fault injection, kubeletplugin/agent/crashpoints.py):
at that step it writes a marker file and blocks; the test then sends a real SIGKILL. A fresh plugin
process on the same simulator state, checkpoint and CDI dir must then converge: no leaked GI/CI, every
claim's instances exist exactly once, and kubelet's retried call succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec, open_sim

from .cluster import ControlPlane, wait_until
from .k8sobjects import create_namespace, create_ready_node
from .plugin_harness import (
    ClaimFactory,
    Kubelet,
    NodeDir,
    PluginProcess,
    ensure_device_class,
    heartbeats,
    instances,
)

NS = "plugin-crash"
DEVICES = ["gpu-0-mig-1g5gb-19-3", "gpu-1-mig-1g10gb-19-0"]  # A100-40GB (MIG on) + H100-80GB
EXPECTED = [(0, 19, 3, 1, (0,)), (1, 19, 0, 1, (0,))]
PREPARE_POINTS = [
    "after-gi-create",
    "after-ci-create",
    "after-cdi-write",
    "before-checkpoint-commit",
    "after-checkpoint-commit",
]
UNPREPARE_POINTS = ["mid-destroy", "before-checkpoint-remove"]

_nodes: list[str] = []


class Ctx:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.api = cp.api_client()
        self.claims = ClaimFactory(self.api, NS)
        self.pool = ThreadPoolExecutor(max_workers=2)

    def node(self, name: str) -> NodeDir:
        create_ready_node(self.api, name)
        _nodes.append(name)
        return NodeDir.create(name, self.cp.kubeconfig, [SimGpuSpec("A100-40GB"), SimGpuSpec("H100-80GB")])


@pytest.fixture(scope="module")
def ctx(control_plane: ControlPlane) -> Iterator[Ctx]:
    c = Ctx(control_plane)
    create_namespace(c.api, NS)
    ensure_device_class(c.api)
    with heartbeats(c.api, lambda: list(_nodes)):
        yield c
    c.pool.shutdown(wait=False, cancel_futures=True)


def _start(nd: NodeDir, crashpoint: str | None = None) -> tuple[PluginProcess, Kubelet]:
    env = {"FLEXMIG_CRASHPOINTS": crashpoint} if crashpoint else None
    plugin = PluginProcess(nd, env=env).wait_ready()
    kubelet = Kubelet(nd)
    kubelet.register()
    return plugin, kubelet


def _kill_at_marker(
    nd: NodeDir, plugin: PluginProcess, kubelet: Kubelet, call: Future[Any], point: str
) -> None:
    wait_until(lambda: nd.marker.exists(), 30, f"crashpoint {point}")
    assert nd.marker.read_text().strip() == point
    plugin.kill9()
    with pytest.raises(grpc.RpcError):
        call.result(timeout=30)
    kubelet.close()
    nd.marker.unlink()


def _checkpoint_claims(nd: NodeDir) -> dict[str, Any]:
    claims: dict[str, Any] = json.loads(nd.checkpoint.read_text())["claims"]
    return claims


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_kill_during_prepare_converges(ctx: Ctx, point: str) -> None:
    nd = ctx.node(f"crash-{point}")
    claim = ctx.claims.create(point, nd.node, DEVICES)
    plugin, kubelet = _start(nd, point)
    call = ctx.pool.submit(kubelet.prepare, [claim])
    _kill_at_marker(nd, plugin, kubelet, call, point)
    assert instances(nd) != []  # the crash left something behind on the GPUs

    plugin, kubelet = _start(nd)
    resp = kubelet.prepare([claim])[claim["uid"]]
    assert resp.error == ""
    assert [d.device_name for d in resp.devices] == DEVICES
    assert instances(nd) == EXPECTED  # exactly once each, nothing leaked
    assert _checkpoint_claims(nd)[claim["uid"]]["state"] == "PrepareCompleted"
    spec = json.loads((nd.cdi_dir / f"{DRIVER_NAME}-{claim['uid']}.json").read_text())
    snap = nd.admin().snapshot()
    uuids = {gi.compute_instances[0].mig_uuid for g in snap.gpus for gi in g.gpu_instances}
    visible = {e.split("=", 1)[1] for d in spec["devices"] for e in d["containerEdits"]["env"]}
    assert (
        len(visible) == 1 and set(visible.pop().split(",")) == uuids
    )  # every device names the claim's UUIDs
    status = ctx.claims.claim(point)["status"]["devices"]
    assert {d["data"]["migUUID"] for d in status} == uuids
    if point == "after-checkpoint-commit":
        assert "interrupted prepare rolled back" not in plugin.log_text()  # adopted, not redone
    else:
        assert "interrupted prepare rolled back" in plugin.log_text()

    again = kubelet.prepare([claim])[claim["uid"]]
    assert [(d.device_name, list(d.cdi_device_ids)) for d in again.devices] == [
        (d.device_name, list(d.cdi_device_ids)) for d in resp.devices
    ]
    assert kubelet.unprepare([claim]) == {claim["uid"]: ""}
    assert instances(nd) == []
    assert nd.admin().snapshot().gpus[1].mig_current is False
    kubelet.close()
    assert plugin.stop() == 0
    ctx.claims.delete(point)
    nd.cleanup()


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_kill_during_unprepare_converges(ctx: Ctx, point: str) -> None:
    nd = ctx.node(f"crash-{point}")
    claim = ctx.claims.create(point, nd.node, DEVICES)
    plugin, kubelet = _start(nd, point)
    assert kubelet.prepare([claim])[claim["uid"]].error == ""
    call = ctx.pool.submit(kubelet.unprepare, [claim])
    _kill_at_marker(nd, plugin, kubelet, call, point)

    plugin, kubelet = _start(nd)
    assert kubelet.unprepare([claim]) == {claim["uid"]: ""}
    assert instances(nd) == []
    assert _checkpoint_claims(nd) == {}
    assert not (nd.cdi_dir / f"{DRIVER_NAME}-{claim['uid']}.json").exists()
    # The claim can be prepared again from scratch, once.
    assert kubelet.prepare([claim])[claim["uid"]].error == ""
    assert instances(nd) == EXPECTED
    assert kubelet.unprepare([claim]) == {claim["uid"]: ""}
    kubelet.close()
    assert plugin.stop() == 0
    ctx.claims.delete(point)
    nd.cleanup()


def test_reboot_discards_checkpoint(ctx: Ctx) -> None:
    nd = ctx.node("crash-reboot")
    claim = ctx.claims.create("reboot", nd.node, DEVICES)
    plugin, kubelet = _start(nd)
    assert kubelet.prepare([claim])[claim["uid"]].error == ""
    plugin.kill9()
    kubelet.close()
    nd.admin().reboot()
    nd.set_boot_id("a-new-boot")
    plugin, kubelet = _start(nd)
    assert "node rebooted since the checkpoint was written" in plugin.log_text()
    assert instances(nd) == []
    assert kubelet.prepare([claim])[claim["uid"]].error == ""
    assert instances(nd) == EXPECTED
    assert kubelet.unprepare([claim]) == {claim["uid"]: ""}
    kubelet.close()
    assert plugin.stop() == 0
    ctx.claims.delete("reboot")
    nd.cleanup()


def test_orphans_foreign_reported_ours_destroyed(ctx: Ctx) -> None:
    nd = ctx.node("crash-orphans")
    # An instance someone else made (an administrator, another tool) before the plugin starts.
    nvml = open_sim(nd.sim_state)
    nvml.init()
    foreign = nvml.create_gpu_instance(0, 19, 5)
    nvml.create_compute_instance(0, foreign.gi_id)
    nvml.shutdown()

    gone = ctx.claims.create("gone", nd.node, DEVICES)
    plugin, kubelet = _start(nd)
    assert 'flexmig_node_orphan_instances_total{action="reported"} 1.0' in plugin.metrics()
    blocked = ctx.claims.create("blocked", nd.node, ["gpu-0-mig-1g5gb-19-5"])
    error = kubelet.prepare([blocked])[blocked["uid"]].error
    assert "did not create" in error
    assert kubelet.prepare([gone])[gone["uid"]].error == ""
    plugin.kill9()
    kubelet.close()

    # While the plugin is down the claim is deleted: its instances now belong to nobody.
    ctx.claims.delete("gone")
    wait_until(
        lambda: (
            not any(
                c.metadata.name == "gone"
                for c in ctx.claims.resource.list_namespaced_resource_claim(NS).items
            )
        ),
        30,
        "claim deleted",
    )
    plugin, kubelet = _start(nd)
    metrics = plugin.metrics()
    assert 'flexmig_node_orphan_instances_total{action="destroyed"} 2.0' in metrics
    assert 'flexmig_node_orphan_instances_total{action="reported"} 1.0' in metrics
    assert instances(nd) == [(0, 19, 5, 1, (0,))]  # only the foreign one, untouched
    kubelet.close()
    assert plugin.stop() == 0
    ctx.claims.delete("blocked")
    nd.cleanup()
