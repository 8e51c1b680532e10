"""Issue 12: the one-device MIG pods dirty in one step follow an exact plan over the burst
(controller/allocation/loop.py `Controller._plan_burst`, driver/policy/placer.py `Placer.plan_burst`)."""

from __future__ import annotations

from collections.abc import Sequence

from ctl_helpers import claim, mem
from fake_apiserver import Harness

from driver.policy.cluster import ClusterState
from driver.policy.placer import Placer, PodSize

# Two 3g.40gb and four 2g.20gb pods fit two H100-80GBs only as 2g@0 + 2g@2 + 3g@4 on each; decided
# largest first, pod by pod, both 3g.40gb go to one GPU (at 0 and 4), and the other takes only three
# of the four 2g.20gb.
BURST = [30000, 30000, 19000, 19000, 16000, 16000]


class NoPlan(Placer):
    """The controller before the burst plan: largest first, pod by pod."""

    __slots__ = ()

    def plan_burst(self, cluster: ClusterState, sizes: Sequence[PodSize | None]) -> int:
        return 0


class Spy(Placer):
    """flexmig's placer, recording how many pods each step's plan placed."""

    __slots__ = ("planned",)

    def __init__(self) -> None:
        super().__init__()
        self.planned: list[int] = []

    def plan_burst(self, cluster: ClusterState, sizes: Sequence[PodSize | None]) -> int:
        self.planned.append(super().plan_burst(cluster, sizes))
        return self.planned[-1]


def _burst(h: Harness, sizes: Sequence[int]) -> None:
    for i, mib in enumerate(sizes):
        h.add_claim(claim(f"c{i}", mem(mib)))
        h.add_pod(f"p{i}", [f"c{i}"])


def test_without_the_plan_one_pod_of_the_burst_waits() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer = NoPlan()
    _burst(h, BURST)
    h.deliver()
    h.cycle()
    assert sum(h.gated(f"p{i}") for i in range(len(BURST))) == 1


def test_a_burst_decided_in_one_step_follows_the_plan_and_all_of_it_fits() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer = spy = Spy()
    _burst(h, BURST)
    h.deliver()
    h.cycle()
    assert spy.planned == [len(BURST)]
    assert [h.gated(f"p{i}") for i in range(len(BURST))] == [False] * len(BURST)
    assert not h.ctl.pending
    assert not h.api.audit()
    devices = sorted(d for v in h.api.allocations().values() for _, d in v)
    assert sum("3g40gb" in d and d.endswith("-4") for d in devices) == 2  # each 3g.40gb at start 4
    assert not h.ctl.placer._planned  # the plan lived for the step only
    planned = h.ctl.metrics.registry.get_sample_value(
        "flexmig_controller_burst_plan_seconds_count", {"outcome": "planned"}
    )
    assert planned == 1.0


def test_pods_of_several_devices_or_kinds_are_not_planned() -> None:
    sizes = [PodSize(40448, 1, mig=True), PodSize(40448, 2, mig=True), PodSize(20096, 1, mig=False)]
    h = Harness({"n1": ("H100-80GB", 2)})
    assert h.ctl.placer.plan_burst(h.ctl.ledger.cluster, sizes) == 0  # one plannable pod: no plan
    assert h.ctl.placer.plan_burst(h.ctl.ledger.cluster, [*sizes, PodSize(20096, 1, mig=True)]) == 2
    h.ctl.placer.end_burst()


def test_a_step_with_one_plannable_pod_spends_no_time_planning() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer = spy = Spy()
    _burst(h, [30000])
    h.deliver()
    h.cycle()
    assert spy.planned == []  # not even asked
    assert not h.gated("p0")
    for outcome in ("planned", "skipped", "failed"):
        count = h.ctl.metrics.registry.get_sample_value(
            "flexmig_controller_burst_plan_seconds_count", {"outcome": outcome}
        )
        assert not count
