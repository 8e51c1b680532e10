"""NVML steps of prepare/unprepare and the MIG-mode policy, on the NVML simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from driver.nvml.port import Nvml
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import NvmlError, NvmlErrorCode
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.checkpoint.model import PreparedDeviceRecord
from kubeletplugin.prepare.migmode import MigModeError, MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.steps import PlacementBusy, check_placement_free, destroy_mig, find_gi, realise_mig

NO_CRASH = Crashpoints(frozenset(), Path("/nonexistent"))


@pytest.fixture
def sim(tmp_path: Path) -> tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]:
    path = tmp_path / "sim.json"
    init_sim_state(path, [SimGpuSpec("A100-40GB"), SimGpuSpec("H100-80GB", mig_enabled=False)])
    nvml = open_sim(path)
    nvml.init()
    metrics = NodeMetrics()
    return nvml, SimAdmin(path), NvmlOps(nvml, metrics), metrics


def _rec(
    gpu: int = 0, start: int = 3, gi_id: int | None = None, created: bool = True
) -> PreparedDeviceRecord:
    return PreparedDeviceRecord(
        request_names=("gpu",),
        pool="n",
        device_name=f"gpu-{gpu}-mig-1g5gb-19-{start}",
        gpu_index=gpu,
        gpu_uuid="GPU-x",
        profile="1g.5gb",
        gi_profile_id=19,
        placement_start=start,
        placement_size=1,
        gi_id=gi_id,
        created_gi=created,
        created_ci=created,
    )


def test_realise_at_exact_placement_and_destroy(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    _nvml, admin, ops, _ = sim
    mig = realise_mig(ops, _rec(), NO_CRASH)
    [gi] = admin.snapshot().gpus[0].gpu_instances
    assert (gi.start, gi.size, gi.gi_id) == (3, 1, mig.gi_id)
    assert gi.compute_instances[0].mig_uuid == mig.mig_uuid
    # Found by placement (intent only) and by recorded id.
    assert find_gi(ops, _rec()) is not None and find_gi(ops, _rec(gi_id=mig.gi_id)) is not None
    assert find_gi(ops, _rec(gi_id=mig.gi_id + 1)) is None
    with pytest.raises(PlacementBusy, match="did not create"):
        check_placement_free(ops, _rec(start=3), {})
    with pytest.raises(PlacementBusy, match="claim u1"):
        check_placement_free(ops, _rec(start=3), {(0, mig.gi_id): "u1"})
    check_placement_free(ops, _rec(start=4), {})
    assert destroy_mig(ops, _rec(gi_id=mig.gi_id), NO_CRASH) is True
    assert admin.snapshot().gpus[0].gpu_instances == ()
    assert destroy_mig(ops, _rec(gi_id=mig.gi_id), NO_CRASH) is False  # gone = success


def test_destroy_never_touches_what_we_did_not_create(
    sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics],
) -> None:
    nvml, admin, ops, _ = sim
    gi = nvml.create_gpu_instance(0, 19, 2)
    assert destroy_mig(ops, _rec(start=2, created=False), NO_CRASH) is False
    assert [g.gi_id for g in admin.snapshot().gpus[0].gpu_instances] == [gi.gi_id]


def test_destroy_in_use_propagates_and_counts(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    _nvml, admin, ops, metrics = sim
    mig = realise_mig(ops, _rec(), NO_CRASH)
    admin.add_process(0, mig.gi_id, mig.ci_id, pid=7)
    with pytest.raises(NvmlError) as err:
        destroy_mig(ops, _rec(gi_id=mig.gi_id), NO_CRASH)
    assert err.value.code is NvmlErrorCode.IN_USE
    sample = metrics.registry.get_sample_value(
        "flexmig_node_nvml_errors_total", {"call": "nvmlComputeInstanceDestroy", "code": "IN_USE"}
    )
    assert sample == 1.0


def test_mig_off_counts_as_nothing_there(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    _, _, ops, _ = sim
    rec = _rec(gpu=1, start=0, gi_id=1)
    assert ops.gpu_instances_or_none(1) == []
    assert destroy_mig(ops, rec, NO_CRASH) is False


def test_migmode_hopper_toggles_ampere_never(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    nvml, admin, ops, metrics = sim
    mm = MigModeManager(ops, {g.index: g for g in nvml.gpus()}, metrics)
    mm.ensure_for_mig(1)
    assert admin.snapshot().gpus[1].mig_current is True
    mig = realise_mig(ops, _rec(gpu=1, start=0), NO_CRASH)
    mm.release(1)  # an instance is left: stays on
    assert admin.snapshot().gpus[1].mig_current is True
    destroy_mig(ops, _rec(gpu=1, start=0, gi_id=mig.gi_id), NO_CRASH)
    mm.release(1)
    assert admin.snapshot().gpus[1].mig_current is False
    # Ampere: MIG on stays on; the whole GPU is refused rather than toggled.
    mm.release(0)
    assert admin.snapshot().gpus[0].mig_current is True
    with pytest.raises(MigModeError, match="needs a reset"):
        mm.ensure_for_whole(0)


def test_migmode_ampere_off_is_reported_not_toggled(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    init_sim_state(path, [SimGpuSpec("A100-40GB", mig_enabled=False)])
    nvml = open_sim(path)
    nvml.init()
    ops = NvmlOps(nvml, NodeMetrics())
    mm = MigModeManager(ops, {0: nvml.gpu(0)}, NodeMetrics())
    with pytest.raises(MigModeError, match="needs a reset"):
        mm.ensure_for_mig(0)
    assert SimAdmin(path).call_counts().get("nvmlDeviceSetMigMode", 0) == 0


def test_failed_toggle_is_not_retried_in_a_loop(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    nvml, admin, ops, metrics = sim
    now = [0.0]
    mm = MigModeManager(
        ops, {g.index: g for g in nvml.gpus()}, metrics, retry_after_s=60, clock=lambda: now[0]
    )
    admin.inject_fault("nvmlDeviceSetMigMode", 1, NvmlErrorCode.NO_PERMISSION)
    with pytest.raises(MigModeError, match="NO_PERMISSION"):
        mm.ensure_for_mig(1)
    with pytest.raises(MigModeError, match="not retried"):
        mm.ensure_for_mig(1)
    assert admin.call_counts()["nvmlDeviceSetMigMode"] == 1
    assert mm.changes.labels(gpu="1", mode="on", result="failed")._value.get() == 1
    now[0] = 61.0
    mm.ensure_for_mig(1)
    assert admin.snapshot().gpus[1].mig_current is True


def test_destroy_clears_unrecorded_cis_in_our_gi(sim: tuple[Nvml, SimAdmin, NvmlOps, NodeMetrics]) -> None:
    _, admin, ops, _ = sim
    mig = realise_mig(ops, _rec(), NO_CRASH)
    # The checkpoint names a CI that no longer exists; the GI still holds another one.
    rec = dataclasses.replace(_rec(gi_id=mig.gi_id), ci_id=mig.ci_id + 3)
    assert destroy_mig(ops, rec, NO_CRASH) is True
    assert admin.snapshot().gpus[0].gpu_instances == ()
