"""The allocation policy on simulated catalogs: choices, all-or-nothing, reasons, invariants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import FirstFitPolicy, PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, GpuRef, GpuState, ShortReason


def _catalog(model: str) -> GpuCatalog:
    return simulated_catalog(model)


def _cluster(*nodes: tuple[str, list[str]]) -> ClusterState:
    gpus = []
    for node, models in nodes:
        for index, model in enumerate(models):
            cat = _catalog(model)
            gpus.append(GpuState(GpuRef(node, index), cat, Occupancy.for_catalog(cat)))
    return ClusterState(gpus)


def _place(cluster: ClusterState, gpu: GpuRef, profile: str, start: int) -> None:
    state = cluster.gpu(gpu)
    prof = state.catalog.profile(profile)
    assert prof is not None
    cluster.set_occupancy(gpu, state.occupancy.place(prof, start))


def test_3g_on_empty_a100_goes_to_start_4_keeping_the_4g_placeable() -> None:
    cluster = _cluster(("n0", ["A100-40GB"]))
    result = PackingPolicy().place(cluster, [DeviceRequest("r", 19000)])
    assert result.ok
    (choice,) = result.choices
    assert (choice.profile.name, choice.start) == ("3g.20gb", 4)


def test_small_request_goes_to_the_gpu_where_it_wastes_least() -> None:
    cluster = _cluster(("big", ["H200-141GB"]), ("small", ["A100-40GB"]))
    result = PackingPolicy().place(cluster, [DeviceRequest("r", 4000)])
    assert result.ok and result.node == "small"
    assert result.choices[0].profile.name == "1g.5gb"


def test_partly_used_gpu_is_filled_before_an_empty_one() -> None:
    cluster = _cluster(("n0", ["A100-40GB", "A100-40GB"]))
    _place(cluster, GpuRef("n0", 1), "3g.20gb", 4)
    result = PackingPolicy().place(cluster, [DeviceRequest("r", 4000)])
    assert result.ok and result.choices[0].gpu == GpuRef("n0", 1)


def test_multi_device_pod_lands_on_one_node_or_nowhere() -> None:
    cluster = _cluster(("n0", ["A100-40GB"]), ("n1", ["A100-40GB"]))
    _place(cluster, GpuRef("n0", 0), "4g.20gb", 0)
    _place(cluster, GpuRef("n1", 0), "4g.20gb", 0)
    # Each node has room for one 3g-sized device only: the pair cannot be split across nodes.
    result = PackingPolicy().place(cluster, [DeviceRequest("a", 19000), DeviceRequest("b", 19000)])
    assert not result.ok
    assert result.reason is ShortReason.NO_SINGLE_NODE
    # (4g + 3g use all 7 compute slices, so not even a 1g joins the 3g on either node.)
    bigger = _cluster(("n0", ["A100-40GB"]), ("n1", ["A100-40GB"]), ("n2", ["A100-40GB"]))
    _place(bigger, GpuRef("n0", 0), "4g.20gb", 0)
    ok = PackingPolicy().place(bigger, [DeviceRequest("a", 19000), DeviceRequest("b", 19000)])
    assert ok.ok and {c.gpu.node for c in ok.choices} in ({"n1"}, {"n2"})


@pytest.mark.parametrize(
    ("setup", "memory", "reason"),
    [
        ([], 100_000, ShortReason.NO_PROFILE_BIG_ENOUGH),
        ([("7g.40gb", 0)], 4000, ShortReason.NO_FREE_PLACEMENT),
        ([("1g.5gb", 1), ("1g.5gb", 5)], 19000, ShortReason.FRAGMENTED),
    ],
)
def test_failure_reasons_name_what_is_short(
    setup: list[tuple[str, int]], memory: int, reason: ShortReason
) -> None:
    cluster = _cluster(("n0", ["A100-40GB"]))
    for profile, start in setup:
        _place(cluster, GpuRef("n0", 0), profile, start)
    for policy in (PackingPolicy(), FirstFitPolicy()):
        result = policy.place(cluster, [DeviceRequest("r", memory)])
        assert result.reason is reason, result.message
        assert "r" in result.message


def test_pinned_profile_is_honoured_and_models_restrict() -> None:
    cluster = _cluster(("a", ["A100-40GB"]), ("h", ["H100-80GB"]))
    pinned = PackingPolicy().place(cluster, [DeviceRequest("r", 0, pinned_profile="2g.20gb")])
    assert pinned.ok and pinned.choices[0].profile.name == "2g.20gb" and pinned.node == "h"
    only_h100 = PackingPolicy().place(cluster, [DeviceRequest("r", 4000, models=frozenset({"H100-80GB"}))])
    assert only_h100.ok and only_h100.node == "h"


_SIZES = st.sampled_from([4000, 8000, 16000, 19000, 30000, 39000, 70000])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("alloc"), st.lists(_SIZES, min_size=1, max_size=3)),
            st.tuples(st.just("free"), st.integers(min_value=0, max_value=50)),
        ),
        max_size=40,
    ),
    first_fit=st.booleans(),
)
def test_random_allocate_release_never_overlaps_or_drifts(
    ops: list[tuple[str, object]], first_fit: bool
) -> None:
    cluster = _cluster(("n0", ["A100-40GB", "H100-80GB"]), ("n1", ["H200-141GB", "A100-80GB"]))
    policy = FirstFitPolicy() if first_fit else PackingPolicy()
    live: list[tuple[GpuRef, str, int]] = []
    for kind, arg in ops:
        if kind == "alloc":
            assert isinstance(arg, list)
            result = policy.place(cluster, [DeviceRequest(f"d{i}", m) for i, m in enumerate(arg)])
            if result.ok:
                assert len(result.choices) == len(arg)
                assert len({c.gpu.node for c in result.choices}) == 1
                # commit re-checks every rule through Occupancy and raises on any overlap
                cluster.commit(result.choices)
                live += [(c.gpu, c.profile.name, c.start) for c in result.choices]
        elif live:
            assert isinstance(arg, int)
            gpu, name, start = live.pop(arg % len(live))
            profile = cluster.gpu(gpu).catalog.profile(name)
            assert profile is not None
            cluster.release(gpu, profile, start)
        for gpu in cluster.gpus():
            masks = [i.mask for i in gpu.occupancy.instances]
            assert sum(m.bit_count() for m in masks) == bin(sum(masks)).count("1")  # disjoint
            assert gpu.occupancy.used_compute_slices <= gpu.catalog.compute_slices
    fresh = ClusterState(cluster.gpus())
    assert fresh.total == cluster.total  # incremental capacity bookkeeping matches a recount
