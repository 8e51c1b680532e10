"""Queue-aware decisions: several pending pods decided together instead of one by one.

When a burst of gated pods is pending at once, the order they are decided in matters more than the
per-pod rule: small pods decided first scatter over GPUs that larger ones later need whole (measured
in benchmarks/packing: 1.05x the optimum GPU count on A100-40GB when small requests come first). So
the batch is decided largest first (total memory, then devices), each pod with the per-pod policy on
the state the earlier pods of the batch leave, which is what a plain per-pod caller would get had the
pods arrived in that order. `place_batch` restores the caller's state before returning: like
`Policy.place`, it decides and changes nothing; the caller commits the placements it keeps (all of
them in order, or re-deciding whatever it drops). The controller uses the order (`size_order`,
through driver/policy/placer.py): it decides and commits its pods one at a time, in that order.

Exact plans: largest first still opens more GPUs than needed on some bursts (1.058x the optimum on
H100-80GB in benchmarks/packing). So `place_batch` with `PackingPolicy` places the burst's *plain*
pods (one MIG device asking for memory only) with the integer program of driver/policy/burstplan.py
when it has at least two of them: the other pods first, largest first, each with the per-pod policy
(they have fewer choices: a filter, a pinned or preferred profile, several devices, a hint), then the
plan on the state they leave; a plain pod the plan leaves out (nothing fits it) or a plan skipped
(too large, out of time) falls back to the per-pod policy, largest first. The controller takes the
same plan through driver/policy/placer.py (`Placer.plan_burst`), as advice to its per-pod decisions.

Ageing: largest first alone can starve a pod. When capacity frees, a larger pod arriving in the
meantime is decided first and takes it; a steady supply of them keeps a mid-sized pod waiting for
ever. So a pod that has waited `AGE_FIRST_AFTER_S` or longer goes before every younger one, oldest
first (`size_order`'s `waited`); the rest stay largest first. Ageing orders, it does not reserve: an
old pod that does not fit yet leaves what frees to the younger ones decided after it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from driver.policy.allocator import PackingPolicy, Policy
from driver.policy.burstplan import MIN_PODS, plain, plan_burst
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, Placement


@dataclass(frozen=True, slots=True)
class PodSize:
    """What one pending pod asks for, as far as the batch order cares: memory in MiB, and devices.

    `plan_key`: set only for a pod a burst plan may place (one MIG device, one way to ask for it,
    nothing allocated yet): what must be equal for pods to be planned together (device class,
    selectors, node constraints), so that one allowed table and one node filter hold for all of them
    (driver/policy/placer.py `Placer.burst_group`). Not part of equality: the order reads only memory
    and devices."""

    memory_mib: int
    devices: int
    plan_key: Hashable | None = field(default=None, compare=False)

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
    policy: Policy, cluster: ClusterState, pods: Sequence[Sequence[DeviceRequest]], exact: bool = True
) -> list[Placement]:
    """One placement per pod (in input order), decided together; `cluster` is left as it was.

    The placements are mutually consistent: committing all the successful ones, in any order, is
    legal. A pod refused here may still fit once others leave; the caller keeps it pending.
    `exact=False`: largest first only, no plan (the behaviour before driver/policy/burstplan.py).
    """
    out: list[Placement | None] = [None] * len(pods)
    committed: list[Choice] = []

    def per_pod(i: int) -> None:
        placement = policy.place(cluster, pods[i])
        out[i] = placement
        if placement.ok:
            cluster.commit(placement.choices)
            committed.extend(placement.choices)

    try:
        order = batch_order(pods)
        packing = policy if exact and isinstance(policy, PackingPolicy) else None
        planned = [i for i in order if plain(pods[i])] if packing is not None else []
        if len(planned) < MIN_PODS:
            planned = []
        chosen = set(planned)
        for i in order:
            if i not in chosen:
                per_pod(i)
        plan = None
        if packing is not None and planned:
            plan = plan_burst(packing, cluster, [pods[i][0] for i in planned])
        for i, choice in zip(planned, plan or (), strict=False):
            if choice is not None:
                out[i] = Placement((choice,))
                cluster.commit((choice,))
                committed.append(choice)
        for i in planned:
            if out[i] is None:
                per_pod(i)
    finally:
        for choice in reversed(committed):
            cluster.release(choice.gpu, choice.profile, choice.start)
    return [p for p in out if p is not None]
