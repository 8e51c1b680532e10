"""Idle MIG instances across crashes and restarts: the checkpoint format (version 2, and version 1
read as "no idle instance"), the startup reconcile of idle records, a crash in the middle of keeping
an instance idle or of adopting one, and the periodic reconcile never taking an idle GI for foreign."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import (
    CHECKPOINT_VERSION,
    CHECKPOINT_VERSION_IDLE,
    Checkpoint,
    CheckpointCorrupt,
    IdleInstance,
    checkpoint_from_json,
    checkpoint_to_json,
)
from kubeletplugin.checkpoint.periodic import PeriodicReconciler
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.settings.idlepolicy import IdlePolicy

NODE = "n1"
DEVICE = "gpu-0-mig-1g5gb-19-3"
POLICY = IdlePolicy(30.0)


def _node(tmp_path: Path, api: FakeApi, crash: frozenset[str] = frozenset()) -> SimNode:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], api=api, idle=POLICY, crash=crash)
    node.preparer.idle.clock = lambda: 1000.0
    return node


def _claim(api: FakeApi, n: int, device: str = DEVICE) -> ClaimRef:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    result = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
    api.claims[("ns", f"c{n}")] = ClaimView(
        "ns", f"c{n}", uid, (result,), (PodRef("ns", f"p{n}", f"pod-{n}"),)
    )
    return ClaimRef(namespace="ns", uid=uid, name=f"c{n}")


def _gis(node: SimNode) -> list[tuple[int, int]]:
    """(placement start, number of CIs) of every GI on GPU 0."""
    return [(gi.start, len(gi.compute_instances)) for gi in node.admin.snapshot().gpus[0].gpu_instances]


def _idle(gi_id: int = 1, released_at: float = 1000.5) -> IdleInstance:
    return IdleInstance(0, "GPU-x", "1g.5gb", 19, 3, 1, gi_id, "MIG-y", released_at, "ns")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


# -- the file format ----------------------------------------------------------------------------------


def test_idle_records_round_trip_as_version_2_and_version_1_reads_as_none(tmp_path: Path) -> None:
    cp = Checkpoint("boot-1", idle={_idle().key: _idle()})
    doc = checkpoint_to_json(cp)
    assert doc["version"] == CHECKPOINT_VERSION_IDLE and "idle" in doc
    assert checkpoint_from_json(json.loads(json.dumps(doc))).idle == cp.idle
    # Without idle records the layout stays version 1, which older plugins read.
    assert checkpoint_to_json(Checkpoint("boot-1"))["version"] == CHECKPOINT_VERSION == 1
    # The store writes the same bytes as checkpoint_to_json describes, and reads them back.
    store = CheckpointStore(tmp_path / "cp.json", "boot-1")
    store.save(cp)
    on_disk = json.loads((tmp_path / "cp.json").read_text())
    assert on_disk["version"] == CHECKPOINT_VERSION_IDLE
    assert CheckpointStore(tmp_path / "cp.json", "boot-1").load().idle == cp.idle
    # Migration: a version 1 file (no "idle") is read with no idle instance.
    old = checkpoint_to_json(Checkpoint("boot-1"))
    assert checkpoint_from_json(old).idle == {}


def test_a_damaged_idle_record_is_corrupt_not_ignored() -> None:
    doc = checkpoint_to_json(Checkpoint("boot-1", idle={_idle().key: _idle()}))
    doc["idle"]["0-1"]["giID"] = "1"
    doc.pop("checksum")
    doc["checksum"] = hashlib.sha256(
        json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()
    with pytest.raises(CheckpointCorrupt, match="giID"):
        checkpoint_from_json(doc)
    with pytest.raises(CheckpointCorrupt, match="version 3"):
        checkpoint_from_json({**doc, "version": 3})


# -- restarts -------------------------------------------------------------------------------------------


def test_restart_keeps_an_idle_instance_and_never_reports_it(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    ref = _claim(api, 1)
    assert node.preparer.prepare([ref])[ref.uid].error == ""
    assert node.preparer.unprepare([ref])[ref.uid] is None
    node.preparer.close()

    restarted = _node(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.foreign_instances == [] and report.errors == []
        assert len(restarted.store.load().idle) == 1 and _gis(restarted) == [(3, 0)]
        periodic = PeriodicReconciler(
            preparer=restarted.preparer,
            store=restarted.store,
            ops=restarted.ops,
            api=api,
            gpus=restarted.nvml.gpus(),
            inventory=Inventory.from_catalogs([]),
            metrics=restarted.metrics,
            on_withdrawn_change=lambda: None,
        )
        assert periodic.run_once().foreign == []  # not expired yet, and ours
        # The kept record is reused after the restart.
        again = _claim(api, 2)
        creates = restarted.mig_calls()["nvmlDeviceCreateGpuInstanceWithPlacement"]
        assert restarted.preparer.prepare([again])[again.uid].error == ""
        assert restarted.mig_calls()["nvmlDeviceCreateGpuInstanceWithPlacement"] == creates
        # An expired one goes at the next periodic pass.
        assert restarted.preparer.unprepare([again])[again.uid] is None
        restarted.preparer.idle.clock = lambda: 2000.0
        assert periodic.run_once().destroyed_instances == 1 and _gis(restarted) == []
    finally:
        restarted.preparer.close()


def test_restart_drops_a_record_whose_instance_is_gone(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    ref = _claim(api, 1)
    assert node.preparer.prepare([ref])[ref.uid].error == ""
    assert node.preparer.unprepare([ref])[ref.uid] is None
    [idle] = node.store.load().idle.values()
    node.nvml.destroy_gpu_instance(0, idle.gi_id)  # out of band (e.g. an administrator's nvidia-smi)
    node.preparer.close()

    restarted = _node(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.errors == [] and restarted.store.load().idle == {}
        # And with no record left, the placement is simply free.
        again = _claim(api, 2)
        assert restarted.preparer.prepare([again])[again.uid].error == ""
    finally:
        restarted.preparer.close()


@pytest.mark.parametrize("claim_still_exists", [False, True])
def test_crash_between_ci_destroy_and_idle_record(tmp_path: Path, claim_still_exists: bool) -> None:
    api = FakeApi()
    ref = _claim(api, 1)
    node = _node(tmp_path, api)
    assert node.preparer.prepare([ref])[ref.uid].error == ""
    node.preparer.close()
    doomed = _node(tmp_path, api, frozenset({"after-idle-ci-destroy"}))
    threading.Thread(target=doomed.preparer.unprepare, args=([ref],), daemon=True).start()
    _wait_for(tmp_path / "marker")
    doomed.preparer.close()
    # The CI is gone, the disk still has the completed claim (and no idle record).
    assert _gis(doomed) == [(3, 0)]
    if not claim_still_exists:
        del api.claims[("ns", "c1")]

    restarted = _node(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.foreign_instances == [] and report.errors == []
        cp = restarted.store.load()
        if not claim_still_exists:
            # Nothing owns the GI any more: destroyed, nothing leaked, nothing left recorded.
            assert _gis(restarted) == [] and cp.claims == {} and cp.idle == {}
        else:
            # Adopted; kubelet's retried unprepare keeps it idle after all.
            assert list(cp.claims) == [ref.uid]
            assert restarted.preparer.unprepare([ref])[ref.uid] is None
            cp = restarted.store.load()
            assert cp.claims == {} and len(cp.idle) == 1 and _gis(restarted) == [(3, 0)]
    finally:
        restarted.preparer.close()


def test_crash_while_adopting_rolls_back_to_a_consistent_node(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    first = _claim(api, 1)
    assert node.preparer.prepare([first])[first.uid].error == ""
    assert node.preparer.unprepare([first])[first.uid] is None
    node.preparer.close()
    second = _claim(api, 2)
    doomed = _node(tmp_path, api, frozenset({"after-ci-create"}))
    threading.Thread(target=doomed.preparer.prepare, args=([second],), daemon=True).start()
    _wait_for(tmp_path / "marker")
    doomed.preparer.close()
    # The durable intent took the GI over from the idle record in one write.
    doc = json.loads((tmp_path / "state" / "checkpoint.json").read_text())
    assert "idle" not in doc and list(doc["claims"]) == [second.uid]

    restarted = _node(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.rolled_back == [second.uid] and report.errors == []
        assert _gis(restarted) == [] and restarted.store.load().idle == {}
        assert restarted.preparer.prepare([second])[second.uid].error == ""
        assert _gis(restarted) == [(3, 1)]
    finally:
        restarted.preparer.close()
