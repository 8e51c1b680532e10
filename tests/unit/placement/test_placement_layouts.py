"""Maximal layout enumeration on every model."""

from __future__ import annotations

import itertools

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import MigProfile
from driver.nvml.sim import SKUS
from driver.placement.layouts import Layout, enumerate_catalog_layouts, enumerate_layouts
from driver.placement.occupancy import Occupancy


def names(layouts: list[Layout]) -> list[str]:
    return [str(layout) for layout in layouts]


@pytest.mark.parametrize("sku", sorted(SKUS))
def test_layouts_are_valid_maximal_unique_and_deterministic(sku: str) -> None:
    cat = simulated_catalog(sku)
    for profiles in (cat.profiles, cat.all_profiles):
        layouts = enumerate_layouts(cat.memory_slices, cat.compute_slices, profiles)
        assert layouts, sku
        sets = [layout.as_set() for layout in layouts]
        assert len(set(sets)) == len(sets)
        for layout in layouts:
            occ = Occupancy(cat.memory_slices, cat.compute_slices, profiles, layout.instances)
            assert occ.is_maximal
            assert layout.compute_slices_used == occ.used_compute_slices <= cat.compute_slices
            assert layout.memory_slices_used == occ.used_memory_slices <= cat.memory_slices
        # Same input in another order gives the same output.
        again = enumerate_layouts(cat.memory_slices, cat.compute_slices, tuple(reversed(profiles)))
        assert names(again) == names(layouts)


def _brute_force(
    memory: int, compute: int, profiles: tuple[MigProfile, ...]
) -> set[frozenset[tuple[str, int]]]:
    # Independent check: try every subset of candidate placements (small inputs only).
    cands = [(p, pl.start) for p in profiles for pl in p.placements]
    valid: list[Occupancy] = []
    for r in range(len(cands) + 1):
        for combo in itertools.combinations(cands, r):
            occ = Occupancy(memory, compute, profiles)
            if all(occ.can_place(p, s) and (occ := occ.place(p, s)) is not None for p, s in combo):
                valid.append(occ)
    return {frozenset((i.profile.name, i.start) for i in occ.instances) for occ in valid if occ.is_maximal}


@pytest.mark.parametrize("sku", ["A30-24GB", "RTX-PRO-6000"])
def test_matches_brute_force_on_small_gpus(sku: str) -> None:
    cat = simulated_catalog(sku)
    expected = _brute_force(cat.memory_slices, cat.compute_slices, cat.profiles)
    got = {layout.as_set() for layout in enumerate_catalog_layouts(cat)}
    assert got == expected


def test_a30_default_layouts() -> None:
    cat = simulated_catalog("A30-24GB")
    assert names(enumerate_catalog_layouts(cat)) == [
        "4g.24gb@0",
        "2g.12gb@0 + 2g.12gb@2",
        "2g.12gb@0 + 1g.6gb@2 + 1g.6gb@3",
        "2g.12gb@2 + 1g.6gb@0 + 1g.6gb@1",
        "1g.6gb@0 + 1g.6gb@1 + 1g.6gb@2 + 1g.6gb@3",
    ]


def test_me_all_layouts_on_rtx_pro_6000() -> None:
    cat = simulated_catalog("RTX-PRO-6000")
    layouts = enumerate_catalog_layouts(cat, cat.all_profiles)
    for layout in layouts:
        me_all = [i for i in layout.instances if i.profile.name.endswith("+me.all")]
        if me_all:
            assert len(me_all) == 1
            others = [i for i in layout.instances if i not in me_all]
            assert all(i.profile.name.endswith("-me") for i in others)
    assert "1g.24gb+me.all@0 + 1g.24gb-me@3 + 1g.24gb-me@6 + 1g.24gb-me@9" in names(layouts)


def test_no_profiles_no_layouts() -> None:
    assert enumerate_layouts(8, 7, ()) == []


def test_duplicate_profiles_are_ignored() -> None:
    cat = simulated_catalog("A100-40GB")
    once = enumerate_catalog_layouts(cat)
    twice = enumerate_catalog_layouts(cat, cat.profiles + cat.profiles)
    assert names(once) == names(twice)
