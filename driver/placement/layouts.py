"""Every maximal full-GPU layout for a set of profiles.

A layout is a set of (profile, start) instances that obeys the placement rules (see occupancy.py);
it is maximal when no instance of any of the profiles can be added. The enumeration is exhaustive:
a depth-first search over the candidate placements in one fixed order, where each branch only adds
candidates later in that order, so every valid set is visited exactly once and no deduplication of
permutations is needed. On an A100-40GB with {1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb} this yields
the 19 maximal layouts written out, with how they were derived, in tests/unit/test_oracle.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.occupancy import Occupancy, PlacedProfile, is_all_me, is_no_me


@dataclass(frozen=True, slots=True)
class Layout:
    instances: tuple[PlacedProfile, ...]  # largest first, then by start
    compute_slices_used: int
    memory_slices_used: int

    def key(self) -> tuple[tuple[int, int, int, str], ...]:
        return tuple(i.sort_key() for i in self.instances)

    def as_set(self) -> frozenset[tuple[str, int]]:
        return frozenset((i.profile.name, i.start) for i in self.instances)

    def __str__(self) -> str:
        return " + ".join(str(i) for i in self.instances)


def _unique(profiles: Iterable[MigProfile]) -> list[MigProfile]:
    seen: dict[int, MigProfile] = {}
    for p in profiles:
        seen.setdefault(p.gi_profile_id, p)
    return list(seen.values())


# Media-engine state of a (partial) layout, for the "+me.all" rule.
_NONE, _NO_ME, _OTHER, _ALL_ME = 0, 1, 2, 3


def _media(profile: MigProfile) -> int:
    if is_all_me(profile):
        return _ALL_ME
    return _NO_ME if is_no_me(profile) else _OTHER


def _combine(state: int, kind: int) -> int:
    # The kinds are ordered NONE < NO_ME < OTHER < ALL_ME, so a layout's state is its largest kind.
    return max(state, kind)


def enumerate_layouts(
    memory_slices: int, compute_slices: int, profiles: Iterable[MigProfile]
) -> list[Layout]:
    """All maximal layouts of `profiles` on a GPU with these axes, deterministic order (largest first)."""
    unique = _unique(profiles)
    empty = Occupancy(memory_slices, compute_slices, unique)
    candidates = sorted(
        (PlacedProfile(p, pl.start) for p in unique for pl in p.placements if pl.end <= memory_slices),
        key=PlacedProfile.sort_key,
    )
    # The search runs on plain integers (a memory bitmask, compute used, per-profile counts, the
    # media-engine state) because it visits every valid subset; `Occupancy` re-checks each result.
    slot = {p.gi_profile_id: i for i, p in enumerate(unique)}
    cands = [
        (
            c.mask,
            c.profile.compute_slices,
            slot[c.profile.gi_profile_id],
            c.profile.instance_count,
            _media(c.profile),
        )
        for c in candidates
    ]
    found: list[tuple[int, ...]] = []

    def fits(index: int, mask: int, compute: int, counts: list[int], media: int) -> bool:
        bits, need, pslot, limit, kind = cands[index]
        if mask & bits or compute + need > compute_slices or counts[pslot] >= limit:
            return False
        if kind == _ALL_ME:
            return media != _OTHER and media != _ALL_ME  # only -me instances (or none) so far
        return kind == _NO_ME or media != _ALL_ME

    def visit(
        first: int, mask: int, compute: int, counts: list[int], media: int, chosen: tuple[int, ...]
    ) -> None:
        extended = False
        for index in range(len(cands)):
            if not fits(index, mask, compute, counts, media):
                continue
            extended = True
            if index < first:
                continue  # reached through an earlier branch; maximality is all we learn here
            bits, need, pslot, _, kind = cands[index]
            counts[pslot] += 1
            visit(index + 1, mask | bits, compute + need, counts, _combine(media, kind), (*chosen, index))
            counts[pslot] -= 1
        if not extended:
            found.append(chosen)

    if cands:
        visit(0, 0, 0, [0] * len(unique), _NONE, ())
    layouts = [_layout(_checked(empty, [candidates[i] for i in chosen])) for chosen in found]
    layouts.sort(key=Layout.key)
    return layouts


def _checked(empty: Occupancy, instances: list[PlacedProfile]) -> Occupancy:
    occ = empty
    for inst in instances:
        occ = occ.place(inst.profile, inst.start)  # raises if the fast search and the rules disagree
    return occ


def enumerate_catalog_layouts(
    catalog: GpuCatalog, profiles: Iterable[MigProfile] | None = None
) -> list[Layout]:
    """Maximal layouts of one GPU, using its allowed profiles unless `profiles` is given."""
    chosen = catalog.profiles if profiles is None else tuple(profiles)
    return enumerate_layouts(catalog.memory_slices, catalog.compute_slices, chosen)


def _layout(occ: Occupancy) -> Layout:
    return Layout(
        instances=tuple(sorted(occ.instances, key=PlacedProfile.sort_key)),
        compute_slices_used=occ.used_compute_slices,
        memory_slices_used=occ.used_memory_slices,
    )
