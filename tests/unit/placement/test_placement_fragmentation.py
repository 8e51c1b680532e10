"""Fragmentation measure: range, zero points, and that it ranks placements sensibly."""

from __future__ import annotations

import itertools
from functools import cache

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import MigProfile
from driver.nvml.sim import SKUS
from driver.placement.fragmentation import (
    capacity,
    fragmentation,
    ideal_instances,
    reachable_instances,
    wasted_compute_share,
)
from driver.placement.layouts import enumerate_layouts
from driver.placement.occupancy import Occupancy

catalog = cache(simulated_catalog)
A100 = "A100-40GB"
ORACLE = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


def prof(name: str, sku: str = A100) -> MigProfile:
    p = catalog(sku).profile(name)
    assert p is not None
    return p


def a100(*placed: tuple[str, int]) -> Occupancy:
    cat = catalog(A100)
    occ = Occupancy(cat.memory_slices, cat.compute_slices, [prof(n) for n in ORACLE])
    for name, start in placed:
        occ = occ.place(prof(name), start)
    return occ


@pytest.mark.parametrize("sku", sorted(SKUS))
def test_empty_gpu_is_not_fragmented(sku: str) -> None:
    cat = catalog(sku)
    for profiles in (cat.profiles, cat.all_profiles):
        assert fragmentation(Occupancy(cat.memory_slices, cat.compute_slices, profiles)) == 0.0


def test_maximal_layouts_score_zero_unless_they_strand_capacity() -> None:
    # Nothing fits in a maximal layout, so it scores 1 if free compute *and* memory remain (they are
    # wasted) and 0 otherwise. On the A100 exactly the two layouts with 3g@0 and a free slice 7 waste
    # a compute slice that a rearrangement of the same instances would have kept usable.
    cat = catalog(A100)
    profiles = [prof(n) for n in ORACLE]
    stranded = []
    for layout in enumerate_layouts(cat.memory_slices, cat.compute_slices, profiles):
        occ = Occupancy(cat.memory_slices, cat.compute_slices, profiles, layout.instances)
        value = fragmentation(occ)
        assert value in (0.0, 1.0)
        if value == 1.0:
            stranded.append(str(layout))
    assert sorted(stranded) == [
        "3g.20gb@0 + 1g.5gb@4 + 1g.5gb@5 + 1g.5gb@6",
        "3g.20gb@0 + 2g.10gb@4 + 1g.5gb@6",
    ]
    # The same multiset arranged with 3g@4 leaves room for one more 1g: not maximal, not fragmented.
    better = a100(("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2))
    assert fragmentation(better) == 0.0 and capacity(better)["1g.5gb"] == 1
    assert wasted_compute_share(a100(("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6))) == pytest.approx(1 / 7)
    assert wasted_compute_share(better) == 0.0


def test_range_over_every_reachable_state() -> None:
    # Every set of instances reachable on an A100 with the oracle profiles stays in [0, 1], and
    # reachable <= ideal for every profile.
    cat = catalog(A100)
    profiles = [prof(n) for n in ORACLE]
    cands = [(p, pl.start) for p in profiles for pl in p.placements]
    seen = 0
    for r in range(4):
        for combo in itertools.combinations(cands, r):
            occ = Occupancy(cat.memory_slices, cat.compute_slices, profiles)
            try:
                for p, s in combo:
                    occ = occ.place(p, s)
            except ValueError:
                continue
            seen += 1
            f = fragmentation(occ)
            assert 0.0 <= f <= 1.0
            for p in profiles:
                assert 0 <= reachable_instances(occ, p) <= ideal_instances(occ, p)
    assert seen > 50


def test_ranks_placements_like_an_expert() -> None:
    # A 1g at the top (slice 6) keeps 4g@0, 3g@0 and three 2g placeable; at slice 0 it blocks them.
    assert fragmentation(a100(("1g.5gb", 6))) == 0.0
    assert fragmentation(a100(("1g.5gb", 0))) > fragmentation(a100(("1g.5gb", 6)))
    # A 3g at 4 leaves 4g@0 and slice 7 usable; at 0 it blocks the 4g and strands slice 7 for 1g/2g.
    assert fragmentation(a100(("3g.20gb", 4))) == 0.0
    assert fragmentation(a100(("3g.20gb", 0))) == pytest.approx(1 - (0 + 1 + 1 / 2 + 3 / 4) / 4)
    # A 2g at 4 keeps 4g@0 possible; at 0 or 2 it blocks the 4g (and 0 and 2 are equivalent).
    assert fragmentation(a100(("2g.10gb", 4))) == 0.0
    assert fragmentation(a100(("2g.10gb", 0))) == fragmentation(a100(("2g.10gb", 2))) == 0.25


def test_value_for_a_documented_example() -> None:
    # 1g@0: free 6 compute / 7 memory. reachable/ideal: 1g 6/6, 2g 2/3, 3g 1/1, 4g 0/1, 7g ideal 0.
    occ = a100(("1g.5gb", 0))
    assert capacity(occ) == {"1g.5gb": 6, "2g.10gb": 2, "3g.20gb": 1, "4g.20gb": 0, "7g.40gb": 0}
    assert fragmentation(occ) == pytest.approx(1 - (1 + 2 / 3 + 1 + 0) / 4)


def test_fully_blocked_is_one() -> None:
    # Only 4g.20gb is a candidate and a 1g sits on slice 0: resources for a 4g exist, no placement.
    cat = catalog(A100)
    occ = Occupancy(cat.memory_slices, cat.compute_slices, [prof("4g.20gb")]).place(prof("1g.5gb"), 0)
    assert fragmentation(occ) == 1.0


def test_weights() -> None:
    occ = a100(("3g.20gb", 0))
    assert fragmentation(occ, {"3g.20gb": 1.0}) == 0.0
    assert fragmentation(occ, {"4g.20gb": 1.0}) == 1.0
    assert fragmentation(occ, {"4g.20gb": 1.0, "3g.20gb": 1.0}) == 0.5
    assert fragmentation(occ, {}) == 0.0
    with pytest.raises(ValueError):
        fragmentation(occ, {"1g.5gb": -1.0})


def test_monotone_in_reachable_capacity() -> None:
    # Same instances (same free resources and counts), different starts: whenever one arrangement
    # reaches at least as many instances of every profile, it is not more fragmented.
    cat = catalog(A100)
    profiles = [prof(n) for n in ORACLE]
    states: list[Occupancy] = []
    for p1, p2 in itertools.product(profiles[:2], repeat=2):
        for s1 in p1.placements:
            for s2 in p2.placements:
                occ = Occupancy(cat.memory_slices, cat.compute_slices, profiles)
                if occ.can_place(p1, s1.start):
                    occ = occ.place(p1, s1.start)
                    if occ.can_place(p2, s2.start):
                        states.append(occ.place(p2, s2.start))
    by_multiset: dict[tuple[str, ...], list[Occupancy]] = {}
    for occ in states:
        by_multiset.setdefault(tuple(sorted(i.profile.name for i in occ.instances)), []).append(occ)
    compared = 0
    for group in by_multiset.values():
        for a, b in itertools.permutations(group, 2):
            ca, cb = capacity(a), capacity(b)
            if all(ca[n] >= cb[n] for n in ca):
                assert fragmentation(a) <= fragmentation(b)
                compared += 1
    assert compared > 20


def test_me_all_exclusion_is_not_fragmentation() -> None:
    rtx = "RTX-PRO-6000"
    cat = catalog(rtx)
    occ = Occupancy(cat.memory_slices, cat.compute_slices, cat.all_profiles)
    occ = occ.place(prof("1g.24gb+me.all", rtx), 0)
    # Plain profiles are excluded by policy, -me profiles still fit everywhere: no fragmentation.
    assert fragmentation(occ) == 0.0
    assert capacity(occ)["1g.24gb"] == 0 and capacity(occ)["1g.24gb-me"] == 3
