"""A shared GPU's share (consumedCapacity) and the HAMi-core CDI edits it becomes (contract C2,
docs/architecture.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver import cdi, hamicore
from driver.hamicore import HamiCorePaths, ShareLimit
from kubeletplugin.shared.capacity import (
    ConsumedCapacityError,
    SharedShare,
    parse_quantity,
    share_from_result,
)

GPU_MIB = 81559
UID = "0b4c3a3e-9f5e-4c9e-8a59-1d2c3b4a5f60"
SHARE = "7d9c6c0e-2f4b-4b8e-9d71-5b7e8f0a1c23"


@pytest.mark.parametrize(
    ("consumed", "memory", "cores"),
    [
        ({"memory": "8000Mi", "cores": "30", "shares": "1"}, 8000, 30),
        ({"memory": "8Gi", "cores": "0"}, 8192, 0),
        ({"memory": "8388608000"}, 8000, 0),  # plain bytes
        ({"gpu.flexmig.dev/memory": "1Mi", "gpu.flexmig.dev/cores": "100"}, 1, 100),
        ({"memory": "0.5Gi", "cores": "3e1"}, 512, 30),
        ({}, GPU_MIB, 0),  # no consumedCapacity: the whole device's default request
    ],
)
def test_share_from_result(consumed: dict[str, str], memory: int, cores: int) -> None:
    share = share_from_result("gpu-0-shared", SHARE, consumed, GPU_MIB)
    assert share == SharedShare(SHARE, memory, cores, 1)


def test_share_without_consumed_capacity_or_share_id() -> None:
    assert share_from_result("gpu-1-shared", None, None, 1024) == SharedShare(None, 1024, 0, 1)


@pytest.mark.parametrize(
    ("consumed", "needle"),
    [
        ({"memory": "lots"}, "consumedCapacity.memory: 'lots' is not a Kubernetes quantity"),
        ({"memory": "1000k"}, "consumedCapacity.memory '1000k' is not a whole number of MiB"),
        ({"memory": "0"}, "outside 1Mi..81559Mi"),
        ({"memory": "80Ti"}, "outside 1Mi..81559Mi"),
        ({"memory": "-5Mi"}, "not a Kubernetes quantity"),
        ({"cores": "101"}, "consumedCapacity.cores '101' is outside 0..100"),
        ({"cores": "500m"}, "consumedCapacity.cores '500m' is not a whole number of cores"),
        ({"shares": "0"}, "consumedCapacity.shares '0' must be >= 1"),
        ({"engines": "1"}, "unknown key 'engines'; allowed: memory, cores, shares"),
        ({"memory": "1Mi", "gpu.flexmig.dev/memory": "2Mi"}, "names 'memory' twice"),
    ],
)
def test_share_errors_name_device_and_field(consumed: dict[str, str], needle: str) -> None:
    with pytest.raises(ConsumedCapacityError) as err:
        share_from_result("gpu-2-shared", SHARE, consumed, GPU_MIB)
    assert needle in str(err.value) and f"device gpu-2-shared share {SHARE}" in str(err.value)


def test_parse_quantity_forms() -> None:
    assert parse_quantity("1Ki") == 1024 and parse_quantity("1k") == 1000 and parse_quantity("1.5") == 1.5
    assert parse_quantity("250m") * 4 == 1 and parse_quantity("2E3") == 2000 and parse_quantity("+3") == 3


# --- per-device limits ------------------------------------------------------------------------------


def test_device_env_indexes_by_gpu_order() -> None:
    env = hamicore.device_env([ShareLimit(5, 2000, 0), ShareLimit(2, 8000, 30)])
    assert env == {
        2: ("CUDA_DEVICE_MEMORY_LIMIT_0=8000m", "CUDA_DEVICE_SM_LIMIT_0=30"),
        # No SM share asked here, but the claim-wide fallback is 30: this device says "no limit".
        5: ("CUDA_DEVICE_MEMORY_LIMIT_1=2000m", "CUDA_DEVICE_SM_LIMIT_1=100"),
    }
    assert hamicore.device_env([ShareLimit(0, 4096, 0)]) == {0: ("CUDA_DEVICE_MEMORY_LIMIT_0=4096m",)}
    with pytest.raises(ValueError, match="one limit per GPU"):
        hamicore.device_env([ShareLimit(0, 1, 0), ShareLimit(0, 2, 0)])
    with pytest.raises(ValueError, match="invalid share"):
        hamicore.device_env([ShareLimit(0, 0, 0)])


def _paths(tmp_path: Path) -> HamiCorePaths:
    return HamiCorePaths(library=tmp_path / "lib" / "libvgpu.so", state_dir=tmp_path / "vgpu")


def test_claim_edits_with_and_without_library(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    shares = [ShareLimit(0, 8000, 30), ShareLimit(1, 6000, 0)]
    edits = hamicore.claim_edits(paths, UID, shares, library_present=True)
    assert edits["env"] == [
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/{UID}/vgpu.cache",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT=6000m",  # fallback: the smaller share
        "CUDA_DEVICE_SM_LIMIT=30",
    ]
    mounts = {m["containerPath"]: (m["hostPath"], m["options"][0]) for m in edits["mounts"]}
    assert mounts == {
        f"/usr/local/vgpu/claims/{UID}": (str(paths.state_dir / "claims" / UID), "rw"),
        "/tmp/vgpulock": (str(paths.state_dir / "vgpulock"), "rw"),
        "/usr/local/vgpu/libvgpu.so": (str(paths.library), "ro"),
        "/etc/ld.so.preload": (str(paths.state_dir / "ld.so.preload"), "ro"),
    }
    absent = hamicore.claim_edits(paths, UID, [ShareLimit(0, 8000, 0)], library_present=False)
    assert not any("SM_LIMIT" in e for e in absent["env"])  # cores 0: no SM limit at all
    assert {m["containerPath"] for m in absent["mounts"]} == {
        f"/usr/local/vgpu/claims/{UID}",
        "/tmp/vgpulock",
    }
    with pytest.raises(ValueError):
        hamicore.claim_edits(paths, UID, [], library_present=True)
    with pytest.raises(ValueError):
        paths.claim_dir("../x")


def test_library_check_preload_file_and_claim_dirs(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    assert not hamicore.check_library(paths.library).present
    paths.library.parent.mkdir()
    paths.library.write_bytes(b"not elf")
    assert "not an ELF" in hamicore.check_library(paths.library).reason
    paths.library.write_bytes(b"\x7fELF\x02\x01\x01")
    assert hamicore.check_library(paths.library).present
    assert not hamicore.check_library(paths.library.parent).present

    target = hamicore.write_preload_file(paths)
    assert target.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    mtime = target.stat().st_mtime_ns
    assert hamicore.write_preload_file(paths) == target and target.stat().st_mtime_ns == mtime

    claim_dir = hamicore.prepare_claim_dirs(paths, UID)
    (claim_dir / "vgpu.cache").write_bytes(b"stale")
    claim_dir = hamicore.prepare_claim_dirs(paths, UID)  # a re-prepare starts from a fresh region
    assert list(claim_dir.iterdir()) == []
    assert os.stat(claim_dir).st_mode & 0o777 == 0o777 and paths.lock_dir.is_dir()
    assert hamicore.remove_claim_dir(paths, UID) and not claim_dir.exists()
    assert not hamicore.remove_claim_dir(paths, UID)


def test_cdi_spec_of_a_shared_claim() -> None:
    env = hamicore.device_env([ShareLimit(3, 8000, 30)])[3]
    dev = cdi.PreparedShared("gpu-3-shared", "GPU-abc", 3, env)
    edits = {"env": ["CUDA_DEVICE_ORDER=PCI_BUS_ID"], "mounts": []}
    spec = cdi.build_claim_spec(UID, [dev], None, edits)
    [device] = spec["devices"]
    assert device["name"] == f"{UID}-gpu-3-shared"
    assert device["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-abc",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8000m",
        "CUDA_DEVICE_SM_LIMIT_0=30",
    ]
    assert device["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia3"
    # HAMi-core's edits join the common ones (control node, driver files) every container gets once.
    assert spec["containerEdits"]["env"] == edits["env"]
    assert spec["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidiactl"
    # Spec-level edits belong to shared claims only; MIG/whole specs keep none.
    with pytest.raises(ValueError, match="only for claims with shared GPUs"):
        cdi.build_claim_spec(UID, [cdi.PreparedGpu("gpu-0", "GPU-abc", 0)], None, edits)
    assert "env" not in cdi.build_claim_spec(UID, [cdi.PreparedGpu("gpu-0", "GPU-abc", 0)])["containerEdits"]
    with pytest.raises(ValueError, match="not NAME=value"):
        cdi.build_claim_spec(UID, [cdi.PreparedShared("gpu-3-shared", "GPU-abc", 3, ("=x",))])
