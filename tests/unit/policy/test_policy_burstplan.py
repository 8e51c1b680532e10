"""Issue 12: a burst's plain one-device pods placed by an exact plan (driver/policy/burstplan.py),
through driver/policy/batch.py `place_batch`."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.choice import candidate_profiles
from driver.placement.occupancy import Occupancy
from driver.policy import batch, burstplan
from driver.policy.allocator import FirstFitPolicy, PackingPolicy
from driver.policy.batch import place_batch
from driver.policy.burstplan import plain, plan_burst
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, EndHint, GpuRef, GpuState, Placement
from driver.policy.placer import Placer, PodSize

H100 = simulated_catalog("H100-80GB")
A100 = simulated_catalog("A100-40GB")
MIB = {p.name: p.memory_mib for p in H100.profiles}

# Two 3g.40gb and four 2g.20gb pods on H100-80GBs: both GPUs of the optimum hold 2g@0 + 2g@2 + 3g@4,
# but largest first puts the two 3g.40gb on one GPU (at 0 and 4: the policy's cheapest, it keeps the
# other GPUs whole), and the four 2g.20gb (at most three per GPU) then take two more.
SMALL_FIRST = [16000, 16000, 19000, 19000, 30000, 30000]


def cluster_of(catalog: GpuCatalog, gpus: int, nodes_of: int = 4) -> ClusterState:
    return ClusterState(
        GpuState(GpuRef(f"node-{i // nodes_of}", i % nodes_of), catalog, Occupancy.for_catalog(catalog))
        for i in range(gpus)
    )


def pods_of(sizes: Sequence[int]) -> list[list[DeviceRequest]]:
    return [[DeviceRequest(f"p{i}", s)] for i, s in enumerate(sizes)]


def used(cluster: ClusterState) -> int:
    return sum(1 for g in cluster.gpus() if not g.occupancy.is_empty)


def commit_all(cluster: ClusterState, placements: Sequence[Placement]) -> None:
    """Commit every successful placement (OccupancyError if two collide or one is illegal)."""
    for p in placements:
        if p.ok:
            cluster.commit(p.choices)


def snapshot(cluster: ClusterState) -> list[tuple[GpuRef, tuple[tuple[str, int], ...]]]:
    return [
        (g.ref, tuple(sorted((i.profile.name, i.start) for i in g.occupancy.instances)))
        for g in cluster.gpus()
    ]


def test_largest_first_opens_a_third_h100_for_the_small_first_burst() -> None:
    """The premise: without the plan, the burst takes three GPUs."""
    cluster = cluster_of(H100, 6)
    placements = place_batch(PackingPolicy(), cluster, pods_of(SMALL_FIRST), exact=False)
    assert all(p.ok for p in placements)
    commit_all(cluster, placements)
    assert used(cluster) == 3


def test_the_plan_places_the_small_first_burst_on_two_h100s() -> None:
    cluster = cluster_of(H100, 6)
    before = snapshot(cluster)
    placements = place_batch(PackingPolicy(), cluster, pods_of(SMALL_FIRST))
    assert snapshot(cluster) == before  # decided, nothing changed
    assert [p.choices[0].request for p in placements] == [f"p{i}" for i in range(6)]
    commit_all(cluster, placements)
    assert used(cluster) == 2
    layouts = {
        tuple(sorted((i.profile.name, i.start) for i in g.occupancy.instances)) for g in cluster.gpus()
    }
    assert (("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)) in layouts
    # GPUs of one state are taken in name order.
    assert {c.gpu for p in placements for c in p.choices} == {GpuRef("node-0", 0), GpuRef("node-0", 1)}


def test_the_plan_is_deterministic() -> None:
    requests = [DeviceRequest(f"p{i}", s) for i, s in enumerate(SMALL_FIRST * 3)]
    first = plan_burst(PackingPolicy(), cluster_of(H100, 8), requests)
    again = plan_burst(PackingPolicy(), cluster_of(H100, 8), requests)
    assert first is not None and first == again


@pytest.mark.parametrize("seed", range(12))
def test_plans_are_legal_consistent_and_place_at_least_what_largest_first_does(seed: int) -> None:
    """Random bursts on partly filled clusters: every planned choice serves its request with a
    profile the request may take, all of them commit together (each state of every GPU legal), and
    the plan places at least as much memory as largest first."""
    rng = random.Random(seed)
    catalog = H100 if seed % 2 else A100
    largest = max(p.memory_mib for p in catalog.profiles)
    sizes = [m for m in (4000, 8000, 16000, 19000, 30000, 39000, 70000) if m <= largest]
    gpus = rng.randint(2, 6)
    policy = PackingPolicy()

    def fresh() -> ClusterState:
        cluster = cluster_of(catalog, gpus, nodes_of=2)
        for _ in range(rng_fill.randint(0, 2 * gpus)):
            placement = policy.place(cluster, [DeviceRequest("x", rng_fill.choice(sizes))])
            if placement.ok:
                cluster.commit(placement.choices)
        return cluster

    burst = [rng.choice(sizes) for _ in range(rng.randint(2, 3 * gpus))]
    rng_fill = random.Random(seed)
    planned_on = fresh()
    rng_fill = random.Random(seed)
    greedy_on = fresh()
    assert snapshot(planned_on) == snapshot(greedy_on)
    requests = [DeviceRequest(f"p{i}", s) for i, s in enumerate(burst)]
    plan = plan_burst(policy, planned_on, requests, time_budget_s=30.0)
    assert plan is not None
    for request, choice in zip(requests, plan, strict=True):
        if choice is None:
            continue
        assert choice.request == request.name
        assert choice.profile in candidate_profiles(
            planned_on.gpu(choice.gpu).catalog.profiles, request.memory_mib
        )
    planned = [c for c in plan if c is not None]
    planned_on.commit(planned)
    greedy = place_batch(policy, greedy_on, pods_of(burst), exact=False)
    commit_all(greedy_on, greedy)
    planned_mib = sum(r.memory_mib for r, c in zip(requests, plan, strict=True) if c is not None)
    greedy_mib = sum(r.memory_mib for r, p in zip(requests, greedy, strict=True) if p.ok)
    assert planned_mib >= greedy_mib
    # A left-out request fits nowhere on what the plan leaves (else placing it would add memory).
    for request, choice in zip(requests, plan, strict=True):
        if choice is None:
            assert not policy.place(planned_on, [request]).ok


def test_fallback_when_over_budget_or_too_large() -> None:
    requests = [DeviceRequest(f"p{i}", s) for i, s in enumerate(SMALL_FIRST)]
    assert plan_burst(PackingPolicy(), cluster_of(H100, 6), requests, max_completions=5) is None
    assert plan_burst(PackingPolicy(), cluster_of(H100, 6), requests, time_budget_s=0.0) is None
    assert plan_burst(PackingPolicy(), cluster_of(H100, 6), requests[:1]) is None  # one pod: no burst


def test_place_batch_without_a_plan_is_largest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A skipped plan (here: always) leaves today's behaviour, pod for pod."""
    monkeypatch.setattr(batch, "plan_burst", lambda *_args, **_kw: None)
    skipped = place_batch(PackingPolicy(), cluster_of(H100, 6), pods_of(SMALL_FIRST))
    greedy = place_batch(PackingPolicy(), cluster_of(H100, 6), pods_of(SMALL_FIRST), exact=False)
    assert skipped == greedy


def test_first_fit_is_never_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("planned")

    monkeypatch.setattr(batch, "plan_burst", refuse)
    placements = place_batch(FirstFitPolicy(), cluster_of(H100, 6), pods_of(SMALL_FIRST))
    assert all(p.ok for p in placements)


def test_only_plain_pods_are_planned() -> None:
    only_h100 = frozenset({(p.name, pl.start) for p in H100.profiles for pl in p.placements})
    assert plain([DeviceRequest("a", 4000)])
    assert not plain([DeviceRequest("a", 0)])
    assert not plain([DeviceRequest("a", 4000), DeviceRequest("b", 4000)])
    assert not plain([DeviceRequest("a", 4000, pinned_profile="1g.10gb")])
    assert not plain([DeviceRequest("a", 4000, preferred_profile="1g.10gb")])
    assert not plain([DeviceRequest("a", 4000, models=frozenset({"H100-80GB"}))])
    assert not plain([DeviceRequest("a", 4000, device_filter=lambda _ref: only_h100)])
    with pytest.raises(ValueError):
        plan_burst(
            PackingPolicy(), cluster_of(H100, 2), [DeviceRequest("a", 4000, pinned_profile="1g.10gb")] * 2
        )


def test_pinned_and_filtered_pods_are_decided_by_the_policy_first() -> None:
    """The burst's other pods go first, largest first, per pod: their placements are what the policy
    gives them on the empty cluster (in that order); the plan then takes the rest."""
    policy = PackingPolicy()
    node1 = GpuRef("node-1", 0)
    filt = lambda ref: None if ref == node1 else frozenset()  # noqa: E731 - one GPU only
    pinned = [DeviceRequest("pinned", 4000, pinned_profile="3g.40gb")]
    filtered = [DeviceRequest("filtered", 16000, device_filter=filt)]
    pods = [pinned, *pods_of(SMALL_FIRST), filtered]
    cluster = cluster_of(H100, 8)
    placements = place_batch(policy, cluster, pods)
    alone = cluster_of(H100, 8)
    for pod in (filtered, pinned):  # per pod, largest (most memory) first
        expected = policy.place(alone, pod)
        got = placements[pods.index(pod)]
        assert got == expected
        alone.commit(expected.choices)
    assert placements[0].choices[0].profile.name == "3g.40gb"
    assert placements[-1].choices[0].gpu == node1
    commit_all(cluster, placements)  # all consistent
    assert all(p.ok for p in placements)


def test_a_plan_uses_states_not_gpus() -> None:
    """Forty pods on forty empty GPUs: one state, so the program stays small and fast."""
    rng = random.Random(7)
    sizes = [rng.choice((4000, 8000, 16000, 19000, 30000, 39000, 70000)) for _ in range(40)]
    cluster = cluster_of(H100, 40)
    requests = [DeviceRequest(f"p{i}", s) for i, s in enumerate(sizes)]
    plan = plan_burst(PackingPolicy(), cluster, requests, time_budget_s=30.0)
    assert plan is not None and all(c is not None for c in plan)
    choices: list[Choice] = [c for c in plan if c is not None]
    cluster.commit(choices)
    assert len({c.gpu for c in choices}) == used(cluster)
    assert burstplan.MAX_COMPLETIONS > 3000


def test_the_placer_follows_the_plan_only_where_it_still_holds() -> None:
    policy = PackingPolicy()
    placer = Placer(policy)
    cluster = cluster_of(H100, 6)
    big, small = MIB["3g.40gb"], MIB["2g.20gb"]
    sizes = [PodSize(m, 1, plan_key="job") for m in (big, big, small, small, small, small)]
    assert placer.burst_group([*sizes, PodSize(big, 2), None]) == list(range(6))
    assert placer.plan_burst(cluster, sizes) == 6
    request = DeviceRequest("r", big)
    # Only a pod the plan placed follows it.
    assert placer.mig(cluster, [request]) == policy.place(cluster, [request])
    placer.follow_plan(True)
    first = placer.mig(cluster, [request]).choices[0]
    assert (first.profile.name, first.start) == ("3g.40gb", 4)
    # A planned slot taken (here: by this pod's commit) is passed over: the next one of the size,
    # on another GPU, where the policy alone would fill the first GPU.
    cluster.commit([first])
    second = placer.mig(cluster, [request]).choices[0]
    alone = policy.place(cluster, [request]).choices[0]
    assert (alone.gpu, alone.start) == (first.gpu, 0)
    assert second.gpu != first.gpu and second.start == 4
    # Selectors that exclude every planned GPU, a hint, or two devices: the policy decides.
    planned_gpus = {first.gpu, second.gpu}
    elsewhere = DeviceRequest(
        "e", big, device_filter=lambda ref: frozenset() if ref in planned_gpus else None
    )
    assert placer.mig(cluster, [elsewhere]) == policy.place(cluster, [elsewhere])
    hinted = DeviceRequest("h", big, end_hint=EndHint(100.0, 10.0))
    assert placer.mig(cluster, [hinted]) == policy.place(cluster, [hinted])
    pair = [DeviceRequest("a", big), DeviceRequest("b", small)]
    assert placer.mig(cluster, pair) == policy.place(cluster, pair)
    placer.end_burst()
    assert placer.mig(cluster, [request]) == policy.place(cluster, [request])
    placer.follow_plan(True)  # a pod marked to follow, with no plan held: the policy decides
    assert placer.mig(cluster, [request]) == policy.place(cluster, [request])
