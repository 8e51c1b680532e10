"""Many claims prepared at once, as kubelet sends them when pods start together: every GPU filled in
parallel on both simulator modes, and claims racing for overlapping devices: exactly one wins, whatever
the interleaving, and the loser created nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import ClaimState
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef

NODE = "n1"
DEADLINE_S = 120.0


def _claim(api: FakeApi, n: int, *devices: str) -> ClaimRef:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    results = tuple(AllocatedDevice("gpu", DRIVER_NAME, NODE, d) for d in devices)
    api.claims[("ns", f"c{n}")] = ClaimView("ns", f"c{n}", uid, results, (PodRef("ns", f"p{n}", f"pod-{n}"),))
    return ClaimRef(namespace="ns", uid=uid, name=f"c{n}")


def _all_at_once(calls: list[Callable[[], object]]) -> list[object]:
    """Run every call in its own thread, released together."""
    start = threading.Barrier(len(calls))
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
        assert not t.is_alive(), "a prepare/unprepare call hung"
    return out


def _instances(node: SimNode) -> list[tuple[int, int, int]]:
    """(gpu, GI start, number of CIs) of every GI on the node."""
    return [
        (g.index, gi.start, len(gi.compute_instances))
        for g in node.admin.snapshot().gpus
        for gi in g.gpu_instances
    ]


@pytest.mark.parametrize(("memory", "gpus"), [(False, 2), (True, 8)])
def test_concurrent_claims_fill_every_gpu_and_leave_nothing(tmp_path: Path, memory: bool, gpus: int) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB") for _ in range(gpus)], memory=memory)
    try:
        refs = [
            _claim(node.api, g * 7 + s, f"gpu-{g}-mig-1g5gb-19-{s}") for g in range(gpus) for s in range(7)
        ]
        results = _all_at_once([lambda r=r: node.preparer.prepare([r])[r.uid] for r in refs])
        assert [r.error for r in results] == [""] * len(refs)  # type: ignore[attr-defined]
        assert sorted(_instances(node)) == [(g, s, 1) for g in range(gpus) for s in range(7)]
        claims = node.store.load().claims
        assert set(claims) == {r.uid for r in refs}
        assert all(c.state is ClaimState.PREPARE_COMPLETED and c.devices[0].realised for c in claims.values())
        errors = _all_at_once([lambda r=r: node.preparer.unprepare([r])[r.uid] for r in refs])
        assert errors == [None] * len(refs)
        assert _instances(node) == [] and node.store.load().claims == {}
        assert list(node.cdi_dir.glob("*.json")) == []
    finally:
        node.preparer.close()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("gpu-0-mig-1g5gb-19-0",), ("gpu-0-mig-2g10gb-14-0",)),
        (("gpu-0-mig-1g5gb-19-4", "gpu-1-mig-3g20gb-9-4"), ("gpu-1-mig-1g5gb-19-5",)),
    ],
)
def test_claims_racing_for_overlapping_devices_one_wins(
    tmp_path: Path, first: tuple[str, ...], second: tuple[str, ...]
) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB") for _ in range(2)], memory=True)
    try:
        for round_no in range(5):
            a = _claim(node.api, 2 * round_no, *first)
            b = _claim(node.api, 2 * round_no + 1, *second)
            ra, rb = _all_at_once([lambda r=r: node.preparer.prepare([r])[r.uid] for r in (a, b)])
            errors = [ra.error, rb.error]  # type: ignore[attr-defined]
            assert sorted(e == "" for e in errors) == [False, True], errors
            winner, loser = (a, b) if errors[0] == "" else (b, a)
            assert "overlaps" in errors[1 - errors.index("")]
            assert set(node.store.load().claims) == {winner.uid}
            expected = len(first) if winner is a else len(second)
            assert len(_instances(node)) == expected  # the loser created nothing
            assert not (node.cdi_dir / f"{DRIVER_NAME}-{loser.uid}.json").exists()
            assert node.preparer.unprepare([winner]) == {winner.uid: None}
            assert _instances(node) == []
    finally:
        node.preparer.close()


def test_prepare_and_unprepare_of_one_claim_racing_leave_it_whole_or_gone(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], memory=True)
    try:
        for n in range(20):
            ref = _claim(node.api, n, "gpu-0-mig-1g5gb-19-2")
            prep, unprep = _all_at_once(
                [
                    lambda r=ref: node.preparer.prepare([r])[r.uid],
                    lambda r=ref: node.preparer.unprepare([r])[r.uid],
                ]
            )
            assert prep.error == "" and unprep is None  # type: ignore[attr-defined]
            entry = node.store.load().claims.get(ref.uid)
            spec = (node.cdi_dir / f"{DRIVER_NAME}-{ref.uid}.json").exists()
            if entry is None:  # unprepare ran last: nothing of the claim is left
                assert _instances(node) == [] and not spec
            else:  # prepare ran last: all of it is there
                assert entry.state is ClaimState.PREPARE_COMPLETED and spec
                assert _instances(node) == [(0, 2, 1)]
                assert node.preparer.unprepare([ref]) == {ref.uid: None}
    finally:
        node.preparer.close()


def test_failed_spec_write_after_the_gpu_locks_rolls_back(tmp_path: Path) -> None:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], memory=True)
    try:

        class FailingSpecs:
            def write(self, *_args: object, **_kwargs: object) -> Path:
                raise OSError("simulated full CDI directory")

        real = node.preparer._specs
        node.preparer._specs = FailingSpecs()  # type: ignore[assignment]
        ref = _claim(node.api, 1, "gpu-0-mig-1g5gb-19-2")
        error = node.preparer.prepare([ref])[ref.uid].error
        assert "simulated full CDI directory" in error
        assert _instances(node) == [] and node.store.load().claims == {}
        node.preparer._specs = real
        assert node.preparer.prepare([ref])[ref.uid].error == ""  # the retry goes through
        assert _instances(node) == [(0, 2, 1)]
    finally:
        node.preparer.close()
