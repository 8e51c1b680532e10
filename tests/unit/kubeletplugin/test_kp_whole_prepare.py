"""Prepare of a whole-GPU allocation (`gpu-<i>`, what the controller now allocates for gpu.flexmig.dev)
on MIG-capable Hopper GPUs left in MIG mode, through the real Preparer on the NVML simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.constants import DRIVER_NAME
from driver.catalog.discover import discover_all
from driver.nvml.port import Nvml
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim
from kubeletplugin.checkpoint import CheckpointStore
from kubeletplugin.crashpoints import Crashpoints
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.inventory import Inventory
from kubeletplugin.kubeapi import AllocatedDevice, ClaimNotFound, ClaimView, PodRef
from kubeletplugin.metrics import NodeMetrics
from kubeletplugin.migmode import MigModeManager
from kubeletplugin.nvmlops import NvmlOps
from kubeletplugin.preparer import Preparer
from kubeletplugin.statuswriter import StatusWriter

NODE = "hopper"
MIG_UID = "5a1e0c3e-0000-4c9e-8a59-000000000001"
WHOLE_UID = "5a1e0c3e-0000-4c9e-8a59-000000000002"
BLOCKED_UID = "5a1e0c3e-0000-4c9e-8a59-000000000003"


class Api:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimView] = {}

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None

    def set_device_status(self, claim: ClaimView, devices: list[dict[str, Any]]) -> None:
        pass

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        pass


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Preparer, Api, SimAdmin, Nvml, Path]]:
    state = tmp_path / "sim.json"
    init_sim_state(state, [SimGpuSpec("H100-80GB", mig_enabled=True)] * 2)
    nvml = open_sim(state)
    nvml.init()
    metrics = NodeMetrics()
    ops = NvmlOps(nvml, metrics)
    api = Api()
    store = CheckpointStore(tmp_path / "state" / "checkpoint.json", "boot-1")
    preparer = Preparer(
        node_name=NODE,
        ops=ops,
        migmode=MigModeManager(ops, {g.index: g for g in nvml.gpus()}, metrics),
        inventory=Inventory.from_catalogs(discover_all(nvml)),
        store=store,
        api=api,
        status=StatusWriter(api, store, metrics, NODE),
        metrics=metrics,
        cdi_dir=tmp_path / "cdi",
        mig_minors=None,
        crash=Crashpoints(frozenset(), tmp_path / "marker"),
    )
    yield preparer, api, SimAdmin(state), nvml, tmp_path / "cdi"
    preparer.close()


def _claim(api: Api, uid: str, name: str, device: str) -> ClaimRef:
    dev = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
    api.claims[("ns", name)] = ClaimView("ns", name, uid, (dev,), (PodRef("ns", name, f"pod-{name}"),))
    return ClaimRef(namespace="ns", uid=uid, name=name)


def test_whole_gpu_on_idle_hopper_in_mig_mode_switches_mig_off(
    node: tuple[Preparer, Api, SimAdmin, Nvml, Path],
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
    node: tuple[Preparer, Api, SimAdmin, Nvml, Path],
) -> None:
    preparer, api, admin, _, _ = node
    mig = _claim(api, MIG_UID, "mig", "gpu-0-mig-1g10gb-19-0")
    assert preparer.prepare([mig])[MIG_UID].error == ""
    blocked = _claim(api, BLOCKED_UID, "blocked", "gpu-0")
    result = preparer.prepare([blocked])[BLOCKED_UID]
    assert "still has MIG instances" in result.error
    assert admin.snapshot().gpus[0].mig_current is True and admin.snapshot().gpus[0].gpu_instances
