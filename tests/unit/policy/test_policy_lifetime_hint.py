"""Lifetime hints: the co-location term, its bookkeeping in ClusterState, and the fast path's equality
with the plain reference scan when hints are in play (reference_policy.py writes the term out plainly).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_policy import ReferencePackingPolicy, decide_alike, release_random, same, twin
from test_policy_scale_equivalence import _gpus, _requests, _table

from driver.catalog.simulated import simulated_catalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, EndHint, GpuRef, GpuState


def _cluster(gpus: int) -> ClusterState:
    cat = simulated_catalog("A100-40GB")
    return ClusterState(GpuState(GpuRef("n0", i), cat, Occupancy.for_catalog(cat)) for i in range(gpus))


def _hint(now: float, end: float) -> EndHint:
    return EndHint(end, end - now)


def test_hinted_pod_joins_the_gpu_whose_hinted_instances_end_no_earlier() -> None:
    # Two GPUs, each with one 1g instance at start 0 (same state), ending at 100 and at 10.
    cluster = _cluster(2)
    policy = PackingPolicy()
    for gpu, end in ((0, 10.0), (1, 100.0)):
        ref = GpuRef("n0", gpu)
        profile = cluster.gpu(ref).catalog.profile("1g.5gb")
        assert profile is not None
        cluster.set_occupancy(ref, cluster.gpu(ref).occupancy.place(profile, 0))
        cluster.set_expected_end(ref, 0, end)
    assert cluster.state_of(GpuRef("n0", 0)) is cluster.state_of(GpuRef("n0", 1))
    unhinted = policy.place(cluster, [DeviceRequest("b", 4000)])
    assert unhinted.choices[0].gpu == GpuRef("n0", 0)  # without a hint: the old tie-break (index)
    hinted = policy.place(cluster, [DeviceRequest("b", 4000, end_hint=_hint(0.0, 90.0))])
    assert hinted.choices[0].gpu == GpuRef("n0", 1)  # on GPU 0 it would keep it busy 80 s longer
    # Ending before both: no delay on either, so the old decision again.
    early = policy.place(cluster, [DeviceRequest("b", 4000, end_hint=_hint(0.0, 5.0))])
    assert early.choices[0].gpu == GpuRef("n0", 0)


def test_devices_of_one_hinted_pod_stay_together_so_the_other_gpu_frees_early() -> None:
    # Both GPUs hold a 1g instance at start 0 ending at t=10; a two-device pod ends at t=100.
    cluster = _cluster(2)
    for gpu in (0, 1):
        ref = GpuRef("n0", gpu)
        profile = cluster.gpu(ref).catalog.profile("1g.5gb")
        assert profile is not None
        cluster.set_occupancy(ref, cluster.gpu(ref).occupancy.place(profile, 0))
        cluster.set_expected_end(ref, 0, 10.0)
    pod = [DeviceRequest(name, 4000) for name in ("a", "b")]
    # Without hints capacity loss spreads the two devices over both GPUs.
    assert {c.gpu.gpu_index for c in PackingPolicy().place(cluster, pod).choices} == {0, 1}
    # With one, the first device makes GPU 0 end at 100 (the pod's own end), so the second one joins
    # it there for free instead of keeping GPU 1 busy 90 s past t=10.
    # (A weight of 1: the default is too small to outweigh this capacity loss.)
    hint = _hint(0.0, 100.0)
    hinted = [dataclasses.replace(r, end_hint=hint) for r in pod]
    got = PackingPolicy(hint_weight=1.0).place(cluster, hinted)
    assert {c.gpu.gpu_index for c in got.choices} == {0}
    assert ReferencePackingPolicy(hint_weight=1.0).place(cluster, hinted) == got


def test_colocation_term_is_the_capped_share_of_the_pod_time_it_delays_the_gpu() -> None:
    policy = PackingPolicy(hint_weight=2.0)
    hint = _hint(0.0, 100.0)
    assert policy.colocation(hint, None) == 0.0
    assert policy.colocation(hint, 100.0) == 0.0
    assert policy.colocation(hint, 150.0) == 0.0
    assert policy.colocation(hint, 75.0) == pytest.approx(0.5)
    assert policy.colocation(hint, -500.0) == 2.0  # capped at one lifetime
    with pytest.raises(ValueError):
        PackingPolicy(hint_weight=-1.0)
    with pytest.raises(ValueError):
        EndHint(10.0, 0.0)


def test_cluster_state_tracks_hinted_ends_through_commit_release_and_set_occupancy() -> None:
    cluster = _cluster(1)
    ref = GpuRef("n0", 0)
    profile = cluster.gpu(ref).catalog.profile("1g.5gb")
    assert profile is not None
    assert not cluster.hinted and cluster.latest_end(ref) is None
    choice = PackingPolicy().place(cluster, [DeviceRequest("a", 4000)]).choices
    cluster.commit(choice)  # unhinted: nothing recorded
    assert not cluster.hinted
    cluster.set_expected_end(ref, choice[0].start, 50.0)
    other = PackingPolicy().place(cluster, [DeviceRequest("b", 4000)]).choices
    cluster.commit(other, expected_end=20.0)
    assert cluster.latest_end(ref) == 50.0
    cluster.release(ref, choice[0].profile, choice[0].start)
    assert cluster.latest_end(ref) == 20.0
    cluster.set_occupancy(ref, Occupancy.for_catalog(cluster.gpu(ref).catalog))  # instances gone
    assert not cluster.hinted and cluster.latest_end(ref) is None
    with pytest.raises(ValueError):
        cluster.set_expected_end(ref, 0, 1.0)


def _hinted_requests(
    rng: random.Random, cluster: ClusterState, table: dict[GpuRef, frozenset[tuple[str, int]]], now: float
) -> list[DeviceRequest]:
    requests = _requests(rng, cluster, table)
    if rng.random() < 0.25:
        return requests  # unhinted pods in a hinted cluster keep their term-free price
    # Ends from a coarse grid, so GPUs share ends and terms tie; sometimes far out (term capped).
    end = now + rng.choice((5.0, 10.0, 20.0, 40.0, 80.0, 1000.0))
    hint = EndHint(end, end - now)
    return [dataclasses.replace(r, end_hint=hint) for r in requests]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.05, 0.3, 1.0, 20.0]))
def test_hinted_decisions_equal_the_plain_scan(seed: int, weight: float) -> None:
    rng = random.Random(seed)
    gpus = _gpus(rng)
    fast_cluster, ref_cluster = twin(gpus)
    # Hint some of the fill's instances (some GPUs keep unhinted ones beside hinted ones).
    for gpu in gpus:
        for inst in gpu.occupancy.instances:
            if rng.random() < 0.6:
                end = rng.choice((10.0, 20.0, 40.0, 60.0))
                for cluster in (fast_cluster, ref_cluster):
                    cluster.set_expected_end(gpu.ref, inst.start, end)
    table = _table(rng, gpus)
    fast, ref = PackingPolicy(hint_weight=weight), ReferencePackingPolicy(hint_weight=weight)
    now = 0.0
    for _ in range(12):
        now += rng.choice((0.0, 5.0))
        requests = _hinted_requests(rng, fast_cluster, table, now)
        decide_alike(fast, ref, fast_cluster, ref_cluster, requests)
        for _ in range(rng.randint(0, 2)):
            release_random(rng, gpus, fast_cluster, ref_cluster)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_unhinted_pods_decide_as_if_no_hint_existed(seed: int) -> None:
    """Hints of running pods change nothing for a pod without one."""
    rng = random.Random(seed)
    gpus = _gpus(rng)
    plain = ClusterState(gpus)
    hinted = ClusterState(dataclasses.replace(g) for g in gpus)
    for gpu in gpus:
        for inst in gpu.occupancy.instances:
            hinted.set_expected_end(gpu.ref, inst.start, rng.choice((10.0, 20.0, 40.0)))
    table = _table(rng, gpus)
    policy = PackingPolicy(hint_weight=5.0)
    for _ in range(8):
        requests = _requests(rng, plain, table)
        got = policy.place(hinted, requests)
        same(got, policy.place(plain, requests))
        if got.ok:
            plain.commit(got.choices)
            hinted.commit(got.choices, expected_end=rng.choice((5.0, 50.0)))


def test_benchmark_without_hints_is_the_plain_online_run_and_exact_hints_change_it() -> None:
    from benchmarks.packing import hints, online  # in the repository: a failed import is a failure

    scenario = online.SCENARIOS[0]
    pods = online.generate(scenario, 1.1, 120, 0)
    plain = online.run_policy(PackingPolicy(), scenario, pods)
    none = hints.run_hinted(PackingPolicy(), scenario, pods, hints.hinted_lifetimes(pods, "none", 0))
    assert none.outcome == plain
    exact = hints.run_hinted(
        PackingPolicy(hint_weight=1.0), scenario, pods, hints.hinted_lifetimes(pods, "exact", 0)
    )
    assert exact.outcome.refused_by_size != plain.refused_by_size  # the hints reached the policy
    with pytest.raises(ValueError):
        hints.hinted_lifetimes(pods, "psychic", 0)
