"""Defect 4: the node refuses to prepare a device that overlaps one prepared for another claim (whole
GPU vs MIG vs share), whoever allocated it; the refusal names the other claim and creates nothing.
Real Preparer on the NVML simulator; the claims are handed out twice on purpose (a broken allocator)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.prepare.overlap import DeviceOverlap, SharedLimits, check_no_overlap, records_overlap
from kubeletplugin.shared.capacity import SharedShare

NODE = "n1"


def _claim(api: FakeApi, n: int, *results: AllocatedDevice) -> ClaimRef:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    name = f"c{n}"
    api.claims[("ns", name)] = ClaimView("ns", name, uid, tuple(results), (PodRef("ns", name, f"pod-{n}"),))
    return ClaimRef(namespace="ns", uid=uid, name=name)


def _dev(name: str, share: str | None = None, **consumed: str) -> AllocatedDevice:
    return AllocatedDevice("gpu", DRIVER_NAME, NODE, name, share, consumed)


def _prepare(node: SimNode, ref: ClaimRef) -> str:
    return node.preparer.prepare([ref])[ref.uid].error


def _spec_exists(node: SimNode, ref: ClaimRef) -> bool:
    return (node.cdi_dir / f"{DRIVER_NAME}-{ref.uid}.json").exists()


def test_same_whole_gpu_twice_refused_naming_the_other_claim(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB", mig_enabled=False)] * 2)
    try:
        first = _claim(node.api, 1, _dev("gpu-1"))
        second = _claim(node.api, 2, _dev("gpu-1"))
        assert _prepare(node, first) == ""
        error = _prepare(node, second)
        assert f"already prepared for claim ns/c1 (uid {first.uid}" in error
        assert "device gpu-1 (whole) overlaps gpu-1 (whole) on GPU 1" in error
        assert not _spec_exists(node, second)
        assert set(node.store.load().claims) == {first.uid}
        assert node.api.status.keys() == {first.uid}
        # Once the first is unprepared, the second goes through.
        assert node.preparer.unprepare([first]) == {first.uid: None}
        assert _prepare(node, second) == ""
    finally:
        node.preparer.close()


def test_mig_device_on_a_prepared_whole_gpu_refused_without_touching_mig_mode(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=False)])
    try:
        whole = _claim(node.api, 1, _dev("gpu-0"))
        assert _prepare(node, whole) == ""
        before = node.mig_calls()
        mig = _claim(node.api, 2, _dev("gpu-0-mig-1g10gb-19-0"))
        error = _prepare(node, mig)
        assert "gpu-0-mig-1g10gb-19-0 (MIG) overlaps gpu-0 (whole)" in error and "claim ns/c1" in error
        assert node.mig_calls() == before  # nothing created, MIG mode not switched under the container
        assert node.admin.snapshot().gpus[0].mig_current is False
        assert not _spec_exists(node, mig)
    finally:
        node.preparer.close()


def test_overlapping_mig_placements_refused_from_the_checkpoint(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")])
    try:
        big = _claim(node.api, 1, _dev("gpu-0-mig-3g20gb-9-4"))
        assert _prepare(node, big) == ""
        small = _claim(node.api, 2, _dev("gpu-0-mig-1g5gb-19-5"))
        error = _prepare(node, small)
        assert "overlaps gpu-0-mig-3g20gb-9-4 (MIG)" in error and "claim ns/c1" in error
        assert len(node.admin.snapshot().gpus[0].gpu_instances) == 1
        # A placement beside it is fine.
        assert _prepare(node, _claim(node.api, 3, _dev("gpu-0-mig-1g5gb-19-0"))) == ""
    finally:
        node.preparer.close()


def test_one_claim_overlapping_itself_refused(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")])
    try:
        ref = _claim(node.api, 1, _dev("gpu-0-mig-3g20gb-9-4"), _dev("gpu-0-mig-1g5gb-19-6"))
        assert "of this claim overlap on one GPU" in _prepare(node, ref)
        assert node.admin.snapshot().gpus[0].gpu_instances == ()
        assert node.store.load().claims == {}
    finally:
        node.preparer.close()


def test_shares_go_together_within_capacity_but_not_with_a_whole_gpu(tmp_path: Path) -> None:
    node = make_node(
        tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=False)], hami_library=True, split_count=2
    )
    try:
        a = _claim(node.api, 1, _dev("gpu-0-shared", "s-a", memory="8000Mi", cores="30"))
        b = _claim(node.api, 2, _dev("gpu-0-shared", "s-b", memory="8000Mi", cores="30"))
        assert _prepare(node, a) == "" and _prepare(node, b) == ""
        c = _claim(node.api, 3, _dev("gpu-0-shared", "s-c", memory="1000Mi"))
        error = _prepare(node, c)
        assert "would exceed its capacity (3 shares > split count 2)" in error
        assert "claim ns/c1" in error and "claim ns/c2" in error
        whole = _claim(node.api, 4, _dev("gpu-0"))
        error = _prepare(node, whole)
        assert "device gpu-0 (whole) overlaps gpu-0-shared (shared)" in error
        assert not _spec_exists(node, c) and not _spec_exists(node, whole)
    finally:
        node.preparer.close()


def _rec(
    name: str, gpu: int = 0, start: int | None = None, size: int | None = None, **kw: object
) -> PreparedDeviceRecord:
    mig = (
        {"profile": "p", "gi_profile_id": 1, "placement_start": start, "placement_size": size}
        if start is not None
        else {}
    )
    return PreparedDeviceRecord(("r",), NODE, name, gpu, "GPU-x", **mig, **kw)  # type: ignore[arg-type]


def test_overlap_rules_pure() -> None:
    whole, mig0, mig4 = _rec("gpu-0"), _rec("m0", start=0, size=4), _rec("m4", start=4, size=4)
    share = _rec("gpu-0-shared", shares=(SharedShare("s", 100, 0),))
    assert records_overlap(whole, whole) and records_overlap(whole, mig0) and records_overlap(share, whole)
    assert records_overlap(mig0, share) and records_overlap(mig0, _rec("m2", start=2, size=4))
    assert not records_overlap(mig0, mig4) and not records_overlap(share, share)
    assert not records_overlap(whole, _rec("gpu-1", gpu=1))
    held = ClaimCheckpoint("u1", "ns", "held", ClaimState.PREPARE_STARTED, (share,))
    limits = {0: SharedLimits(None, 1000)}

    def new_share(memory: int, cores: int) -> list[PreparedDeviceRecord]:
        return [_rec("gpu-0-shared", shares=(SharedShare("t", memory, cores),))]

    check_no_overlap("u2", new_share(900, 100), [held], limits)  # 900 + 100 MiB fits exactly
    with pytest.raises(DeviceOverlap, match=r"1001 MiB > 1000 MiB.*claim ns/held \(uid u1, PrepareStarted\)"):
        check_no_overlap("u2", new_share(901, 0), [held], limits)
    held_cores = ClaimCheckpoint(
        "u1",
        "ns",
        "held",
        ClaimState.PREPARE_COMPLETED,
        (_rec("gpu-0-shared", shares=(SharedShare("s", 10, 80),)),),
    )
    with pytest.raises(DeviceOverlap, match=r"110% cores > 100%"):
        check_no_overlap("u2", new_share(10, 30), [held_cores], limits)
