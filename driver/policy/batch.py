"""Queue-aware decisions: several pending pods decided together instead of one by one.

When a burst of gated pods is pending at once, the order they are decided in matters more than the
per-pod rule: small pods decided first scatter over GPUs that larger ones later need whole (measured
in benchmarks/packing: 1.05x the optimum GPU count on A100-40GB when small requests come first). So
the batch is decided largest first (total memory, then devices), each pod with the per-pod policy on
the state the earlier pods of the batch leave, which is what a plain per-pod caller would get had the
pods arrived in that order. `place_batch` restores the caller's state before returning: like
`Policy.place`, it decides and changes nothing; the caller commits the placements it keeps (all of
them in order, or re-deciding whatever it drops). The controller uses only the order (`size_order`,
through driver/policy/placer.py): it decides and commits its pods one at a time, in that order.

Ageing: largest first alone can starve a pod. When capacity frees, a larger pod arriving in the
meantime is decided first and takes it; a steady supply of them keeps a mid-sized pod waiting for
ever. So a pod that has waited `AGE_FIRST_AFTER_S` or longer goes before every younger one, oldest
first (`size_order`'s `waited`); the rest stay largest first. Ageing orders, it does not reserve: an
old pod that does not fit yet leaves what frees to the younger ones decided after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from driver.policy.allocator import Policy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, Placement


@dataclass(frozen=True, slots=True)
class PodSize:
    """What one pending pod asks for, as far as the batch order cares: memory in MiB, and devices."""

    memory_mib: int
    devices: int

    @classmethod
    def of(cls, requests: Sequence[DeviceRequest]) -> PodSize:
        return cls(sum(r.memory_mib for r in requests), len(requests))


AGE_FIRST_AFTER_S = 120.0
"""A pod pending this long is decided before all younger ones. Far above what an ordinary burst
waits (it is decided in the step it arrives in, or when capacity next frees), so the packing order
holds for it; short enough that a pod passed over by larger ones waits minutes, not for ever. The
controller re-decides every waiting pod at least every 30 s (controller/allocation/loop.py
`RESYNC_S`): by then a pod has had several chances on the largest-first order."""


def size_order(
    sizes: Sequence[PodSize | None],
    waited: Sequence[float] | None = None,
    age_first_after_s: float = AGE_FIRST_AFTER_S,
) -> list[int]:
    """Indices of `sizes`, most memory first, then most devices, then input order (stable); pods of
    unknown size (None) after all known ones, in input order.

    `waited` (seconds each pod has been pending, same length): the pods that waited at least
    `age_first_after_s` come before all others, longest wait first (ties: input order), whatever
    their size (known or not)."""
    if waited is not None and len(waited) != len(sizes):
        raise ValueError(f"{len(waited)} waits for {len(sizes)} pods")
    aged = sorted(
        (i for i in range(len(sizes)) if waited is not None and waited[i] >= age_first_after_s),
        key=lambda i: (-waited[i] if waited is not None else 0.0, i),
    )
    first = set(aged)
    known = sorted(
        (-s.memory_mib, -s.devices, i) for i, s in enumerate(sizes) if s is not None and i not in first
    )
    unknown = [i for i, s in enumerate(sizes) if s is None and i not in first]
    return aged + [i for _, _, i in known] + unknown


def batch_order(pods: Sequence[Sequence[DeviceRequest]]) -> list[int]:
    """Indices of `pods`, most memory first, then most devices, then input order (stable)."""
    return size_order([PodSize.of(p) for p in pods])


def place_batch(
    policy: Policy, cluster: ClusterState, pods: Sequence[Sequence[DeviceRequest]]
) -> list[Placement]:
    """One placement per pod (in input order), decided together; `cluster` is left as it was.

    The placements are mutually consistent: committing all the successful ones, in any order, is
    legal. A pod refused here may still fit once others leave; the caller keeps it pending.
    """
    out: list[Placement | None] = [None] * len(pods)
    committed: list[Choice] = []
    try:
        for i in batch_order(pods):
            placement = policy.place(cluster, pods[i])
            out[i] = placement
            if placement.ok:
                cluster.commit(placement.choices)
                committed.extend(placement.choices)
    finally:
        for choice in reversed(committed):
            cluster.release(choice.gpu, choice.profile, choice.start)
    return [p for p in out if p is not None]
