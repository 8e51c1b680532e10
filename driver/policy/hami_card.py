"""HAMi's MIG placement on one card after its pull request 2855 (merged 2026-09-03): reference only.

Written from the pull request's description and from reading its `pkg/device/nvidia/mig_topology.go`
(no code carried over). The card's memory slices are cut at the midpoint into two halves. A candidate
placement is ranked by, in order:
1. how many halves are still entirely free once it is placed (more is better);
2. whether it sits in the half meant for it: half-card profiles (exactly one half wide) belong to the
   half that contains fewer legal placements of all profiles, every other profile to the other half;
3. how far it is from the midpoint (further is better: small instances pack from the card's edges);
4. its start (lower is better); equal keys keep the placement table's order.
When some placement narrower than the card straddles the midpoint, the card is one region and the
ranking falls back to "keep the card empty, then lowest start".

Several instances for one card are placed pickiest first: the request with the fewest free placements
now, then the wider one, then by profile name. Each request tries its candidates best first and the
search backtracks depth first when a later request finds no room; it gives up after `SEARCH_BUDGET`
candidate tries in all. Before each step it checks two necessary conditions (the remaining requests'
slices fit in the free slices; no profile is asked for more often than it has free placements), so a
hopeless branch costs one check instead of every ordering of its requests. When the first (greedy)
branch succeeds the answer is exactly the greedy one.

Where this differs from HAMi's source, on purpose: a candidate is free when flexmig's `Occupancy`
allows it (memory slices, compute slices, instance counts, media-engine exclusivity: what NVML
enforces), where HAMi tests memory-slice overlap only; on the built-in tables the two agree except
that HAMi would hand out placements NVML then refuses. The source counts free placements without a
claim's device filter; here a request's filter narrows its candidates (HAMi has no such filter).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence, Set
from dataclasses import dataclass
from functools import lru_cache

from driver.catalog.types import MigProfile
from driver.nvml.types import Placement as Span
from driver.placement.occupancy import Occupancy, slice_mask

SEARCH_BUDGET = 4096  # HAMi's migSearchBudget: candidate tries per card and pod, greedy branch included

Allowed = Set[tuple[str, int]] | None
"""The (profile, start) pairs a request may use on this card; None: any."""


@dataclass(frozen=True, slots=True)
class Region:
    start: int
    end: int

    @property
    def mask(self) -> int:
        return slice_mask(self.start, self.end - self.start)

    def contains(self, span: Span) -> bool:
        return span.size > 0 and self.start <= span.start and span.start + span.size <= self.end


@dataclass(frozen=True, slots=True)
class CardLayout:
    """The halves of one card's profile table, and which half is kept for half-card profiles."""

    regions: tuple[Region, ...]  # two halves, or one region covering the card
    reserved: int  # index into `regions` of the half with fewer legal placements

    def score(self, used_after: int, span: Span) -> tuple[int, int, int, int]:
        """Sort key of one candidate (smaller is better), given the card's used slices with it placed."""
        empty = sum(1 for r in self.regions if not used_after & r.mask)
        mismatch = distance = 0
        if len(self.regions) == 2:
            for index, region in enumerate(self.regions):
                if not region.contains(span):
                    continue
                half_card = span.size == region.end - region.start
                mismatch = int(half_card != (index == self.reserved))
                # Distance from the midpoint: the lower half measures from the candidate's end, the
                # upper half from its start.
                end = span.start + span.size
                distance = region.end - end if index == 0 else span.start - region.start
        return (-empty, mismatch, -distance, span.start)


@lru_cache(maxsize=256)
def card_layout(profiles: tuple[MigProfile, ...]) -> CardLayout:
    """Derived once per profile table, as HAMi derives it from the table a node reports."""
    spans = [p for profile in profiles for p in profile.placements if p.size > 0]
    slices = max((p.start + p.size for p in spans), default=0)
    whole = CardLayout((Region(0, slices),), 0)
    if slices < 2:
        return whole
    mid = slices // 2
    if any(p.size < slices and p.start < mid < p.start + p.size for p in spans):
        return whole
    halves = (Region(0, mid), Region(mid, slices))
    counts = [sum(1 for p in spans if half.contains(p)) for half in halves]
    # The fewer placements, the better; on a tie the upper half (HAMi scans with `<=`).
    reserved = 1 if counts[1] <= counts[0] else 0
    return CardLayout(halves, reserved)


def candidates(occ: Occupancy, profile: MigProfile, allowed: Allowed) -> list[Span]:
    """Free placements of `profile` the request may use, in the table's order."""
    free = occ.free_placements(profile)
    if allowed is None:
        return list(free)
    return [p for p in free if (profile.name, p.start) in allowed]


def rank(layout: CardLayout, occ: Occupancy, profile: MigProfile, allowed: Allowed) -> list[Span]:
    """The free placements of `profile`, best first (a stable sort: ties keep the table's order)."""
    used = occ.used_memory_mask
    return sorted(
        candidates(occ, profile, allowed),
        key=lambda p: layout.score(used | slice_mask(p.start, p.size), p),
    )


def footprint(profile: MigProfile) -> int:
    return max((p.size for p in profile.placements), default=0)


@dataclass(frozen=True, slots=True)
class CardSearch:
    """What the search on one card found: a start per wanted instance (None: no layout found)."""

    starts: tuple[int, ...] | None
    tries: int  # candidate placements tried, the greedy branch included
    exhausted: bool  # gave up because the budget ran out


def place_on_card(
    layout: CardLayout,
    occ: Occupancy,
    wanted: Sequence[tuple[MigProfile, Allowed]],
    budget: int = SEARCH_BUDGET,
) -> CardSearch:
    """Place every wanted (profile, filter) on this card together, or none (see the module doc)."""
    starts = [0] * len(wanted)
    placed = [False] * len(wanted)
    left = budget

    def fits(state: Occupancy) -> bool:
        remaining = [wanted[i][0] for i in range(len(wanted)) if not placed[i]]
        if sum(footprint(p) for p in remaining) > state.free_memory_slices:
            return False
        demand = Counter(p.name for p in remaining)
        by_name = {p.name: p for p in remaining}
        return all(n <= len(state.free_placements(by_name[name])) for name, n in demand.items())

    def pickiest(state: Occupancy) -> int:
        def key(i: int) -> tuple[int, int, str, int]:
            profile, allowed = wanted[i]
            return (len(candidates(state, profile, allowed)), -footprint(profile), profile.name, i)

        return min((i for i in range(len(wanted)) if not placed[i]), key=key)

    def search(state: Occupancy, remaining: int) -> bool:
        nonlocal left
        if remaining == 0:
            return True
        if not fits(state):
            return False
        index = pickiest(state)
        profile, allowed = wanted[index]
        placed[index] = True
        for span in rank(layout, state, profile, allowed):
            if left == 0:
                break
            left -= 1
            starts[index] = span.start
            if search(state.place(profile, span.start), remaining - 1):
                return True
        placed[index] = False
        return False

    found = search(occ, len(wanted))
    return CardSearch(tuple(starts) if found else None, budget - left, not found and left == 0)
