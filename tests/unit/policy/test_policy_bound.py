"""The repacking bound's exact check, the HiGHS program and the batch entry point, against brute force."""

from __future__ import annotations

import itertools

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import PackingPolicy
from driver.policy.batch import place_batch
from driver.policy.bound import FitProgram, RepackingBound, model_groups
from driver.policy.cluster import ClusterState
from driver.policy.hami import HamiPolicy
from driver.policy.model import DeviceRequest, GpuRef, GpuState


def _brute_fits(catalog: GpuCatalog, gpus: int, sizes: list[int]) -> bool:
    """Depth-first over real placements (Occupancy rules), no layouts, no Hall argument."""
    order = sorted(sizes, reverse=True)

    def go(i: int, occs: tuple[Occupancy, ...]) -> bool:
        if i == len(order):
            return True
        seen: set[object] = set()
        for g, occ in enumerate(occs):
            sig = tuple(sorted((p.profile.name, p.start) for p in occ.instances))
            if sig in seen:
                continue
            seen.add(sig)
            for profile in catalog.profiles:
                if profile.memory_mib < order[i]:
                    continue
                for pl in occ.free_placements(profile):
                    nxt = (*occs[:g], occ.place(profile, pl.start), *occs[g + 1 :])
                    if go(i + 1, nxt):
                        return True
        return False

    return go(0, tuple(Occupancy.for_catalog(catalog) for _ in range(gpus)))


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_fit_program_equals_brute_force(model: str) -> None:
    catalog = simulated_catalog(model)
    sizes_menu = sorted({p.memory_mib - 100 for p in catalog.profiles})
    program = FitProgram(model_groups([catalog] * 2))
    checked = 0
    for n in range(1, 6):
        for combo in itertools.combinations_with_replacement(sizes_menu, n):
            assert (program.solve(list(combo)) is not None) == _brute_fits(catalog, 2, list(combo)), combo
            checked += 1
    assert checked > 50


def test_mip_program_agrees_with_fit_program() -> None:
    from benchmarks.packing import mip  # in the repository (and highspy a dependency): never skipped

    catalog = simulated_catalog("A100-40GB")
    groups = model_groups([catalog] * 2)
    exact, solver = FitProgram(groups), mip.MipProgram(groups)
    menu = [4000, 9000, 19000, 39000]
    for n in range(1, 6):
        for combo in itertools.combinations_with_replacement(menu, n):
            assert (exact.solve(list(combo)) is None) == (solver.solve(list(combo)) is None), combo
    # Offline optimum: 2 x 3g + 1 x 7g need 2 GPUs; 3 x 3g + 2 x 1g need 2 as well.
    assert mip.fewest_gpus(model_groups([catalog] * 6), [19000, 19000, 39000]) == 2
    assert mip.fewest_gpus(model_groups([catalog] * 6), [19000] * 3 + [4000] * 2) == 2


def test_bound_admits_when_repacking_helps() -> None:
    catalog = simulated_catalog("A100-40GB")
    bound = RepackingBound([catalog])
    # 1g at slice 0 blocks a later 3g@0 only if it is not moved; the bound may move it.
    assert bound.admit("a", [4000])
    assert bound.admit("b", [19000])
    assert bound.admit("c", [9000])
    assert not bound.admit("d", [19000])  # compute: 1 + 3 + 2 + 3 > 7 on one GPU... and memory
    bound.release("b")
    assert bound.admit("d", [19000])


def _cluster(gpus: int) -> ClusterState:
    cat = simulated_catalog("A100-40GB")
    return ClusterState(GpuState(GpuRef("n0", i), cat, Occupancy.for_catalog(cat)) for i in range(gpus))


def test_batch_leaves_state_unchanged_and_places_largest_first() -> None:
    cluster = _cluster(2)
    pods = [[DeviceRequest("s", 4000)] for _ in range(6)] + [[DeviceRequest("big", 39000)]]
    placements = place_batch(PackingPolicy(), cluster, pods)
    assert all(p.ok for p in placements)
    assert all(g.occupancy.is_empty for g in cluster.gpus())
    assert placements[-1].choices[0].profile.name == "7g.40gb"


def test_hami_packs_busiest_gpu_and_orders_starts() -> None:
    cluster = _cluster(2)
    first = HamiPolicy().place(cluster, [DeviceRequest("a", 4000)])
    assert first.ok and first.choices[0].start == 6  # 1g from the highest start
    cluster.commit(first.choices)
    second = HamiPolicy().place(cluster, [DeviceRequest("b", 9000)])
    assert second.choices[0].gpu == first.choices[0].gpu and second.choices[0].start == 0
