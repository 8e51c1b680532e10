"""Prepare of a whole-GPU allocation (`gpu-<i>`, what the controller now allocates for gpu.flexmig.dev)
on MIG-capable Hopper GPUs left in MIG mode, through the real Preparer on the NVML simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_node import FakeApi, make_node

from api.constants import DRIVER_NAME
from driver.nvml.port import Nvml
from driver.nvml.sim import SimAdmin, SimGpuSpec
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.prepare.preparer import Preparer

NODE = "hopper"
MIG_UID = "5a1e0c3e-0000-4c9e-8a59-000000000001"
WHOLE_UID = "5a1e0c3e-0000-4c9e-8a59-000000000002"
BLOCKED_UID = "5a1e0c3e-0000-4c9e-8a59-000000000003"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Preparer, FakeApi, SimAdmin, Nvml, Path]]:
    n = make_node(tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=True)] * 2)
    yield n.preparer, n.api, n.admin, n.nvml, n.cdi_dir
    n.preparer.close()


def _claim(api: FakeApi, uid: str, name: str, device: str) -> ClaimRef:
    dev = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
    api.claims[("ns", name)] = ClaimView("ns", name, uid, (dev,), (PodRef("ns", name, f"pod-{name}"),))
    return ClaimRef(namespace="ns", uid=uid, name=name)


def test_whole_gpu_on_idle_hopper_in_mig_mode_switches_mig_off(
    node: tuple[Preparer, FakeApi, SimAdmin, Nvml, Path],
) -> None:
    preparer, api, admin, nvml, cdi_dir = node
    assert admin.snapshot().gpus[1].mig_current is True
    ref = _claim(api, WHOLE_UID, "whole", "gpu-1")
    result = preparer.prepare([ref])[WHOLE_UID]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == ["gpu-1"]
    assert admin.snapshot().gpus[1].mig_current is False  # MIG off: the container gets the plain GPU
    spec = json.loads((cdi_dir / f"{DRIVER_NAME}-{WHOLE_UID}.json").read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", ())]
    assert f"NVIDIA_VISIBLE_DEVICES={nvml.gpu(1).uuid}" in env
    assert preparer.unprepare([ref]) == {WHOLE_UID: None}


def test_whole_gpu_refused_while_a_mig_instance_lives_on_it(
    node: tuple[Preparer, FakeApi, SimAdmin, Nvml, Path],
) -> None:
    preparer, api, admin, _, _ = node
    mig = _claim(api, MIG_UID, "mig", "gpu-0-mig-1g10gb-19-0")
    assert preparer.prepare([mig])[MIG_UID].error == ""
    blocked = _claim(api, BLOCKED_UID, "blocked", "gpu-0")
    result = preparer.prepare([blocked])[BLOCKED_UID]
    # Refused before anything is touched, naming the claim that holds the GPU (defect 4).
    assert "overlaps gpu-0-mig-1g10gb-19-0 (MIG) on GPU 0, already prepared for claim ns/mig" in result.error
    assert admin.snapshot().gpus[0].mig_current is True and admin.snapshot().gpus[0].gpu_instances


def test_whole_gpu_refused_while_a_foreign_mig_instance_lives_on_it(
    node: tuple[Preparer, FakeApi, SimAdmin, Nvml, Path],
) -> None:
    preparer, api, admin, nvml, _ = node
    nvml.create_gpu_instance(0, 19, 0)  # another actor's instance: no checkpoint entry names it
    blocked = _claim(api, BLOCKED_UID, "blocked", "gpu-0")
    result = preparer.prepare([blocked])[BLOCKED_UID]
    assert "still has MIG instances" in result.error
    assert admin.snapshot().gpus[0].mig_current is True and admin.snapshot().gpus[0].gpu_instances
