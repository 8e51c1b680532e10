"""Profile choice for a memory request."""

from __future__ import annotations

from functools import cache

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import MigProfile
from driver.placement.choice import ProfileChoiceError, candidate_profiles, choose_profile

catalog = cache(simulated_catalog)


def allowed(sku: str) -> tuple[MigProfile, ...]:
    return catalog(sku).profiles


def every(sku: str) -> tuple[MigProfile, ...]:
    return catalog(sku).all_profiles


def test_smallest_profile_by_nvml_memory() -> None:
    a100 = allowed("A100-40GB")
    # The A100 "1g.5gb" has 4864 MiB: a 5000 MiB request does not fit in it despite the name.
    assert choose_profile(a100, 4500).name == "1g.5gb"
    assert choose_profile(a100, 4864).name == "1g.5gb"
    assert choose_profile(a100, 5000).name == "2g.10gb"
    assert choose_profile(a100, 8000).name == "2g.10gb"
    assert choose_profile(a100, 12000).name == "3g.20gb"
    assert choose_profile(a100, 30000).name == "7g.40gb"
    assert choose_profile(a100, 0).name == "1g.5gb"


def test_ties_prefer_fewer_compute_slices_then_plain_variant() -> None:
    a100 = every("A100-40GB")
    # 1g.10gb and 2g.10gb have the same memory; the 1g holds less compute.
    assert choose_profile(a100, 9000).name == "1g.10gb"
    # 3g.20gb and 4g.20gb: the 3g.
    assert choose_profile(a100, 15000).name == "3g.20gb"
    # 1g.5gb and 1g.5gb+me are identical but for the media engines: plain first.
    assert choose_profile(a100, 100).name == "1g.5gb"
    rtx = every("RTX-PRO-6000")
    names = [p.name for p in candidate_profiles(rtx, 20000)][:5]
    assert names == ["1g.24gb", "1g.24gb-me", "1g.24gb+gfx", "1g.24gb+me", "1g.24gb+me.all"]


def test_candidates_are_all_fitting_profiles_best_first() -> None:
    names = [p.name for p in candidate_profiles(allowed("H100-80GB"), 15000)]
    assert names == ["2g.20gb", "3g.40gb", "7g.80gb"]


def test_preferred_profile_goes_first_if_it_fits() -> None:
    a100 = allowed("A100-40GB")
    assert choose_profile(a100, 4000, preferred="3g.20gb").name == "3g.20gb"
    # Too small: ignored, the normal rule applies.
    assert choose_profile(a100, 12000, preferred="1g.5gb").name == "3g.20gb"
    # Not offered on this model (written for another GPU): ignored as well.
    assert choose_profile(a100, 4000, preferred="3g.40gb").name == "1g.5gb"
    names = [p.name for p in candidate_profiles(a100, 4000, preferred="3g.20gb")]
    assert names == ["3g.20gb", "1g.5gb", "2g.10gb", "7g.40gb"]


def test_pinned_profile_only() -> None:
    a100 = allowed("A100-40GB")
    assert [p.name for p in candidate_profiles(a100, 100, pinned="7g.40gb")] == ["7g.40gb"]
    with pytest.raises(ProfileChoiceError) as info:
        choose_profile(a100, 100, pinned="4g.20gb")
    assert "4g.20gb" in str(info.value) and "1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb" in str(info.value)
    with pytest.raises(ProfileChoiceError, match="has 4864 MiB, less than the 8000 MiB"):
        choose_profile(a100, 8000, pinned="1g.5gb")


def test_nothing_big_enough_names_the_largest() -> None:
    with pytest.raises(ProfileChoiceError) as info:
        choose_profile(allowed("A100-40GB"), 50000)
    assert "largest is 7g.40gb with 40192 MiB" in str(info.value)


def test_invalid_requests() -> None:
    with pytest.raises(ProfileChoiceError, match="no MIG profile is allowed"):
        choose_profile((), 1)
    with pytest.raises(ProfileChoiceError, match="negative"):
        choose_profile(allowed("A100-40GB"), -1)
    with pytest.raises(ProfileChoiceError, match="both preferred"):
        choose_profile(allowed("A100-40GB"), 1, preferred="1g.5gb", pinned="7g.40gb")


def test_every_sku_serves_its_full_memory_profile() -> None:
    for sku in ("A30-24GB", "A100-80GB", "H100-94GB", "H20-96GB", "H200-141GB", "B200-180GB", "RTX-PRO-6000"):
        profiles = allowed(sku)
        largest = max(profiles, key=lambda p: p.memory_mib)
        assert choose_profile(profiles, largest.memory_mib) == largest
        smallest = min(profiles, key=lambda p: p.memory_mib)
        assert choose_profile(profiles, 1) == smallest
