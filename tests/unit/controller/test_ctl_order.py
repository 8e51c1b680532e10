"""Issue 12: the pods dirty in one step are decided largest first (controller/allocation/loop.py,
driver/policy/placer.py `Placer.batch_order`), sizes read by controller/allocation/podsize.py; a pod
pending longer than `AGE_FIRST_AFTER_S` goes before all younger ones (ageing)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from ctl_helpers import CLASS, CLASSES, claim, mem, node_slices
from fake_apiserver import Harness
from shared_helpers import CLASSES as SHARED_CLASSES
from shared_helpers import HAMI, hami_body
from shared_helpers import claim as shared_claim
from shared_helpers import decider as shared_decider
from test_ctl_whole import ALL_CLASSES, WHOLE, _decider, _whole

from controller.allocation.podsize import pod_size
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.claims.podclaims import ClaimsPending
from controller.kube.store import Event
from controller.state.inventory import Inventory
from driver.catalog.simulated import simulated_catalog
from driver.policy.placer import AGE_FIRST_AFTER_S, Placer, PodSize

A100 = {p.name: p.memory_mib for p in simulated_catalog("A100-40GB").profiles}


class AgeOrder(Placer):
    """The order before issue 12: oldest first, whatever the size."""

    __slots__ = ()

    @staticmethod
    def batch_order(
        sizes: Sequence[PodSize | None],
        waited: Sequence[float] | None = None,
        age_first_after_s: float = AGE_FIRST_AFTER_S,
    ) -> list[int]:
        return list(range(len(sizes)))

    def burst_group(self, sizes: Sequence[PodSize | None]) -> list[int]:
        return []  # nor the burst plan (driver/policy/burstplan.py), which would place this burst too


def _burst(h: Harness, pods: Sequence[tuple[int, int]]) -> None:
    """One pod per (memory MiB, count), created in this order (the first is the oldest)."""
    for i, (mib, count) in enumerate(pods):
        h.add_claim(claim(f"c{i}", mem(mib), count=count))
        h.add_pod(f"p{i}", [f"c{i}"])


# Four 1g.5gb pods then one 3g.20gb pod on one A100-40GB (7 compute slices, 8 memory slices): the
# 3g.20gb fits only at start 4, and four 1g.5gb decided first leave no 3g.20gb placement free.
SMALL_THEN_LARGE = [(4000, 1)] * 4 + [(19000, 1)]


def test_oldest_first_refuses_the_large_pod_of_a_small_then_large_burst() -> None:
    """The premise of the next test: decided one by one in arrival order, the burst does not fit."""
    h = Harness({"n1": ("A100-40GB", 1)})
    h.ctl.placer = AgeOrder()
    _burst(h, SMALL_THEN_LARGE)
    h.deliver()
    h.cycle()
    assert [h.gated(f"p{i}") for i in range(5)] == [False, False, False, False, True]
    assert h.ctl.pending["ns/p4"].reason  # told why it waits


def test_a_small_then_large_burst_is_decided_largest_first_and_all_of_it_fits() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    _burst(h, SMALL_THEN_LARGE)
    h.deliver()
    h.cycle()
    assert [h.gated(f"p{i}") for i in range(5)] == [False] * 5
    assert not h.ctl.pending
    assert not h.api.audit()
    devices = {k: [d for _, d in v] for k, v in h.api.allocations().items()}
    assert devices["ns/c4"] == ["gpu-0-mig-3g20gb-9-4"]  # the large pod took the one 3g.20gb slot left


def test_the_order_is_memory_then_devices_then_age_and_unsized_pods_go_last() -> None:
    h = Harness({"n1": ("A100-40GB", 2)})
    h.ctl.is_leader = lambda: False  # decide nothing: only the order is looked at
    _burst(h, [(4000, 1), (4000, 2), (9000, 1), (4000, 2)])  # p0 .. p3
    h.add_pod("waiting", ["not-created-yet"])
    h.deliver()
    h.cycle()
    ages = {"waiting": 0.0, "p0": 1.0, "p1": 2.0, "p2": 3.0, "p3": 4.0}
    base = time.monotonic() - 60.0  # all waited about a minute: none is old enough to go first
    for name, first_seen in ages.items():
        h.ctl.pending[f"ns/{name}"].first_seen = base + first_seen
    h.ctl.dirty = {f"ns/{n}" for n in ages}
    order = [k.removeprefix("ns/") for k in h.ctl._decision_order()]
    # p2: one 2g.10gb (9856 MiB) > p1, p3: two 1g.5gb (9728 MiB), p1 older > p0: one 1g.5gb > unknown
    assert order == ["p2", "p1", "p3", "p0", "waiting"]
    assert h.ctl.pending["ns/p1"].size == PodSize(2 * A100["1g.5gb"], 2)
    assert h.ctl.pending["ns/p2"].size == PodSize(A100["2g.10gb"], 1)
    assert h.ctl.pending["ns/waiting"].size is None


def test_sizes_are_read_again_once_the_device_classes_change() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.ctl.is_leader = lambda: False
    _burst(h, [(4000, 1)])
    h.deliver()
    h.cycle()
    h.ctl.dirty = {"ns/p0"}
    h.ctl._decision_order()
    assert h.ctl.pending["ns/p0"].size == PodSize(A100["1g.5gb"], 1)
    cls = h.api.objects["deviceclasses"][CLASS]
    h.ctl.apply([Event("deviceclasses", "MODIFIED", obj=cls)])
    assert h.ctl.pending["ns/p0"].size is None
    h.ctl._decision_order()
    assert h.ctl.pending["ns/p0"].size == PodSize(A100["1g.5gb"], 1)


def _pod(*claims: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]},
    }


def test_pod_size_reads_mig_whole_and_shared_requests_and_skips_allocated_claims() -> None:
    d = _decider({"n": ("H100-80GB", 2, True)})  # Hopper publishes whole GPUs with MIG on
    h100 = simulated_catalog("H100-80GB")
    smallest = min(p.memory_mib for p in h100.profiles if p.memory_mib >= 9000)
    mig = claim("m", mem(9000), count=3)
    allocated = claim("done", mem(30000))
    allocated["status"] = {"allocation": {"devices": {"results": []}}}
    claims = {"ns/m": mig, "ns/w": _whole("w"), "ns/done": allocated}
    assert WHOLE in ALL_CLASSES
    size = pod_size(_pod("m", "w", "done"), claims, ALL_CLASSES, d.index)
    assert size == PodSize(3 * smallest + h100.gpu.memory_total_mib, 4)

    s = shared_decider({"h": [40960, 20480]})
    share = shared_claim("s", exactly=hami_body(memory=6000, count=2))
    assert share["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == HAMI
    assert pod_size(_pod("s"), {"ns/s": share}, SHARED_CLASSES, s.index) == PodSize(12000, 2)


def test_pod_size_is_unknown_for_claims_missing_or_refused() -> None:
    slices = node_slices("n", "A100-40GB", 1)
    inventory = Inventory(slices)
    index = CandidateIndex(inventory, CelEnvironment())
    with pytest.raises(KeyError):
        pod_size(_pod("absent"), {}, CLASSES, index)
    templated = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
    }
    with pytest.raises(ClaimsPending):
        pod_size(templated, {}, CLASSES, index)
    no_class = claim("x", mem(4000))
    no_class["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "unknown.example.com"
    assert pod_size(_pod("x"), {"ns/x": no_class}, CLASSES, index) is None
    too_big = claim("y", mem(90000))  # no A100-40GB profile is that large: nothing matches
    assert pod_size(_pod("y"), {"ns/y": too_big}, CLASSES, index) is None


class _Clock:
    """time.monotonic for the controller: the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


LARGE = 39000  # MiB: only 7g.40gb holds it, the whole A100-40GB
MID = 19000  # MiB: a 3g.20gb


def _oldest_pending_s(h: Harness) -> float | None:
    return h.ctl.metrics.registry.get_sample_value("flexmig_controller_oldest_pending_pod_seconds")


@pytest.mark.parametrize("ageing", [True, False])
def test_a_steady_supply_of_large_pods_cannot_starve_an_old_mid_sized_pod(
    monkeypatch: pytest.MonkeyPatch, ageing: bool
) -> None:
    """One A100-40GB held by a 7g.40gb pod; a 3g.20gb pod waits. Every 30 s the running large pod
    ends and a new large pod arrives: largest first hands it the freed GPU each time. Once the mid
    pod has waited AGE_FIRST_AFTER_S it is decided first and gets its instance (without ageing, the
    premise: it never does)."""
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    h = Harness({"n1": ("A100-40GB", 1)})
    if not ageing:
        h.ctl.age_first_after_s = float("inf")
    h.add_claim(claim("big0", mem(LARGE)))
    h.add_pod("big0", ["big0"])
    h.deliver()
    h.cycle()
    assert not h.gated("big0")
    clock.now += 1.0
    h.add_claim(claim("mid", mem(MID)))
    h.add_pod("mid", ["mid"])
    h.deliver()
    h.cycle()
    assert h.gated("mid")
    assert _oldest_pending_s(h) == 0.0
    rounds = int(AGE_FIRST_AFTER_S // 30) + 2
    for r in range(1, rounds + 1):
        clock.now += 30.0
        waited = 30.0 * r
        assert _oldest_pending_s(h) == waited
        h.api.delete_object("pods", f"ns/big{r - 1}")  # the running large pod ends ...
        h.add_claim(claim(f"big{r}", mem(LARGE)))  # ... as a new one arrives
        h.add_pod(f"big{r}", [f"big{r}"])
        h.deliver()
        h.cycle()  # the new pod does not fit yet; the ended pod's claim is deallocated
        h.deliver()
        h.cycle()  # every waiting pod decided on the freed GPU
        if ageing and waited >= AGE_FIRST_AFTER_S:
            assert not h.gated("mid") and h.gated(f"big{r}"), f"round {r}"
            assert _oldest_pending_s(h) == 0.0  # the waiting large pod was first seen just now
            break
        assert h.gated("mid") and not h.gated(f"big{r}"), f"round {r}"
    else:
        assert not ageing, "the mid-sized pod was never decided first"
    assert not h.api.audit()
