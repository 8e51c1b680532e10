"""HAMi's placement on one card after its pull request 2855 (driver/policy/hami_card.py): halves,
ranking, pickiest first, backtracking and the 4,096-try budget."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import MigProfile
from driver.nvml.types import Placement as Span
from driver.placement.occupancy import Occupancy
from driver.policy.hami_card import SEARCH_BUDGET, Region, card_layout, place_on_card, rank


def _profile(name: str, size: int, starts: list[int], profile_id: int) -> MigProfile:
    """A made-up profile (one compute slice, many instances) for tables no GPU reports."""
    return MigProfile(
        name=name,
        gi_profile_id=profile_id,
        enum_index=0,
        compute_slices=1,
        memory_slices=size,
        memory_mib=1000 * size,
        multiprocessors=1,
        copy_engines=1,
        decoders=0,
        encoders=0,
        jpegs=0,
        ofas=0,
        instance_count=64,
        placements=tuple(Span(s, size) for s in starts),
    )


def _a100(*placed: tuple[str, int]) -> Occupancy:
    catalog = simulated_catalog("A100-40GB")
    occ = Occupancy.for_catalog(catalog)
    for name, start in placed:
        profile = catalog.profile(name)
        assert profile is not None
        occ = occ.place(profile, start)
    return occ


def test_a100_splits_at_slice_4_and_keeps_the_upper_half_for_half_card_profiles() -> None:
    layout = card_layout(simulated_catalog("A100-40GB").profiles)
    # Lower half holds 7 legal placements (1g x4, 2g x2, 3g), upper half 5 (1g x3, 2g, 3g).
    assert layout.regions == (Region(0, 4), Region(4, 8)) and layout.reserved == 1
    a30 = card_layout(simulated_catalog("A30-24GB").profiles)
    assert a30.regions == (Region(0, 2), Region(2, 4)) and a30.reserved == 1  # 3 and 3: the upper wins


def test_a_placement_across_the_midpoint_makes_the_card_one_region() -> None:
    across = _profile("w", 2, [0, 2], 1)  # [2, 4) crosses the midpoint 3 of a 6-slice card
    small = _profile("s", 1, list(range(6)), 2)
    layout = card_layout((small, across))
    assert layout.regions == (Region(0, 6),)
    occ = Occupancy(6, 6, (small, across))
    # One region: nothing to keep empty once anything is placed, so the lowest start wins.
    assert [p.start for p in rank(layout, occ, small, None)] == [0, 1, 2, 3, 4, 5]


def test_ranking_on_an_empty_a100() -> None:
    catalog = simulated_catalog("A100-40GB")
    layout, occ = card_layout(catalog.profiles), _a100()

    def order(name: str) -> list[int]:
        profile = catalog.profile(name)
        assert profile is not None
        return [p.start for p in rank(layout, occ, profile, None)]

    # Small profiles fill the lower half from its outer edge, then the upper half from its outer edge.
    assert order("1g.5gb") == [0, 1, 2, 3, 6, 5, 4]
    assert order("2g.10gb") == [0, 2, 4]
    assert order("3g.20gb") == [4, 0]  # the half-card profile goes to the reserved half
    assert order("7g.40gb") == [0]
    # Once the lower half is taken, keeping the upper half empty no longer ranks first for a 1g.
    assert [p.start for p in rank(layout, _a100(("3g.20gb", 0)), catalog.profiles[0], None)] == [6, 5, 4]


def test_a_device_filter_narrows_the_candidates() -> None:
    catalog = simulated_catalog("A100-40GB")
    profile = catalog.profiles[0]
    ranked = rank(card_layout(catalog.profiles), _a100(), profile, {(profile.name, 5), (profile.name, 2)})
    assert [p.start for p in ranked] == [2, 5]


def test_the_pickiest_request_goes_first() -> None:
    catalog = simulated_catalog("A100-40GB")
    one, three = catalog.profile("1g.5gb"), catalog.profile("3g.20gb")
    assert one is not None and three is not None
    # 2g@2 leaves 3g a single placement (4): placed first, the 1g then takes the lower half.
    found = place_on_card(card_layout(catalog.profiles), _a100(("2g.10gb", 2)), [(one, None), (three, None)])
    assert found.starts == (0, 4) and found.tries == 2 and not found.exhausted


def test_backtracking_recovers_from_a_greedy_choice_that_fills_the_wrong_half() -> None:
    # The table from the pull request's review: a at 0 or 4, b at 0 or 1; asked a, b, b.
    a, b = _profile("a", 1, [0, 4], 1), _profile("b", 1, [0, 1], 2)
    layout, occ = card_layout((a, b)), Occupancy(5, 5, (a, b))
    assert layout.regions == (Region(0, 2), Region(2, 5))
    wanted = [(a, None), (b, None), (b, None)]
    found = place_on_card(layout, occ, wanted)
    # a ranks 0 before 4 (the lower half is a's, and 0 is far from the midpoint): greedy takes a@0,
    # after which the two b's have one free placement between them, so the count check refuses the
    # branch; back to a@4, then b@0 and b@1. Four tries.
    assert rank(layout, occ, a, None)[0].start == 0
    assert found.starts == (4, 0, 1) and found.tries == 4 and not found.exhausted
    short = place_on_card(layout, occ, wanted, budget=3)
    assert short.starts is None and short.tries == 3 and short.exhausted


def _parity_card(blocked: int) -> tuple[Occupancy, list[tuple[MigProfile, None]]]:
    """17 slices, one taken at `blocked`; eight 2-slice instances asked (any start): every count
    fits, so only the search can tell whether the two free runs have even lengths."""
    one, two = _profile("one", 1, list(range(17)), 1), _profile("two", 2, list(range(16)), 2)
    occ = Occupancy(17, 17, (one, two)).place(one, blocked)
    return occ, [(two, None)] * 8


def test_the_search_stops_after_4096_tries() -> None:
    assert SEARCH_BUDGET == 4096
    occ, wanted = _parity_card(blocked=7)  # runs of 7 and 9 slices: at most 3 + 4 pairs
    layout = card_layout(occ.profiles)
    found = place_on_card(layout, occ, wanted)
    assert found.starts is None and found.exhausted and found.tries == SEARCH_BUDGET
    occ, wanted = _parity_card(blocked=8)  # runs of 8 and 8: the greedy branch succeeds
    found = place_on_card(layout, occ, wanted)
    assert found.starts == (0, 2, 4, 6, 9, 11, 13, 15) and found.tries == 8


def test_a_hopeless_request_costs_no_tries() -> None:
    catalog = simulated_catalog("A100-40GB")
    three = catalog.profile("3g.20gb")
    assert three is not None
    found = place_on_card(card_layout(catalog.profiles), _a100(("1g.5gb", 0)), [(three, None)] * 2)
    assert found.starts is None and found.tries == 0 and not found.exhausted


_MODELS = ("A100-40GB", "H100-80GB", "A30-24GB")


@st.composite
def _card_and_wanted(draw: st.DrawFn) -> tuple[Occupancy, list[MigProfile]]:
    catalog = simulated_catalog(draw(st.sampled_from(_MODELS)))
    occ = Occupancy.for_catalog(catalog)
    for _ in range(draw(st.integers(0, 4))):
        options = [(p, s.start) for p in catalog.profiles for s in occ.free_placements(p)]
        if not options:
            break
        profile, start = draw(st.sampled_from(options))
        occ = occ.place(profile, start)
    wanted = draw(st.lists(st.sampled_from(catalog.profiles), min_size=1, max_size=3))
    return occ, wanted


def _brute_force(occ: Occupancy, wanted: list[MigProfile]) -> bool:
    def go(state: Occupancy, rest: list[MigProfile]) -> bool:
        if not rest:
            return True
        return any(go(state.place(rest[0], p.start), rest[1:]) for p in state.free_placements(rest[0]))

    return go(occ, wanted)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_card_and_wanted())
def test_the_search_is_legal_and_finds_a_layout_whenever_one_exists(
    case: tuple[Occupancy, list[MigProfile]],
) -> None:
    occ, wanted = case
    found = place_on_card(card_layout(occ.profiles), occ, [(p, None) for p in wanted])
    assert not found.exhausted  # three instances never come near the budget
    assert (found.starts is not None) == _brute_force(occ, wanted)
    if found.starts is not None:
        state = occ
        for profile, start in zip(wanted, found.starts, strict=True):
            state = state.place(profile, start)  # OccupancyError here = an illegal placement
        # The answer does not depend on the order the same requests were listed in.
        for perm in itertools.permutations(range(len(wanted))):
            again = place_on_card(card_layout(occ.profiles), occ, [(wanted[i], None) for i in perm])
            assert again.starts is not None
            assert sorted(zip((wanted[i].name for i in perm), again.starts, strict=True)) == sorted(
                zip((p.name for p in wanted), found.starts, strict=True)
            )
