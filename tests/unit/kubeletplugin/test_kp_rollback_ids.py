"""Defect 6: a failed prepare rolls back by the GI/CI ids NVML returned, recorded in the checkpoint as
soon as NVML returned them; it never destroys "whatever sits at the placement", which may be another
actor's instance. Real Preparer on the NVML simulator; the other actor is a second NVML handle on the
same simulated GPU."""

from __future__ import annotations

from pathlib import Path

from sim_node import FakeApi, make_node

from api.constants import DRIVER_NAME
from driver.catalog.discover import discover_all
from driver.nvml.sim import SimGpuSpec, open_sim
from driver.nvml.types import ComputeInstance, GpuInstance, NvmlError, NvmlErrorCode
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.prepare.claimrecords import records_for
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.publish.inventory import Inventory

NODE = "n1"
UID = "00000000-0000-4000-8000-000000000001"
DEVICE = "gpu-0-mig-1g5gb-19-3"


def _claim(api: FakeApi) -> ClaimRef:
    dev = AllocatedDevice("gpu", DRIVER_NAME, NODE, DEVICE)
    api.claims[("ns", "c")] = ClaimView("ns", "c", UID, (dev,), (PodRef("ns", "c", "pod-1"),))
    return ClaimRef(namespace="ns", uid=UID, name="c")


def test_failed_create_never_destroys_another_actors_instance_at_the_placement(tmp_path: Path) -> None:
    foreign: list[GpuInstance] = []

    class RacedOps(NvmlOps):
        """Another actor takes the placement between the preparer's free check and its create."""

        def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
            other = open_sim(tmp_path / "sim.json")
            other.init()
            foreign.append(other.create_gpu_instance(index, profile_id, start))
            return super().create_gpu_instance(index, profile_id, start)  # fails: the slot is taken

    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], ops_factory=RacedOps)
    try:
        ref = _claim(node.api)
        error = node.preparer.prepare([ref])[UID].error
        assert "nvmlDeviceCreateGpuInstanceWithPlacement" in error
        [gi] = node.admin.snapshot().gpus[0].gpu_instances
        assert (gi.gi_id, gi.start) == (foreign[0].gi_id, 3)  # the other actor's instance survived
        assert node.store.load().claims == {}
        assert not (node.cdi_dir / f"{DRIVER_NAME}-{UID}.json").exists()
    finally:
        node.preparer.close()


def test_ids_are_checkpointed_before_the_next_nvml_step_and_rollback_uses_them(tmp_path: Path) -> None:
    seen_in_checkpoint: list[int | None] = []

    class FailingCiOps(NvmlOps):
        def create_compute_instance(self, index: int, gi_id: int) -> ComputeInstance:
            store = node_ref[0].store
            seen_in_checkpoint.append(store.load().claims[UID].devices[0].gi_id)
            raise NvmlError(
                "nvmlGpuInstanceCreateComputeInstance", NvmlErrorCode.INSUFFICIENT_RESOURCES, "test"
            )

    node_ref = [make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], ops_factory=FailingCiOps)]
    node = node_ref[0]
    try:
        ref = _claim(node.api)
        assert "INSUFFICIENT_RESOURCES" in node.preparer.prepare([ref])[UID].error
        assert seen_in_checkpoint and seen_in_checkpoint[0] is not None  # recorded at once
        assert node.admin.snapshot().gpus[0].gpu_instances == ()  # ours destroyed, by that id
        assert node.store.load().claims == {}
    finally:
        node.preparer.close()


def test_nothing_destroyed_when_the_recorded_id_is_not_at_the_placement(tmp_path: Path) -> None:
    """A PrepareStarted entry without an id (create failed) rolled back at runtime touches nothing."""
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")])
    try:
        ref = _claim(node.api)
        inventory = Inventory.from_catalogs(discover_all(node.nvml))
        records = records_for(node.api.get_claim("ns", "c"), NODE, inventory)
        node.store.put_claim(ClaimCheckpoint(UID, "ns", "c", ClaimState.PREPARE_STARTED, tuple(records)))
        other = open_sim(tmp_path / "sim.json")
        other.init()
        other.create_gpu_instance(0, 19, 3)  # someone else's GI exactly at the intended placement
        assert node.preparer.rollback(node.store.load().claims[UID]) == 0
        assert len(node.admin.snapshot().gpus[0].gpu_instances) == 1
        assert ref.uid not in node.store.load().claims
    finally:
        node.preparer.close()
