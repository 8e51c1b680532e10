"""Defaults that deliver the mission (issue 13), on the real API server with the real plugin process.

- A node with no nodeconfig entry and the plugin's default mode (`auto`) publishes MIG devices for its
  MIG-capable GPUs (HAMi's `hami-core` default would publish none).
- A hami-core node whose HAMi-core library is missing withholds its shares by default, says so with a
  Warning event on its Node and `flexmig_node_hami_core_gpus{state="refused"}`; with
  `--unenforced-shares=publish` it publishes them marked `enforced: false`, again with an event.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from controller.kube.rest import request
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.kube.nodeevents import COMPONENT

from .cluster import ControlPlane, wait_until
from .k8sobjects import create_ready_node
from .plugin_harness import Kubelet, NodeDir, PluginProcess, metric_samples, node_slices, wait_slices


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def _node_events(api: Any, node: str) -> list[dict[str, Any]]:
    query = [("fieldSelector", f"involvedObject.kind=Node,involvedObject.name={node}")]
    items: list[dict[str, Any]] = request(api, "GET", "/api/v1/namespaces/default/events", query=query)[
        "items"
    ]
    # Only the plugin's own (kube-controller-manager posts RegisteredNode about every new Node).
    return [e for e in items if e.get("reportingComponent") == COMPONENT]


def _wait_event(api: Any, node: str, plugin: PluginProcess) -> None:
    try:
        wait_until(lambda: bool(_node_events(api, node)), 30, "the plugin's Node event")
    except Exception as exc:
        raise AssertionError(f"{exc}\nplugin log:\n{plugin.log_text()[-4000:]}") from None


def _state_gauge(metrics: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.labels["state"]: s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "flexmig_node_hami_core_gpus"
    }


def _run(
    cp: ControlPlane, node: str, gpus: list[SimGpuSpec], extra: list[str]
) -> tuple[NodeDir, PluginProcess, Kubelet, list[dict[str, Any]]]:
    api = cp.api_client()
    create_ready_node(api, node)
    nd = NodeDir.create(node, cp.kubeconfig, gpus)
    missing = nd.root / "no-hami-core" / "libvgpu.so"  # the HAMi-core library is not installed
    plugin = PluginProcess(
        nd,
        extra=[
            "--hami-core-library",
            str(missing),
            "--hami-core-dir",
            str(nd.root / "vgpu"),
            *extra,
        ],
    ).wait_ready()
    kubelet = Kubelet(nd)
    kubelet.register()
    return nd, plugin, kubelet, wait_slices(api, node, lambda s: True)


def _cleanup(cp: ControlPlane, node: str, nd: NodeDir, plugin: PluginProcess, kubelet: Kubelet) -> None:
    kubelet.close()
    assert plugin.stop() == 0
    nd.cleanup()
    api = cp.api_client()
    request(api, "DELETE", f"/api/v1/nodes/{node}")


def test_unlisted_node_gets_dynamic_mig_by_default(control_plane: ControlPlane) -> None:
    node = f"defaults-auto-{uuid.uuid4().hex[:6]}"
    # The harness passes --operating-mode=mig; `auto` is the flag's default (tests/unit checks that).
    nd, plugin, kubelet, slices = _run(
        control_plane, node, [SimGpuSpec("H100-80GB"), SimGpuSpec("A100-40GB", mig_enabled=True)],
        ["--operating-mode", "auto"],
    )  # fmt: skip
    try:
        names = set(_devices(slices))
        assert "gpu-0" in names and any(n.startswith("gpu-0-mig-") for n in names)
        assert any(n.startswith("gpu-1-mig-") for n in names)  # Ampere in MIG mode: MIG devices only
        assert not any(n.endswith("-shared") for n in names)
        assert _state_gauge(plugin.metrics()) == {"enforced": 0, "unenforced": 0, "refused": 0}
        assert _node_events(control_plane.api_client(), node) == []
    finally:
        _cleanup(control_plane, node, nd, plugin, kubelet)


def _config(nd: NodeDir, node: str) -> Path:
    path = nd.root / "config.json"
    path.write_text(json.dumps({"nodeconfig": [{"name": node, "operatingmode": "hami-core"}]}))
    return path


def test_hami_core_node_without_library_refuses_shares(control_plane: ControlPlane) -> None:
    node = f"defaults-refuse-{uuid.uuid4().hex[:6]}"
    gpus = [SimGpuSpec("H100-80GB", mig_enabled=False), SimGpuSpec("H100-80GB", mig_enabled=False)]
    api = control_plane.api_client()
    create_ready_node(api, node)
    nd = NodeDir.create(node, control_plane.kubeconfig, gpus)
    missing = nd.root / "no-hami-core" / "libvgpu.so"
    plugin = PluginProcess(
        nd,
        extra=["--node-config", str(_config(nd, node)), "--hami-core-library", str(missing),
               "--hami-core-dir", str(nd.root / "vgpu")],
    ).wait_ready()  # fmt: skip
    kubelet = Kubelet(nd)
    try:
        kubelet.register()
        _wait_event(api, node, plugin)
        [event] = _node_events(api, node)
        assert (event["type"], event["reason"]) == ("Warning", "HamiCoreSharesRefused")
        assert "[0, 1]" in event["message"] and str(missing) in event["message"]
        assert _state_gauge(plugin.metrics()) == {"enforced": 0, "unenforced": 0, "refused": 2}
        assert metric_samples(plugin.metrics(), "flexmig_hami_core_library_present") == []  # value 0
        # Nothing to publish: each GPU logged why, and no slice exists for the node.
        pubs = [e for e in plugin.events() if e.get("event") == "GPU publication"]
        assert [(e["gpu"], e["shared"], e["whole"]) for e in pubs] == [(0, False, False), (1, False, False)]
        assert all("HAMi-core library missing" in e["reason"] for e in pubs)
        assert node_slices(api, node) == []
    finally:
        _cleanup(control_plane, node, nd, plugin, kubelet)


def test_unenforced_shares_published_when_allowed(control_plane: ControlPlane) -> None:
    node = f"defaults-unenf-{uuid.uuid4().hex[:6]}"
    api = control_plane.api_client()
    create_ready_node(api, node)
    nd = NodeDir.create(node, control_plane.kubeconfig, [SimGpuSpec("H100-80GB", mig_enabled=False)])
    plugin = PluginProcess(
        nd,
        extra=["--node-config", str(_config(nd, node)), "--hami-core-library",
               str(nd.root / "none" / "libvgpu.so"), "--hami-core-dir", str(nd.root / "vgpu"),
               "--unenforced-shares", "publish"],
    ).wait_ready()  # fmt: skip
    kubelet = Kubelet(nd)
    try:
        kubelet.register()
        devices = _devices(wait_slices(api, node, lambda s: True))
        assert devices["gpu-0-shared"]["attributes"]["enforced"] == {"bool": False}
        _wait_event(api, node, plugin)
        [event] = _node_events(api, node)
        assert (event["type"], event["reason"]) == ("Warning", "HamiCoreSharesUnenforced")
        assert _state_gauge(plugin.metrics()) == {"enforced": 0, "unenforced": 1, "refused": 0}
    finally:
        _cleanup(control_plane, node, nd, plugin, kubelet)
