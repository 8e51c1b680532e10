"""Node config honoured end to end: filtered GPUs are never published and never prepared."""

from __future__ import annotations

import json

from driver.nvml.sim import SimGpuSpec

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node
from .plugin_harness import (
    ClaimFactory,
    Kubelet,
    NodeDir,
    PluginProcess,
    ensure_device_class,
    instances,
    wait_slices,
)

NODE = "plugin-filtered"
NS = "plugin-config"


def test_filterdevices_hides_gpu_from_slices_and_prepare(control_plane: ControlPlane) -> None:
    api = control_plane.api_client()
    create_ready_node(api, NODE)
    create_namespace(api, NS)
    ensure_device_class(api)
    nd = NodeDir.create(NODE, control_plane.kubeconfig, [SimGpuSpec("H100-80GB"), SimGpuSpec("H100-80GB")])
    config = nd.root / "config.json"
    config.write_text(
        json.dumps({"nodeconfig": [{"name": NODE, "operatingmode": "mig", "filterdevices": {"index": [1]}}]})
    )
    # --operating-mode hami-core: the node's own entry must win over the default.
    plugin = PluginProcess(
        nd, extra=["--node-config", str(config), "--operating-mode", "hami-core"]
    ).wait_ready()
    kubelet = Kubelet(nd)
    try:
        kubelet.register()
        slices = wait_slices(api, NODE, lambda s: True)
        names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
        assert "gpu-0" in names and "gpu-0-mig-1g10gb-19-0" in names
        assert not any(n.startswith("gpu-1") for n in names)

        claims = ClaimFactory(api, NS)
        c = claims.create("hidden", NODE, ["gpu-1-mig-1g10gb-19-0"])
        assert "not published" in kubelet.prepare([c])[c["uid"]].error
        assert instances(nd) == []
        whole = claims.create("whole", NODE, ["gpu-0"])
        resp = kubelet.prepare([whole])[whole["uid"]]
        assert resp.error == "" and resp.devices[0].cdi_device_ids == [
            f"gpu.flexmig.dev/mig={whole['uid']}-gpu-0"
        ]
        assert claims.claim("whole")["status"]["devices"][0]["data"]["uuid"].startswith("GPU-")
        assert nd.admin().snapshot().gpus[0].mig_current is False  # whole GPU: MIG stays off
        assert kubelet.unprepare([whole]) == {whole["uid"]: ""}
    finally:
        kubelet.close()
        assert plugin.stop() == 0
        nd.cleanup()
