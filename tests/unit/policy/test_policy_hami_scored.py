"""HAMi's two reference policies on flexmig's cluster state: v2.10 (driver/policy/hami.py) and after
pull request 2855 (driver/policy/hami_scored.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.catalog.simulated import simulated_catalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import Policy
from driver.policy.cluster import ClusterState
from driver.policy.explain import any_free
from driver.policy.hami import HamiPolicy
from driver.policy.hami_scored import HamiScoredPolicy
from driver.policy.model import DeviceRequest, GpuRef, GpuState


def _cluster(*nodes: tuple[str, list[str]]) -> ClusterState:
    gpus = []
    for node, models in nodes:
        for index, model in enumerate(models):
            catalog = simulated_catalog(model)
            gpus.append(GpuState(GpuRef(node, index), catalog, Occupancy.for_catalog(catalog)))
    return ClusterState(gpus)


def _place(cluster: ClusterState, ref: GpuRef, profile: str, start: int) -> None:
    state = cluster.gpu(ref)
    found = state.catalog.profile(profile)
    assert found is not None
    cluster.set_occupancy(ref, state.occupancy.place(found, start))


def _stream(policy: Policy, cluster: ClusterState, sizes: list[int]) -> list[str]:
    out = []
    for i, size in enumerate(sizes):
        result = policy.place(cluster, [DeviceRequest(f"p{i}", size)])
        if result.ok:
            cluster.commit(result.choices)
            out.append(f"{result.choices[0].profile.name}@{result.choices[0].start}")
        else:
            out.append("refused")
    return out


def test_small_instances_leave_the_reserved_half_free_for_a_3g() -> None:
    sizes = [4000, 4000, 4000, 4000, 19000]
    # v2.10 packs 1g from the top (6, 5, 4, 3): both 3g placements are cut.
    assert _stream(HamiPolicy(), _cluster(("n", ["A100-40GB"])), sizes)[-1] == "refused"
    placed = _stream(HamiScoredPolicy(), _cluster(("n", ["A100-40GB"])), sizes)
    assert placed == ["1g.5gb@0", "1g.5gb@1", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]


def test_a_pods_devices_on_one_card_are_planned_together() -> None:
    pod = [DeviceRequest("small", 4000), DeviceRequest("big", 19000)]
    old = _cluster(("n", ["A100-40GB"]))
    _place(old, GpuRef("n", 0), "2g.10gb", 2)
    # v2.10, device by device: the 1g takes slice 6, and then neither 3g placement is free.
    assert not HamiPolicy().place(old, pod).ok
    new = _cluster(("n", ["A100-40GB"]))
    _place(new, GpuRef("n", 0), "2g.10gb", 2)
    result = HamiScoredPolicy().place(new, pod)
    assert result.ok
    assert [(c.request, c.profile.name, c.start) for c in result.choices] == [
        ("small", "1g.5gb", 0),
        ("big", "3g.20gb", 4),
    ]


def test_the_busiest_card_is_tried_first_and_a_device_it_cannot_take_moves_on() -> None:
    cluster = _cluster(("n", ["A100-40GB", "A100-40GB"]))
    _place(cluster, GpuRef("n", 1), "3g.20gb", 4)
    pod = [DeviceRequest("a", 19000), DeviceRequest("b", 19000)]
    result = HamiScoredPolicy().place(cluster, pod)
    assert result.ok
    # GPU 1 (busier) takes the first 3g at 0; the pair does not fit there, so b goes to GPU 0 alone,
    # at its reserved half.
    assert [(c.gpu.gpu_index, c.profile.name, c.start) for c in result.choices] == [
        (1, "3g.20gb", 0),
        (0, "3g.20gb", 4),
    ]


def test_when_the_smallest_profile_has_no_room_the_card_falls_back_to_a_larger_one() -> None:
    cluster = _cluster(("n", ["A100-40GB"]))
    _place(cluster, GpuRef("n", 0), "1g.5gb", 3)
    allowed = frozenset({("1g.5gb", 3), ("2g.10gb", 4)})
    policy = HamiScoredPolicy()
    result = policy.place(cluster, [DeviceRequest("x", 4000, device_filter=lambda ref: allowed)])
    assert result.ok
    assert (result.choices[0].profile.name, result.choices[0].start) == ("2g.10gb", 4)
    # The joint plan (smallest profiles only) found nothing and cost no tries: the 1g had no candidate.
    assert policy.last_search is not None
    assert policy.last_search.starts is None and policy.last_search.tries == 0


MODELS = ("A100-40GB", "H100-80GB", "A30-24GB")
SIZES = (1000, 4000, 8000, 12000, 19000, 30000, 39000)


@st.composite
def _scene(draw: st.DrawFn) -> tuple[ClusterState, list[DeviceRequest]]:
    gpus = []
    for n in range(draw(st.integers(1, 2))):
        for i in range(draw(st.integers(1, 2))):
            catalog = simulated_catalog(draw(st.sampled_from(MODELS)))
            occ = Occupancy.for_catalog(catalog)
            for _ in range(draw(st.integers(0, 5))):
                options = [(p, s.start) for p in catalog.profiles for s in occ.free_placements(p)]
                if not options:
                    break
                profile, start = draw(st.sampled_from(options))
                occ = occ.place(profile, start)
            gpus.append(GpuState(GpuRef(f"n{n}", i), catalog, occ))
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3))
    return ClusterState(gpus), [DeviceRequest(f"d{k}", s) for k, s in enumerate(sizes)]


@pytest.mark.parametrize("policy", [HamiPolicy(), HamiScoredPolicy()], ids=lambda p: p.name)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scene=_scene())
def test_hami_policies_never_place_illegally(
    policy: HamiPolicy | HamiScoredPolicy, scene: tuple[ClusterState, list[DeviceRequest]]
) -> None:
    cluster, pod = scene
    result = policy.place(cluster, pod)
    if not result.ok:
        if len(pod) == 1:  # one device: refused only when no GPU has a free placement big enough
            assert not any(any_free(g, pod[0]) for g in cluster.gpus())
        return
    assert [c.request for c in result.choices] == [r.name for r in pod]
    assert len({c.gpu.node for c in result.choices}) == 1
    occupancy = {g.ref: g.occupancy for g in cluster.gpus()}
    for choice, request in zip(result.choices, pod, strict=True):
        assert choice.profile.memory_mib >= request.memory_mib
        assert choice.profile in cluster.gpu(choice.gpu).catalog.profiles
        # Together with everything already there and the pod's other devices: OccupancyError = illegal.
        occupancy[choice.gpu] = occupancy[choice.gpu].place(choice.profile, choice.start)
