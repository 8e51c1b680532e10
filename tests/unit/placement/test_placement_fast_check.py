"""`Occupancy.can_place` / `free_placements` answer exactly as `why_not` does, without its messages."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from driver.catalog.simulated import simulated_catalog, sku_keys
from driver.placement.occupancy import Occupancy

catalog = cache(simulated_catalog)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    sku=st.sampled_from(sorted(sku_keys())),
    picks=st.lists(st.tuples(st.integers(0, 63), st.integers(0, 15)), max_size=12),
)
def test_can_place_agrees_with_why_not(sku: str, picks: list[tuple[int, int]]) -> None:
    cat = catalog(sku)
    occ = Occupancy.for_catalog(cat)
    # Every prefix of the sequence is checked: partly full GPUs, +me/+me.all instances, full counts.
    for profile_pick, start in [*picks, (0, 0)]:
        for profile in cat.all_profiles:
            # Every start 0..15: legal ones, illegal ones and ones past the GPU's end.
            for s in range(16):
                assert occ.can_place(profile, s) == (occ.why_not(profile, s) is None), (profile.name, s)
            want = tuple(p for p in profile.placements if occ.why_not(profile, p.start) is None)
            assert occ.free_placements(profile) == want
        profile = cat.all_profiles[profile_pick % len(cat.all_profiles)]
        if occ.why_not(profile, start) is None:
            occ = occ.place(profile, start)
