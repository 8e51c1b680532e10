"""Defect 5: periodic reconcile. Claims gone from the API server (or replaced) are unprepared; stale
interrupted prepares rolled back by their recorded ids; instances flexmig did not create are never
touched, but the devices they overlap are withdrawn from the published slices and come back when the
instance goes; claims a request is working on are left alone. Real Preparer on the NVML simulator."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import urllib3
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.catalog.discover import discover_all
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.checkpoint.periodic import PeriodicReconciler
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.prepare.claimrecords import records_for
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.publish.withdraw import without_devices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = "n1"


class SwitchableApi(FakeApi):
    down = False

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        if self.down:
            raise urllib3.exceptions.MaxRetryError(None, "/apis", "connection refused")  # type: ignore[arg-type]
        return super().get_claim(namespace, name)


@dataclass
class Ctx:
    node: SimNode
    api: SwitchableApi
    inventory: Inventory
    periodic: PeriodicReconciler
    changes: list[frozenset[str]]

    def claim(self, n: int, *devices: str) -> ClaimRef:
        uid = f"00000000-0000-4000-8000-{n:012d}"
        results = tuple(AllocatedDevice("gpu", DRIVER_NAME, NODE, d) for d in devices)
        self.api.claims[("ns", f"c{n}")] = ClaimView("ns", f"c{n}", uid, results, (PodRef("ns", "p", "u"),))
        return ClaimRef("ns", uid, f"c{n}")

    def prepare(self, ref: ClaimRef) -> None:
        assert self.node.preparer.prepare([ref])[ref.uid].error == ""

    def gis(self) -> list[tuple[int, int, int]]:
        return sorted(
            (g.index, gi.gi_id, gi.start) for g in self.node.admin.snapshot().gpus for gi in g.gpu_instances
        )


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[Ctx]:
    api = SwitchableApi()
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB"), SimGpuSpec("A100-40GB")], api=api)
    inventory = Inventory.from_catalogs(discover_all(node.nvml))
    changes: list[frozenset[str]] = []
    holder: list[PeriodicReconciler] = []
    periodic = PeriodicReconciler(
        preparer=node.preparer,
        store=node.store,
        ops=node.ops,
        api=api,
        gpus=node.nvml.gpus(),
        inventory=inventory,
        metrics=node.metrics,
        on_withdrawn_change=lambda: changes.append(holder[0].withdrawn()),
    )
    holder.append(periodic)
    yield Ctx(node, api, inventory, periodic, changes)
    node.preparer.close()


def test_claim_gone_from_the_api_server_is_unprepared(ctx: Ctx) -> None:
    kept, gone, replaced = (
        ctx.claim(1, "gpu-0-mig-1g5gb-19-0"),
        ctx.claim(2, "gpu-0-mig-1g5gb-19-1"),
        ctx.claim(3, "gpu-1-mig-1g5gb-19-0"),
    )
    for ref in (kept, gone, replaced):
        ctx.prepare(ref)
    assert len(ctx.gis()) == 3
    del ctx.api.claims[("ns", "c2")]
    old = ctx.api.claims[("ns", "c3")]
    ctx.api.claims[("ns", "c3")] = ClaimView("ns", "c3", "another-uid", old.devices, old.reserved_for)
    report = ctx.periodic.run_once()
    assert sorted(report.released) == sorted([gone.uid, replaced.uid]) and report.destroyed_instances == 2
    assert set(ctx.node.store.load().claims) == {kept.uid}
    assert [(g, s) for g, _, s in ctx.gis()] == [(0, 0)]
    assert not (ctx.node.cdi_dir / f"{DRIVER_NAME}-{gone.uid}.json").exists()
    # kubelet's own unprepare, arriving later, finds nothing and succeeds.
    assert ctx.node.preparer.unprepare([gone]) == {gone.uid: None}


def test_api_server_down_keeps_every_claim(ctx: Ctx) -> None:
    ref = ctx.claim(1, "gpu-0-mig-1g5gb-19-0")
    ctx.prepare(ref)
    del ctx.api.claims[("ns", "c1")]
    ctx.api.down = True
    report = ctx.periodic.run_once()
    assert report.kept_uncertain == [ref.uid] and report.released == []
    assert len(ctx.gis()) == 1


def test_claims_a_request_works_on_are_skipped(ctx: Ctx) -> None:
    ref = ctx.claim(1, "gpu-0-mig-1g5gb-19-0")
    ctx.prepare(ref)
    del ctx.api.claims[("ns", "c1")]
    with ctx.node.preparer.locks.working_on(ref.uid):
        report = ctx.periodic.run_once()
    assert report.skipped_in_flight == [ref.uid] and len(ctx.gis()) == 1
    assert ctx.periodic.run_once().released == [ref.uid]


def test_stale_prepare_started_rolled_back_by_recorded_id_only(ctx: Ctx) -> None:
    ref = ctx.claim(1, "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1")
    records = records_for(ctx.api.get_claim("ns", "c1"), NODE, ctx.inventory)
    # Ours at placement 0 (id recorded); someone else's at placement 1 (no id recorded for it).
    ours = ctx.node.nvml.create_gpu_instance(0, 19, 0)
    ctx.node.nvml.create_gpu_instance(0, 19, 1)
    recs = (dataclasses.replace(records[0], gi_id=ours.gi_id), records[1])
    ctx.node.store.put_claim(ClaimCheckpoint(ref.uid, "ns", "c1", ClaimState.PREPARE_STARTED, recs))
    report = ctx.periodic.run_once()
    assert report.rolled_back == [ref.uid] and report.destroyed_instances == 1
    assert [s for _, _, s in ctx.gis()] == [1]  # the other actor's instance is untouched
    assert ctx.node.store.load().claims == {}


def test_foreign_instance_withdrawn_untouched_and_republished_when_gone(ctx: Ctx) -> None:
    ref = ctx.claim(1, "gpu-1-mig-1g5gb-19-6")
    ctx.prepare(ref)  # ours: never foreign
    assert ctx.periodic.run_once().foreign == [] and ctx.changes == []
    foreign = ctx.node.nvml.create_gpu_instance(1, 14, 4)  # 2g.10gb at 4:2, out of band
    report = ctx.periodic.run_once()
    assert [(f.gpu_index, f.gi_id, f.start, f.size) for f in report.foreign] == [(1, foreign.gi_id, 4, 2)]
    withdrawn = ctx.periodic.withdrawn()
    assert {"gpu-1", "gpu-1-shared", "gpu-1-mig-1g5gb-19-4", "gpu-1-mig-1g5gb-19-5"} <= withdrawn
    assert "gpu-1-mig-1g5gb-19-6" not in withdrawn and "gpu-1-mig-1g5gb-19-0" not in withdrawn
    assert not any(n.startswith("gpu-0") for n in withdrawn)
    assert ctx.changes == [withdrawn]  # the publisher was asked to republish once
    assert ctx.node.metrics.registry.get_sample_value("flexmig_node_foreign_instances") == 1
    assert (
        ctx.node.metrics.registry.get_sample_value(
            "flexmig_node_orphan_instances_total", {"action": "withdrawn"}
        )
        == 1
    )
    ctx.periodic.run_once()
    assert len(ctx.changes) == 1  # nothing new: no republish
    assert (1, foreign.gi_id, 4) in ctx.gis()  # never touched

    # What the publisher would write leaves exactly those devices out, and the pool stays complete.
    catalogs = discover_all(ctx.node.nvml)
    cfg = NodeConfig(name=NODE, operating_mode=OperatingMode.MIG)
    full = build_node_slices(catalogs, NODE, 1, cfg, {0: True, 1: True})
    slim = without_devices(full, withdrawn)
    names = {d["name"] for s in slim.slices for d in s.body["spec"].get("devices") or []}
    all_names = {d["name"] for s in full.slices for d in s.body["spec"].get("devices") or []}
    assert names == all_names - withdrawn and names != all_names
    assert {s.body["spec"]["pool"]["resourceSliceCount"] for s in slim.slices} == {len(slim.slices)}

    ctx.node.nvml.destroy_gpu_instance(1, foreign.gi_id)  # the other actor cleans up
    assert ctx.periodic.run_once().foreign == []
    assert ctx.periodic.withdrawn() == frozenset() and ctx.changes[-1] == frozenset()


def test_instance_being_created_under_the_gpu_lock_is_not_taken_for_foreign(ctx: Ctx) -> None:
    """A prepare holds the GPU lock from create until the id is in the checkpoint; the reconcile
    lists instances under the same lock, so it never sees the moment in between."""
    ref = ctx.claim(1, "gpu-0-mig-1g5gb-19-2")
    records = records_for(ctx.api.get_claim("ns", "c1"), NODE, ctx.inventory)
    created = threading.Event()
    done: list[object] = []

    def slow_prepare() -> None:
        with ctx.node.preparer.locks.gpus([0]), ctx.node.preparer.locks.working_on(ref.uid):
            ctx.node.store.put_claim(
                ClaimCheckpoint(ref.uid, "ns", "c1", ClaimState.PREPARE_STARTED, tuple(records))
            )
            gi = ctx.node.nvml.create_gpu_instance(0, 19, 2)
            created.set()
            threading.Event().wait(0.5)  # the reconcile runs meanwhile and must wait for the lock
            ctx.node.store.put_claim(
                ClaimCheckpoint(
                    ref.uid,
                    "ns",
                    "c1",
                    ClaimState.PREPARE_COMPLETED,
                    (dataclasses.replace(records[0], gi_id=gi.gi_id),),
                )
            )

    t = threading.Thread(target=slow_prepare)
    t.start()
    assert created.wait(5)
    done.append(ctx.periodic.run_once())
    t.join(5)
    report = done[0]
    assert isinstance(report.foreign, list) and report.foreign == []
    assert ctx.periodic.withdrawn() == frozenset()
