"""Which prepared devices a claim's devices would collide with on this node. Pure.

The allocator should never hand out one piece of a GPU twice, but the node is the last line of
defence: whoever allocated a claim (flexmig's controller, kube-scheduler, a hand-written status),
prepare refuses a device that overlaps one already prepared (or being prepared) for another claim.
On one GPU:

- a whole GPU overlaps everything else on that GPU (another whole, any MIG device, any share);
- a MIG device overlaps a whole GPU, any share, and a MIG device whose placement intersects its own;
- a HAMi-core share overlaps a whole GPU and any MIG device; shares of one GPU go together as long as
  their sum stays within the GPU's published capacity (split count, memory, cores);
- an adminAccess device overlaps nothing: it exposes what exists for monitoring and holds nothing.

The checkpoint is what says what is prepared, so `PrepareStarted` entries count too: they are either
in flight on other GPUs (their GPU locks keep them off ours) or left by a failed rollback, and then their
instances may still exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubeletplugin.checkpoint.model import ClaimCheckpoint, PreparedDeviceRecord
from kubeletplugin.shared.capacity import MAX_CORES


class DeviceOverlap(Exception):
    """A device of the claim overlaps a device prepared for another claim (or another of its own)."""


@dataclass(frozen=True, slots=True)
class SharedLimits:
    """The published capacity of one GPU's shared device."""

    split_count: int | None  # None: not checked (a node that publishes no shares)
    memory_mib: int


def _kind(rec: PreparedDeviceRecord) -> str:
    if rec.is_mig:
        return "MIG"
    if rec.is_shared:
        return "shared"
    return "whole"


def records_overlap(a: PreparedDeviceRecord, b: PreparedDeviceRecord) -> bool:
    """Whether two devices may not be prepared at the same time (shares are checked by capacity)."""
    if a.gpu_index != b.gpu_index or a.admin or b.admin:
        return False  # an adminAccess device is watched, not held: it overlaps nothing
    if a.is_shared and b.is_shared:
        return False
    if a.is_mig and b.is_mig:
        assert a.placement_start is not None and a.placement_size is not None
        assert b.placement_start is not None and b.placement_size is not None
        return (
            a.placement_start < b.placement_start + b.placement_size
            and b.placement_start < a.placement_start + a.placement_size
        )
    return True


def _who(claim: ClaimCheckpoint) -> str:
    return f"claim {claim.namespace}/{claim.name} (uid {claim.uid}, {claim.state.value})"


def check_no_overlap(
    uid: str,
    records: Sequence[PreparedDeviceRecord],
    prepared: Iterable[ClaimCheckpoint],
    shared_limits: Mapping[int, SharedLimits],
) -> None:
    """Raise DeviceOverlap naming the other claim when any of `records` (claim `uid`) collides.

    `prepared` is every claim in the checkpoint; the claim's own entry is ignored (the caller rolled
    it back before). `shared_limits` maps a GPU index to its shared device's capacity.
    """
    others = [c for c in prepared if c.uid != uid]
    for i, rec in enumerate(records):
        for other in records[i + 1 :]:
            if records_overlap(rec, other):
                raise DeviceOverlap(
                    f"devices {rec.device_name} ({_kind(rec)}) and {other.device_name} ({_kind(other)}) of"
                    " this claim overlap on one GPU; the allocation is invalid"
                )
        for claim in others:
            for held in claim.devices:
                if records_overlap(rec, held):
                    raise DeviceOverlap(
                        f"device {rec.device_name} ({_kind(rec)}) overlaps {held.device_name}"
                        f" ({_kind(held)}) on GPU {rec.gpu_index}, already prepared for {_who(claim)};"
                        " refusing to hand the same GPU out twice (nothing was created)"
                    )
    _check_shared_capacity(records, others, shared_limits)


def _check_shared_capacity(
    records: Sequence[PreparedDeviceRecord],
    others: Sequence[ClaimCheckpoint],
    shared_limits: Mapping[int, SharedLimits],
) -> None:
    for rec in records:
        if not rec.is_shared:
            continue
        held = [(c, d) for c in others for d in c.devices if d.is_shared and d.gpu_index == rec.gpu_index]
        limits = shared_limits.get(rec.gpu_index)
        if limits is None:
            continue
        shares = sum(s.shares for s in rec.shares) + sum(s.shares for _, d in held for s in d.shares)
        memory = sum(s.memory_mib for s in rec.shares) + sum(s.memory_mib for _, d in held for s in d.shares)
        cores = sum(s.cores for s in rec.shares) + sum(s.cores for _, d in held for s in d.shares)
        over = []
        if limits.split_count is not None and shares > limits.split_count:
            over.append(f"{shares} shares > split count {limits.split_count}")
        if memory > limits.memory_mib:
            over.append(f"{memory} MiB > {limits.memory_mib} MiB")
        if cores > MAX_CORES:
            over.append(f"{cores}% cores > {MAX_CORES}%")
        if over:
            holders = ", ".join(sorted({_who(c) for c, _ in held})) or "no other claim"
            raise DeviceOverlap(
                f"shared device {rec.device_name} on GPU {rec.gpu_index} would exceed its capacity"
                f" ({'; '.join(over)}) together with the shares prepared for {holders}; refusing it"
                " (nothing was created)"
            )
