"""How fragmented one GPU is: the share of its free capacity that placement rules make unusable.

Definition. For every candidate profile p of an occupancy:

    reachable(p) = how many more instances of p can coexist on the GPU right now: the most
                   non-overlapping free legal placements of p, capped by the free compute slices
                   (// p's compute slices) and by p's remaining instance count;
    ideal(p)     = how many more instances of p the free *resources* would hold if they were
                   perfectly compact: min(free compute // p.compute, free memory slices // p.memory,
                   remaining instance count);

both 0 when the "+me.all" rule excludes p (that is policy, not fragmentation). Then

    fragmentation = 1 - sum_p w_p * reachable(p) / ideal(p)  /  sum_p w_p      over p with ideal(p) > 0

with weights w_p (the expected share of requests for p; uniform by default). If no candidate has
ideal(p) > 0 -- nothing could fit even in a compact GPU, e.g. a full one -- fragmentation is 0.

Properties (tested):
- in [0, 1], because 0 <= reachable(p) <= ideal(p) (non-overlapping instances each need their own
  memory slices and compute slices);
- 0 on an empty GPU of every supported model, and 0 on a full one;
- 1 exactly when the free resources could hold some profile but no such profile can be placed at all.
  It is a ratio of the *free* capacity: a maximal layout that still has a free compute slice and a
  free memory slice no profile can use scores 1 (A100 3g@0 + 2g@4 + 1g@6 strands slice 7, whereas
  3g@4 + 2g@0 + 1g@2 keeps room for another 1g); `wasted_compute_share` scales it by how much is free
  when GPUs with different amounts of free capacity are compared;
- monotone in reachable capacity: between two occupancies with the same free resources and instance
  counts, the one where every profile can reach at least as many instances is never more fragmented.
  So comparing the fragmentation after each candidate placement of the same request ranks the
  placements by how many future requests they keep placeable (3g@4 beats 3g@0 on an A100, because
  3g@0 blocks the 4g and leaves memory slice 7 out of reach of a 1g or 2g).

`capacity()` exposes reachable(p) itself for policies that reason cluster-wide.
"""

from __future__ import annotations

from collections.abc import Mapping

from driver.catalog.types import MigProfile
from driver.placement.occupancy import Occupancy, slice_mask


def _remaining_count(occ: Occupancy, profile: MigProfile) -> int:
    if not occ.exclusivity_allows(profile):
        return 0
    return max(0, profile.instance_count - occ.count(profile))


def reachable_instances(occ: Occupancy, profile: MigProfile) -> int:
    """The most instances of `profile` that can be added together to the GPU as it is now."""
    limit = _remaining_count(occ, profile)
    if profile.compute_slices > 0:
        limit = min(limit, occ.free_compute_slices // profile.compute_slices)
    if limit <= 0:
        return 0
    # Interval scheduling: every placement of a profile has the same size, so taking free placements
    # greedily by start (= by end) yields the maximum number of pairwise disjoint ones.
    taken = 0
    mask = occ.used_memory_mask
    for placement in sorted(profile.placements, key=lambda p: p.start):
        if placement.end > occ.memory_slices:
            continue
        bits = slice_mask(placement.start, placement.size)
        if mask & bits == 0:
            mask |= bits
            taken += 1
            if taken == limit:
                break
    return taken


def ideal_instances(occ: Occupancy, profile: MigProfile) -> int:
    """How many more instances of `profile` the free resources would hold if they were contiguous."""
    limit = _remaining_count(occ, profile)
    if profile.compute_slices > 0:
        limit = min(limit, occ.free_compute_slices // profile.compute_slices)
    if profile.memory_slices > 0:
        limit = min(limit, occ.free_memory_slices // profile.memory_slices)
    return max(0, limit)


def capacity(occ: Occupancy) -> dict[str, int]:
    """reachable_instances for every candidate profile, by profile name."""
    return {p.name: reachable_instances(occ, p) for p in occ.profiles}


def fragmentation(occ: Occupancy, weights: Mapping[str, float] | None = None) -> float:
    """The fragmentation of one GPU in [0, 1] (see the module docstring for the definition).

    `weights` maps profile names to their expected share of demand; profiles it omits weigh 0.
    """
    total_weight = 0.0
    usable = 0.0
    for profile in occ.profiles:
        weight = 1.0 if weights is None else weights.get(profile.name, 0.0)
        if weight < 0:
            raise ValueError(f"weight of {profile.name} must not be negative, got {weight}")
        ideal = ideal_instances(occ, profile)
        if ideal == 0 or weight == 0:
            continue
        total_weight += weight
        usable += weight * reachable_instances(occ, profile) / ideal
    if total_weight == 0:
        return 0.0
    # Clamp float noise so callers can rely on the documented range.
    return min(1.0, max(0.0, 1.0 - usable / total_weight))


def wasted_compute_share(occ: Occupancy, weights: Mapping[str, float] | None = None) -> float:
    """fragmentation x the free share of the GPU's compute slices: the part of the *whole* GPU that is
    free but out of reach, comparable across GPUs that are filled to different degrees."""
    if occ.compute_slices == 0:
        return 0.0
    return fragmentation(occ, weights) * occ.free_compute_slices / occ.compute_slices
