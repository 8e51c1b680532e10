"""What a request may take on one GPU, and why a pod fits nowhere (shared by every policy)."""

from __future__ import annotations

from collections.abc import Sequence

from driver.catalog.types import MigProfile
from driver.nvml.types import Placement as PlacementSpan
from driver.placement.choice import ProfileChoiceError, candidate_profiles
from driver.placement.occupancy import Occupancy
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, GpuState, Placement, ShortReason


def serves(gpu: GpuState, request: DeviceRequest) -> bool:
    if request.models and gpu.model not in request.models:
        return False
    allowed = request.allowed(gpu.ref)
    return allowed is None or bool(allowed)


def profiles_for(gpu: GpuState, request: DeviceRequest) -> tuple[MigProfile, ...]:
    try:
        profiles = candidate_profiles(
            gpu.catalog.profiles,
            request.memory_mib,
            preferred=request.preferred_profile,
            pinned=request.pinned_profile,
        )
    except ProfileChoiceError:
        return ()
    allowed = request.allowed(gpu.ref)
    if allowed is None:
        return profiles
    return tuple(p for p in profiles if any((p.name, pl.start) in allowed for pl in p.placements))


def free_placements(
    gpu: GpuState, occ: Occupancy, profile: MigProfile, request: DeviceRequest
) -> tuple[PlacementSpan, ...]:
    """Free placements of `profile` on `gpu` that the request's device filter admits."""
    free = occ.free_placements(profile)
    allowed = request.allowed(gpu.ref)
    if allowed is None:
        return free
    return tuple(p for p in free if (profile.name, p.start) in allowed)


def explain_failure(cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
    """The most specific reason why no node can take the whole pod."""
    for request in requests:
        serving = [g for g in cluster.gpus() if serves(g, request) and profiles_for(g, request)]
        if not serving:
            return Placement(
                (),
                ShortReason.NO_PROFILE_BIG_ENOUGH,
                f"request {request.name}: no GPU model offers an allowed profile with >= {request.memory_mib} MiB"
                + (f" among models {sorted(request.models)}" if request.models else ""),
            )
        free = [g for g in serving if not g.whole_gpu_taken and any_free(g, request)]
        if not free:
            enough_slices = [
                g
                for g in serving
                if not g.whole_gpu_taken
                and any(
                    g.occupancy.free_memory_slices >= p.memory_slices
                    and g.occupancy.free_compute_slices >= p.compute_slices
                    for p in profiles_for(g, request)
                )
            ]
            if enough_slices:
                return Placement(
                    (),
                    ShortReason.FRAGMENTED,
                    f"request {request.name}: {len(enough_slices)} GPU(s) have enough free slices for "
                    f">= {request.memory_mib} MiB, but not at a legal placement",
                )
            return Placement(
                (),
                ShortReason.NO_FREE_PLACEMENT,
                f"request {request.name}: all {len(serving)} GPU(s) that could serve "
                f">= {request.memory_mib} MiB are full",
            )
    return Placement(
        (), ShortReason.NO_SINGLE_NODE, "every request fits somewhere, but no single node takes them all"
    )


def any_free(gpu: GpuState, request: DeviceRequest) -> bool:
    return any(free_placements(gpu, gpu.occupancy, p, request) for p in profiles_for(gpu, request))


def largest_first(requests: Sequence[DeviceRequest]) -> list[DeviceRequest]:
    # Largest first: the most constrained device picks while the node still has room for it.
    return sorted(requests, key=lambda r: (-r.memory_mib, r.pinned_profile is None, r.name))
