"""Issue 12: the one-device MIG pods dirty in one step follow an exact plan over the burst
(controller/allocation/burststep.py `BurstPlanning.plan`, driver/policy/placer.py `Placer.plan_burst`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctl_helpers import claim, mem
from fake_apiserver import Harness

from api.constants import DRIVER_NAME
from driver.policy.burstplan import MAX_BURST_PODS
from driver.policy.cluster import ClusterState
from driver.policy.placer import Placer, PodSize

# Two 3g.40gb and four 2g.20gb pods fit two H100-80GBs only as 2g@0 + 2g@2 + 3g@4 on each; decided
# largest first, pod by pod, both 3g.40gb go to one GPU (at 0 and 4), and the other takes only three
# of the four 2g.20gb.
BURST = [30000, 30000, 19000, 19000, 16000, 16000]


class NoPlan(Placer):
    """The controller before the burst plan: largest first, pod by pod."""

    __slots__ = ()

    def burst_group(self, sizes: Sequence[PodSize | None]) -> list[int]:
        return []


class Spy(Placer):
    """flexmig's placer, recording how many pods each step's plan placed."""

    __slots__ = ("planned",)

    def __init__(self) -> None:
        super().__init__()
        self.planned: list[int] = []

    def plan_burst(
        self, cluster: ClusterState, sizes: Sequence[PodSize], node_ok: Callable[[str], bool] | None = None
    ) -> int:
        self.planned.append(super().plan_burst(cluster, sizes, node_ok))
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


def test_only_one_device_pods_of_one_plan_key_form_a_burst() -> None:
    placer = Placer()
    job = [PodSize(40448, 1, plan_key="job"), PodSize(20096, 1, plan_key="job")]
    others = [PodSize(40448, 2), PodSize(20096, 1), None, PodSize(0, 1, plan_key="job")]
    assert placer.burst_group([others[0], job[0], others[1], job[1], others[2], others[3]]) == [1, 3]
    assert placer.burst_group([job[0], *others]) == []  # one plannable pod: no plan
    # Two keys (say, one pod may run on one node only): a plan for either would not see the other.
    assert placer.burst_group([*job, PodSize(20096, 1, plan_key="other")]) == []
    many = [PodSize(4000, 1, plan_key="job")] * (MAX_BURST_PODS + 5)
    assert placer.burst_group(many) == list(range(MAX_BURST_PODS))
    assert Placer(burst_budget_s=0).burst_group(job) == []


def test_pods_with_other_node_constraints_are_not_planned_and_do_not_follow() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer = spy = Spy()
    for i, mib in enumerate(BURST[:2]):
        h.add_claim(claim(f"c{i}", mem(mib)))
        h.add_pod(f"p{i}", [f"c{i}"])
    h.add_claim(claim("c9", mem(16000)))
    h.add_pod("p9", ["c9"], metadata={"annotations": {"gpu.flexmig.dev/expected-duration": "1h"}})
    h.deliver()
    h.cycle()
    assert spy.planned == [2]  # the hinted pod is priced with its hint, so it is not planned
    assert not any(h.gated(p) for p in ("p0", "p1", "p9"))


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


def test_selectors_that_ask_more_than_memory_are_not_planned() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    index = h.ctl.index
    assert index.memory_only((mem(30000),))
    profile = f'device.attributes["{DRIVER_NAME}"].profile == "3g.40gb"'
    assert not index.memory_only((mem(30000), profile))  # 4g.40gb (same memory) excluded
    start = f'device.attributes["{DRIVER_NAME}"].placementStart > 2'
    assert not index.memory_only((start,))
    h.ctl.placer = spy = Spy()
    for i in range(2):
        h.add_claim(claim(f"c{i}", f"{mem(30000)} && {profile}"))
        h.add_pod(f"p{i}", [f"c{i}"])
    h.deliver()
    h.cycle()
    assert spy.planned == []
    assert not any(h.gated(f"p{i}") for i in range(2))


def test_pods_with_different_node_constraints_get_no_plan() -> None:
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer = spy = Spy()
    for i, mib in enumerate(BURST[:3]):
        h.add_claim(claim(f"c{i}", mem(mib)))
        h.add_pod(f"p{i}", [f"c{i}"])
    pod = dict(h.api.objects["pods"]["ns/p2"])
    pod["spec"] = {**pod["spec"], "nodeSelector": {"pool": "a"}}
    h.api.put_object("pods", pod)
    h.deliver()
    h.cycle()
    assert spy.planned == []  # a plan for p0, p1 would not see where p2 may go
    assert not h.gated("p0") and not h.gated("p1")
    assert h.gated("p2")  # n1 has no such label
