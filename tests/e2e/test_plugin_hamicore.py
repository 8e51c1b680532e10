"""A hami-core node's kubelet plugin against the real API server (contracts C1 and C2 of
docs/architecture.md).

One plugin process (node `hamicore-a`, hami-core through its nodeconfig entry with devicesplitcount 3:
H100-80GB and A100-40GB with MIG off, a second H100 with MIG on) publishes `gpu-<i>-shared` devices,
which the API server must accept with their consumable-capacity request policies, and prepares a claim
whose allocation (written through the status subresource, as an allocator would) names shares with a
shareID and consumedCapacity. Its CDI spec must carry the HAMi-core limits, the library mount and the
preload; unprepare removes what prepare made. MIG state is never touched.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from driver.nvml.sim.hardware import SKUS

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node
from .plugin_harness import ClaimFactory, Kubelet, NodeDir, PluginProcess, heartbeats, wait_slices

NODE = "hamicore-a"
NS = "plugin-hamicore"
HAMI_CLASS = "hami-core.gpu.flexmig.dev"
SPLIT = 3
MIG_CALLS = ("nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy")


class Env:
    def __init__(self, cp: ControlPlane) -> None:
        self.api = cp.api_client()
        self.nd = NodeDir.create(
            NODE,
            cp.kubeconfig,
            [
                SimGpuSpec("H100-80GB", mig_enabled=False),
                SimGpuSpec("A100-40GB", mig_enabled=False),
                SimGpuSpec("H100-80GB", mig_enabled=True),
            ],
        )
        self.claims = ClaimFactory(self.api, NS)
        self.library = self.nd.root / "host-lib" / "libvgpu.so"
        self.library.parent.mkdir()
        self.library.write_bytes(b"\x7fELF stand-in for HAMi-core's libvgpu.so")
        self.hami_dir = self.nd.root / "vgpu"
        node_config = self.nd.root / "nodeconfig.json"
        node_config.write_text(
            json.dumps(
                {"nodeconfig": [{"name": NODE, "operatingmode": "hami-core", "devicesplitcount": SPLIT}]}
            )
        )
        self.plugin = PluginProcess(
            self.nd,
            extra=[
                "--node-config",
                str(node_config),
                "--device-split-count",
                "7",  # the node's entry wins
                "--hami-core-library",
                str(self.library),
                "--hami-core-dir",
                str(self.hami_dir),
            ],
        ).wait_ready()
        self.kubelet = Kubelet(self.nd)


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    api = control_plane.api_client()
    create_ready_node(api, NODE)
    create_namespace(api, NS)
    e = Env(control_plane)
    with heartbeats(e.api, lambda: [NODE]):
        yield e
    e.kubelet.close()
    assert e.plugin.stop() == 0, e.plugin.log_text()[-3000:]
    e.nd.cleanup()


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def _metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of `name` whose labels include `labels`; None when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def test_shared_devices_accepted_by_the_api_server(env: Env) -> None:
    env.kubelet.register()
    slices = wait_slices(env.api, NODE, lambda s: bool(_devices(s)))
    devices = _devices(slices)
    # GPU 2 is in MIG mode: left out, never switched. No MIG or whole devices, no counters.
    assert set(devices) == {"gpu-0-shared", "gpu-1-shared"}
    assert not any(s["spec"].get("sharedCounters") for s in slices)
    h100 = devices["gpu-0-shared"]
    assert h100["allowMultipleAllocations"] is True
    assert h100["attributes"]["type"] == {"string": "hami-core"}
    assert h100["attributes"]["splitCount"] == {"int": SPLIT}
    # What the server stored is the request policy of contract C1, unchanged.
    memory = h100["capacity"]["memory"]
    assert memory["requestPolicy"]["default"] == memory["value"]
    assert memory["requestPolicy"]["validRange"] == {"min": "1Mi", "step": "1Mi"}
    assert h100["capacity"]["cores"] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }
    assert h100["capacity"]["shares"] == {
        "value": str(SPLIT),
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }
    metrics = env.plugin.metrics()
    assert _metric(metrics, "flexmig_hami_core_library_present", node=NODE) == 1.0


def test_prepare_and_unprepare_a_share(env: Env) -> None:
    share = str(uuid.uuid4())
    c = env.claims.create(
        "share",
        NODE,
        ["gpu-0-shared"],
        device_class=HAMI_CLASS,
        result_fields=[
            {"shareID": share, "consumedCapacity": {"memory": "8000Mi", "cores": "30", "shares": "1"}}
        ],
    )
    resp = env.kubelet.prepare([c])[c["uid"]]
    assert resp.error == "", resp.error
    assert [(d.device_name, list(d.cdi_device_ids)) for d in resp.devices] == [
        ("gpu-0-shared", [f"{DRIVER_NAME}/mig={c['uid']}-gpu-0-shared"])
    ]
    spec_path = env.nd.cdi_dir / f"{DRIVER_NAME}-{c['uid']}.json"
    spec = json.loads(spec_path.read_text())
    gpu_uuid = env.nd.admin().snapshot().gpus[0].uuid
    [device] = spec["devices"]
    assert device["containerEdits"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={gpu_uuid}",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8000m",
        "CUDA_DEVICE_SM_LIMIT_0=30",
    ]
    assert "/dev/nvidia0" in [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    claim_edits = spec["containerEdits"]
    assert "CUDA_DEVICE_SM_LIMIT=30" in claim_edits["env"]
    cache_env = f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/{c['uid']}/vgpu.cache"
    assert cache_env in claim_edits["env"]
    mounts = {m["containerPath"]: m for m in claim_edits["mounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["hostPath"] == str(env.library)
    assert "ro" in mounts["/usr/local/vgpu/libvgpu.so"]["options"]
    preload = Path(mounts["/etc/ld.so.preload"]["hostPath"])
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    cache_dir = Path(mounts[f"/usr/local/vgpu/claims/{c['uid']}"]["hostPath"])
    assert cache_dir.is_dir() and cache_dir.is_relative_to(env.hami_dir)

    # The status entry names the share, as the API server requires for a multi-allocatable device.
    [entry] = env.claims.claim("share")["status"]["devices"]
    assert (entry["device"], entry["shareID"]) == ("gpu-0-shared", share)
    assert entry["data"] == {"uuid": gpu_uuid, "memoryMiB": 8000, "cores": 30}
    metrics = env.plugin.metrics()
    assert _metric(metrics, "flexmig_node_shared_gpu_memory_mib_in_use", gpu="0") == 8000.0
    assert _metric(metrics, "flexmig_node_shared_gpu_shares_in_use", gpu="0") == 1.0

    again = env.kubelet.prepare([c])[c["uid"]]  # kubelet retries: same answer
    assert again.error == "" and [d.device_name for d in again.devices] == ["gpu-0-shared"]

    assert env.kubelet.unprepare([c]) == {c["uid"]: ""}
    assert not spec_path.exists() and not cache_dir.exists()
    assert _metric(env.plugin.metrics(), "flexmig_node_shared_gpu_shares_in_use", gpu="0") is None
    counts = env.nd.admin().call_counts()
    assert {name: counts.get(name, 0) for name in MIG_CALLS} == dict.fromkeys(MIG_CALLS, 0)
    assert env.nd.admin().snapshot().gpus[2].mig_current is True
    env.claims.delete("share")


def test_default_share_and_mig_device_refused(env: Env) -> None:
    # No consumedCapacity: the whole device's default request (all memory, no SM limit).
    c = env.claims.create(
        "whole-share",
        NODE,
        ["gpu-1-shared"],
        device_class=HAMI_CLASS,
        result_fields=[{"shareID": str(uuid.uuid4())}],
    )
    resp = env.kubelet.prepare([c])[c["uid"]]
    assert resp.error == "", resp.error
    spec = json.loads((env.nd.cdi_dir / f"{DRIVER_NAME}-{c['uid']}.json").read_text())
    total = SKUS["A100-40GB"].memory_total_mib
    assert spec["devices"][0]["containerEdits"]["env"][1:] == [f"CUDA_DEVICE_MEMORY_LIMIT_0={total}m"]
    assert not any("SM_LIMIT" in e for e in spec["containerEdits"]["env"])
    assert env.kubelet.unprepare([c]) == {c["uid"]: ""}
    env.claims.delete("whole-share")

    # A MIG device name is not published on a hami-core node: refused, nothing created.
    bad = env.claims.create("mig-on-hami", NODE, ["gpu-0-mig-1g10gb-19-0"])
    error = env.kubelet.prepare([bad])[bad["uid"]].error
    assert "not published by node hamicore-a" in error
    assert env.nd.admin().snapshot().gpus[0].gpu_instances == ()
    env.claims.delete("mig-on-hami")
