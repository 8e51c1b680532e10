"""Occupancy rules: memory overlap, compute budget, instance limits, +me.all exclusivity."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.types import GpuInstance, Placement
from driver.placement.occupancy import Occupancy, OccupancyError, PlacedProfile

catalog = cache(simulated_catalog)


def prof(sku: str, name: str) -> MigProfile:
    p = catalog(sku).profile(name)
    assert p is not None, name
    return p


def empty(sku: str, *names: str) -> Occupancy:
    cat = catalog(sku)
    profiles = [prof(sku, n) for n in names] if names else cat.all_profiles
    return Occupancy(cat.memory_slices, cat.compute_slices, profiles)


A100 = "A100-40GB"


def test_empty_gpu_offers_every_legal_placement() -> None:
    occ = empty(A100)
    assert occ.is_empty and occ.free_memory_slices == 8 and occ.free_compute_slices == 7
    for p in catalog(A100).all_profiles:
        assert occ.free_placements(p) == p.placements
    assert occ.placeable_profiles() == catalog(A100).all_profiles


def test_memory_overlap_is_rejected() -> None:
    occ = empty(A100).place(prof(A100, "3g.20gb"), 4)
    assert not occ.can_place(prof(A100, "1g.5gb"), 5)
    assert not occ.can_place(prof(A100, "2g.10gb"), 4)
    assert occ.can_place(prof(A100, "2g.10gb"), 2)
    reason = occ.why_not(prof(A100, "7g.40gb"), 0)
    assert reason is not None and "overlap 3g.20gb@4" in reason
    with pytest.raises(OccupancyError, match="overlap"):
        occ.place(prof(A100, "1g.5gb"), 6)


def test_illegal_start_is_rejected() -> None:
    reason = empty(A100).why_not(prof(A100, "2g.10gb"), 1)
    assert reason is not None and "legal starts: 0,2,4" in reason
    assert not empty(A100).can_place(prof(A100, "3g.20gb"), 2)


def test_compute_budget() -> None:
    # 3g@0 + 3g@4 fill all 8 memory slices with 6 of 7 compute slices.
    occ = empty(A100).place(prof(A100, "3g.20gb"), 0).place(prof(A100, "3g.20gb"), 4)
    assert occ.free_memory_slices == 0 and occ.free_compute_slices == 1
    # 4 x 1g.10gb use 4 compute and all memory; and 7 x 1g.5gb strand memory slice 7.
    occ = empty(A100)
    for start in range(7):
        occ = occ.place(prof(A100, "1g.5gb"), start)
    assert occ.free_compute_slices == 0 and occ.free_memory_slices == 1
    assert occ.is_maximal


def _synthetic(
    name: str, pid: int, compute: int, size: int, starts: tuple[int, ...], count: int
) -> MigProfile:
    # A made-up geometry: on real GPUs legal placements make compute run out together with memory,
    # so the compute rule alone is only visible on a GPU with more memory than compute slices.
    return MigProfile(
        name=name,
        gi_profile_id=pid,
        enum_index=0,
        compute_slices=compute,
        memory_slices=size,
        memory_mib=1024 * size,
        multiprocessors=8 * compute,
        copy_engines=1,
        decoders=0,
        encoders=0,
        jpegs=0,
        ofas=0,
        instance_count=count,
        placements=tuple(Placement(s, size) for s in starts),
    )


def test_compute_budget_alone_blocks() -> None:
    small = _synthetic("1g.1gb", 1, 1, 1, (0, 1, 2, 3), 4)
    occ = Occupancy(4, 2, [small]).place(small, 0).place(small, 1)
    assert occ.free_memory_slices == 2 and occ.free_compute_slices == 0
    reason = occ.why_not(small, 2)
    assert reason is not None and "needs 1 compute slices, 0 of 2 are free" in reason
    assert occ.is_maximal


def test_instance_limit() -> None:
    one_me = prof(A100, "1g.5gb+me")
    occ = empty(A100).place(one_me, 0)
    reason = occ.why_not(one_me, 3)
    assert reason is not None and "maximum of 1" in reason
    assert occ.count(one_me) == 1
    # Plain 1g.5gb is a different profile id and still fits.
    assert occ.can_place(prof(A100, "1g.5gb"), 3)


def test_me_all_exclusivity() -> None:
    rtx = "RTX-PRO-6000"
    me_all = prof(rtx, "1g.24gb+me.all")
    occ = empty(rtx).place(me_all, 0)
    assert not occ.can_place(prof(rtx, "1g.24gb"), 3)
    assert not occ.can_place(prof(rtx, "1g.24gb+gfx"), 3)
    assert not occ.can_place(prof(rtx, "2g.48gb+me.all"), 6)
    reason = occ.why_not(prof(rtx, "1g.24gb+me"), 3)
    assert reason is not None and "only -me profiles" in reason
    assert occ.can_place(prof(rtx, "1g.24gb-me"), 3)
    assert occ.can_place(prof(rtx, "2g.48gb-me"), 6)
    # And the other way round: +me.all only joins -me instances.
    plain = empty(rtx).place(prof(rtx, "1g.24gb"), 0)
    assert not plain.can_place(me_all, 3)
    no_me = empty(rtx).place(prof(rtx, "1g.24gb-me"), 0)
    assert no_me.can_place(me_all, 3)


def test_place_is_immutable_and_remove_round_trips() -> None:
    base = empty(A100)
    one = base.place(prof(A100, "2g.10gb"), 2)
    assert base.is_empty and len(one.instances) == 1
    assert one.used_memory_mask == 0b1100
    back = one.remove(prof(A100, "2g.10gb"), 2)
    assert back.is_empty and back.used_compute_slices == 0
    with pytest.raises(OccupancyError):
        back.remove(prof(A100, "2g.10gb"), 2)


def test_constructor_validates_instances() -> None:
    cat = catalog(A100)
    with pytest.raises(OccupancyError):
        Occupancy.for_catalog(
            cat, [PlacedProfile(prof(A100, "3g.20gb"), 0), PlacedProfile(prof(A100, "4g.20gb"), 0)]
        )


def test_from_gpu_instances() -> None:
    cat: GpuCatalog = catalog(A100)
    p3 = prof(A100, "3g.20gb")
    occ = Occupancy.from_gpu_instances(cat, [GpuInstance(0, 1, p3.gi_profile_id, Placement(4, 4))])
    assert [str(i) for i in occ.instances] == ["3g.20gb@4"]
    assert occ.profiles == cat.profiles
    with pytest.raises(OccupancyError, match="profile id 99"):
        Occupancy.from_gpu_instances(cat, [GpuInstance(0, 1, 99, Placement(0, 1))])


def test_placeable_profiles_shrink_as_gpu_fills() -> None:
    occ = empty(A100, "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    occ = occ.place(prof(A100, "1g.5gb"), 0)
    assert [p.name for p in occ.placeable_profiles()] == ["1g.5gb", "2g.10gb", "3g.20gb"]
    assert occ.free_placements(prof(A100, "3g.20gb")) == (Placement(4, 4),)
    assert occ.free_placements(prof(A100, "2g.10gb")) == (Placement(2, 2), Placement(4, 2))


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    sku=st.sampled_from(["A100-40GB", "A30-24GB", "RTX-PRO-6000"]),
    picks=st.lists(st.tuples(st.integers(0, 63), st.integers(0, 15)), max_size=12),
)
def test_invariants_hold_for_any_sequence_of_attempts(sku: str, picks: list[tuple[int, int]]) -> None:
    cat = catalog(sku)
    occ = Occupancy.for_catalog(cat)
    for profile_pick, start in picks:
        profile = cat.all_profiles[profile_pick % len(cat.all_profiles)]
        if occ.can_place(profile, start):
            occ = occ.place(profile, start)
        else:
            with pytest.raises(OccupancyError):
                occ.place(profile, start)
    masks = [i.mask for i in occ.instances]
    assert sum(bin(m).count("1") for m in masks) == occ.used_memory_slices  # pairwise disjoint
    assert (
        occ.used_compute_slices == sum(i.profile.compute_slices for i in occ.instances) <= cat.compute_slices
    )
    for p in cat.all_profiles:
        assert occ.count(p) <= p.instance_count
        for placement in occ.free_placements(p):
            assert occ.is_free(placement.start, placement.size)
    if any(i.profile.name.endswith("+me.all") for i in occ.instances):
        assert sum(i.profile.name.endswith("+me.all") for i in occ.instances) == 1
        assert all(i.profile.name.endswith(("-me", "+me.all")) for i in occ.instances)
