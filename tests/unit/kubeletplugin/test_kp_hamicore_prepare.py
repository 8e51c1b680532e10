"""Prepare/unprepare of HAMi-core shared GPUs through the real Preparer, on the NVML simulator.

The API is an in-memory stand-in (the e2e test runs the same path against a real API server); NVML is
the simulator, whose call counters prove that a shared prepare never touches MIG state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_node import MIG_MUTATIONS, FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.shared.capacity import SharedShare

NODE = "hami-node"
UID = "0b4c3a3e-9f5e-4c9e-8a59-1d2c3b4a5f60"
SHARE_A = "7d9c6c0e-2f4b-4b8e-9d71-5b7e8f0a1c23"
SHARE_B = "1f0e2d3c-4b5a-4697-8887-a6b5c4d3e2f1"


class SharedApi(FakeApi):
    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        raise AssertionError("a shared GPU has no MIG mirror annotation to write")


def _make_node(tmp_path: Path, specs: list[SimGpuSpec], library: bool) -> SimNode:
    return make_node(tmp_path, NODE, specs, api=SharedApi(), hami_library=library)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = _make_node(tmp_path, [SimGpuSpec("H100-80GB", mig_enabled=False)] * 2, library=True)
    yield n
    n.preparer.close()


def _claim(api: FakeApi, *results: AllocatedDevice, uid: str = UID, name: str = "c") -> ClaimRef:
    api.claims[("ns", name)] = ClaimView("ns", name, uid, tuple(results), (PodRef("ns", "p", "pod-uid"),))
    return ClaimRef(namespace="ns", uid=uid, name=name)


def _shared(gpu: int, share: str | None, **consumed: str) -> AllocatedDevice:
    return AllocatedDevice("gpus", DRIVER_NAME, NODE, f"gpu-{gpu}-shared", share, consumed)


def test_prepare_unprepare_two_shared_gpus(node: SimNode) -> None:
    ref = _claim(node.api, _shared(0, SHARE_A, memory="8000Mi", cores="30", shares="1"), _shared(1, SHARE_B))
    result = node.preparer.prepare([ref])[UID]
    assert result.error == ""
    assert [(d.device_name, d.cdi_device_ids) for d in result.devices] == [
        (f"gpu-{i}-shared", [f"{DRIVER_NAME}/mig={UID}-gpu-{i}-shared"]) for i in (0, 1)
    ]
    spec = node.spec(UID)
    env = {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]}
    uuid0, uuid1 = node.nvml.gpu(0).uuid, node.nvml.gpu(1).uuid
    assert env[f"{UID}-gpu-0-shared"] == [
        f"NVIDIA_VISIBLE_DEVICES={uuid0},{uuid1}",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8000m",
        "CUDA_DEVICE_SM_LIMIT_0=30",
    ]
    # No consumedCapacity: the whole GPU's memory, no SM limit of its own (100 beside a limited one).
    total = node.nvml.gpu(1).memory_total_mib
    assert env[f"{UID}-gpu-1-shared"] == [
        f"NVIDIA_VISIBLE_DEVICES={uuid0},{uuid1}",
        f"CUDA_DEVICE_MEMORY_LIMIT_1={total}m",
        "CUDA_DEVICE_SM_LIMIT_1=100",
    ]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"] == str(node.paths.library)
    assert Path(mounts["/etc/ld.so.preload"]).read_text() == "/usr/local/vgpu/libvgpu.so\n"
    cache_dir = Path(mounts[f"/usr/local/vgpu/claims/{UID}"])
    assert cache_dir.is_dir()
    assert "CUDA_DEVICE_SM_LIMIT=30" in spec["containerEdits"]["env"]

    entry = node.store.get_claim(UID)
    assert entry is not None and entry.state is ClaimState.PREPARE_COMPLETED
    rec0 = entry.device("gpu-0-shared")
    assert rec0 is not None and rec0.shares == (SharedShare(SHARE_A, 8000, 30, 1),)
    assert rec0.gi_id is None and not rec0.is_mig  # nothing realised through NVML
    assert node.api.status[UID][0] == {
        "driver": DRIVER_NAME,
        "pool": NODE,
        "device": "gpu-0-shared",
        "shareID": SHARE_A,
        "data": {"uuid": uuid0, "memoryMiB": 8000, "cores": 30},
    }
    assert node.gauge("flexmig_node_shared_gpu_shares_in_use", 0) == 1
    assert node.gauge("flexmig_node_shared_gpu_memory_mib_in_use", 0) == 8000
    assert node.gauge("flexmig_node_shared_gpu_cores_in_use", 0) == 30
    assert node.metrics.registry.get_sample_value("flexmig_hami_core_library_present", {"node": NODE}) == 1

    # Idempotent: the second prepare returns the same devices and keeps the live cache region.
    (cache_dir / "vgpu.cache").write_bytes(b"in use")
    again = node.preparer.prepare([ref])[UID]
    assert again.error == "" and [d.device_name for d in again.devices] == ["gpu-0-shared", "gpu-1-shared"]
    assert (cache_dir / "vgpu.cache").read_bytes() == b"in use"

    assert node.preparer.unprepare([ref]) == {UID: None}
    assert not (node.cdi_dir / f"{DRIVER_NAME}-{UID}.json").exists() and not cache_dir.exists()
    assert node.store.get_claim(UID) is None
    assert node.gauge("flexmig_node_shared_gpu_shares_in_use", 0) is None
    assert node.preparer.unprepare([ref]) == {UID: None}  # unknown claim: success
    assert node.mig_calls() == dict.fromkeys(MIG_MUTATIONS, 0)


def test_two_shares_of_one_gpu_add_up(node: SimNode) -> None:
    ref = _claim(node.api, _shared(0, SHARE_A, memory="1Gi", cores="20"), _shared(0, SHARE_B, memory="2Gi"))
    assert node.preparer.prepare([ref])[UID].error == ""
    [dev] = node.spec(UID)["devices"]
    assert dev["containerEdits"]["env"][1:] == [
        "CUDA_DEVICE_MEMORY_LIMIT_0=3072m",
        "CUDA_DEVICE_SM_LIMIT_0=20",
    ]
    assert [e["shareID"] for e in node.api.status[UID]] == [SHARE_A, SHARE_B]
    assert node.gauge("flexmig_node_shared_gpu_shares_in_use", 0) == 2


def test_bad_consumed_capacity_fails_cleanly(node: SimNode) -> None:
    ref = _claim(node.api, _shared(0, SHARE_A, memory="8000k"))
    error = node.preparer.prepare([ref])[UID].error
    assert "device gpu-0-shared share" in error and "consumedCapacity.memory '8000k'" in error
    assert node.store.get_claim(UID) is None and not node.cdi_dir.exists()


def test_mig_mode_on_is_refused_not_changed(tmp_path: Path) -> None:
    node = _make_node(tmp_path, [SimGpuSpec("H100-80GB", mig_enabled=True)], library=True)
    ref = _claim(node.api, _shared(0, SHARE_A, memory="1Gi"))
    error = node.preparer.prepare([ref])[UID].error
    assert "GPU 0" in error and "is in MIG mode" in error and "nvidia-smi -i 0 -mig 0" in error
    assert node.store.get_claim(UID) is None
    assert not (node.cdi_dir / f"{DRIVER_NAME}-{UID}.json").exists()
    assert not (node.paths.state_dir / "claims" / UID).exists()
    assert node.mig_calls() == dict.fromkeys(MIG_MUTATIONS, 0)
    assert node.admin.snapshot().gpus[0].mig_current is True
    node.preparer.close()


def test_library_absent_prepares_unenforced_and_says_so(tmp_path: Path) -> None:
    node = _make_node(tmp_path, [SimGpuSpec("A100-40GB", mig_enabled=False)], library=False)
    ref = _claim(node.api, _shared(0, SHARE_A, memory="4000Mi", cores="50"))
    assert node.preparer.prepare([ref])[UID].error == ""
    spec = node.spec(UID)
    assert spec["devices"][0]["containerEdits"]["env"][1:] == [
        "CUDA_DEVICE_MEMORY_LIMIT_0=4000m",
        "CUDA_DEVICE_SM_LIMIT_0=50",
    ]
    targets = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert "/usr/local/vgpu/libvgpu.so" not in targets and "/etc/ld.so.preload" not in targets
    assert node.metrics.registry.get_sample_value("flexmig_hami_core_library_present", {"node": NODE}) == 0
    assert not node.paths.preload_file.exists()
    # Installing the library later shows at the next scrape and takes effect without a restart.
    node.paths.library.parent.mkdir(parents=True)
    node.paths.library.write_bytes(b"\x7fELF")
    assert node.hami is not None
    node.metrics.add_refresher(node.hami.check)
    assert b'flexmig_hami_core_library_present{node="hami-node"} 1.0' in node.metrics.render()
    assert node.paths.preload_file.exists()
    other = _claim(
        node.api, _shared(0, SHARE_B, memory="1Mi"), uid="9e8d7c6b-5a49-4837-9261-504f3e2d1c0b", name="d"
    )
    assert node.preparer.prepare([other])[other.uid].error == ""
    assert node.metrics.registry.get_sample_value("flexmig_hami_core_library_present", {"node": NODE}) == 1
    assert node.paths.preload_file.exists()
    node.preparer.close()


def test_reconcile_rolls_back_shared_without_touching_mig(tmp_path: Path) -> None:
    # One H100 in MIG mode with no instance: a mig node would switch it off; a hami-core node must not.
    node = _make_node(
        tmp_path,
        [SimGpuSpec("H100-80GB", mig_enabled=False), SimGpuSpec("H100-80GB", mig_enabled=True)],
        library=True,
    )
    ref = _claim(node.api, _shared(0, SHARE_A, memory="1Gi"))
    assert node.preparer.prepare([ref])[UID].error == ""
    done = node.store.get_claim(UID)
    assert done is not None
    # A crash mid-prepare of another claim, and the first claim deleted while the plugin was down.
    node.store.put_claim(
        ClaimCheckpoint(
            "4c3b2a19-0817-4615-9413-121110090807", "ns", "gone", ClaimState.PREPARE_STARTED, done.devices
        )
    )
    del node.api.claims[("ns", "c")]
    report = node.reconcile(manage_mig_mode=False)
    assert sorted(report.rolled_back + report.released) == sorted(
        [UID, "4c3b2a19-0817-4615-9413-121110090807"]
    )
    assert report.destroyed_instances == 0 and report.errors == []
    assert node.store.load().claims == {}
    assert not (node.cdi_dir / f"{DRIVER_NAME}-{UID}.json").exists()
    assert not (node.paths.state_dir / "claims" / UID).exists()
    assert node.mig_calls() == dict.fromkeys(MIG_MUTATIONS, 0)
    assert node.admin.snapshot().gpus[1].mig_current is True
    node.preparer.close()
