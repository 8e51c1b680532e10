"""Which kind of device serves a request alternative, what its shares consume, and the mixed-pool rule.

An alternative is served by MIG devices when its selectors admit published MIG devices and it asks for
no capacity; by shares of HAMi-core GPUs when it asks for capacity, or when its selectors admit only
`gpu-<i>-shared` devices; by whole GPUs (`gpu-<i>`, driver/policy/whole.py) when its selectors admit
whole-GPU devices and neither of the others. (A selector admitting MIG devices and other kinds, without
capacity requests, is a MIG request, as before whole GPUs were allocated: a GPU is taken whole or
shared only when asked for on purpose, through its class or capacity. Whole GPUs have no request
policy, so capacity requests on them are refused.)

Mixed pools (contract C3 of docs/architecture.md, mode `any`: a `firstAvailable` request with a MIG alternative and a HAMi-core
alternative): instead of the first alternative that fits, the controller takes the one that strands
the least GPU memory, summed over the request's devices:
- a MIG device strands its profile's memory beyond what the request needs, where "needs" is what the
  request's HAMi-core alternative states (its `capacity.requests.memory`, or its memoryPercentage of
  the MIG device's parent GPU; without either, the whole GPU, so nothing is stranded);
- a share holds exactly what it asks, so it strands nothing, unless it takes the GPU's last split slot:
  then the memory still free on that GPU can no longer be given to anyone and counts as stranded.
Ties go to MIG (hardware isolation of memory, SMs and faults), then to the order of the alternatives.
Other `firstAvailable` requests keep KEP semantics: the first alternative that can be allocated wins.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from api.constants import DRIVER_NAME
from controller.claims.candidates import CandidateIndex, Candidates
from controller.claims.requests import Alternative, ClaimRequest, RequestError
from controller.shared.capacity import ShareRequestError, ShareSpec, ShareTooLarge, consumed_capacity
from controller.state.inventory import Inventory, PublishedDevice
from driver.policy.model import Choice, GpuRef
from driver.policy.sharemodel import ShareAmount, ShareOptions


class AltKind(StrEnum):
    MIG = "mig"
    SHARED = "shared"
    WHOLE = "whole"
    NONE = "none"  # no published device matches


@dataclass(frozen=True, slots=True)
class Classified:
    kind: AltKind
    mig: Candidates
    shared: Mapping[GpuRef, PublishedDevice]
    whole: frozenset[GpuRef] = frozenset()


def classify(index: CandidateIndex, alt: Alternative, where: str) -> Classified:
    """The kind of device that serves `alt` (RequestError for capacity asked of MIG devices only)."""
    mig = index.candidates(alt.selectors)
    shared = index.shared_candidates(alt.selectors)
    if alt.capacity_requested:
        if shared:
            return Classified(AltKind.SHARED, mig, shared)
        if mig.per_gpu or index.whole_candidates(alt.selectors):
            raise RequestError(
                f"{where}.capacity: only MIG or whole-GPU devices match and those are not shareable; "
                "remove capacity.requests or select shared devices (class hami-core.gpu.flexmig.dev)"
            )
        return Classified(AltKind.NONE, mig, shared)
    if mig.per_gpu:
        return Classified(AltKind.MIG, mig, shared)
    if shared:
        return Classified(AltKind.SHARED, mig, shared)
    whole = index.whole_candidates(alt.selectors)
    if whole:
        return Classified(AltKind.WHOLE, mig, shared, whole)
    return Classified(AltKind.NONE, mig, shared)


_WHERE = "\x00where\x00"
"""Stands for the request's location in cached refusal messages; replaced by it when returned."""


class ShareAmounts:
    """Per shared GPU, what one share of an alternative consumes there (cached per inventory).

    The cache is keyed by the request's shape only, so two claims with the same request shape share one entry:
    refusal messages are cached with a placeholder for the claim's location, replaced by `where` when returned.
    """

    def __init__(self, inventory: Inventory, cache: dict[tuple[Any, ...], Any]) -> None:
        self.inventory = inventory
        self._cache = cache  # owned by the CandidateIndex, so it lives as long as the inventory

    def amounts(
        self, alt: Alternative, shared: Mapping[GpuRef, PublishedDevice], where: str
    ) -> tuple[ShareOptions, str, bool]:
        """(GPU -> amount, first refusal message naming `where`, whether every refusal was 'too large')."""
        spec = alt.share or ShareSpec({})
        key = (alt.selectors, tuple(sorted(spec.requests.items())), spec.memory_percent)
        hit: tuple[ShareOptions, str, bool] | None = self._cache.get(key)
        if hit is None:
            out: dict[GpuRef, ShareAmount] = {}
            first = ""
            only_size = True
            for ref in shared:
                info = self.inventory.shared.get(ref)
                if info is None:
                    continue
                try:
                    out[ref] = spec.amount(info, _WHERE)
                except ShareRequestError as exc:
                    first = first or str(exc)
                    only_size &= isinstance(exc, ShareTooLarge)
            hit = (ShareOptions(out), first, only_size)
            self._cache[key] = hit
        options, first, only_size = hit
        return options, first.replace(_WHERE, where), only_size


def share_result(request: str, dev: PublishedDevice, amount: ShareAmount) -> dict[str, Any]:
    """One allocation result on a shared device (contract C2)."""
    return {
        "request": request,
        "driver": DRIVER_NAME,
        "pool": dev.pool,
        "device": dev.name,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": consumed_capacity(amount),
    }


def is_mixed(kinds: list[AltKind]) -> bool:
    return AltKind.MIG in kinds and AltKind.SHARED in kinds


def mig_stranded(inventory: Inventory, request: ClaimRequest, choice: Choice) -> int:
    """MiB a MIG device holds beyond what the request's shared alternative asks (see module rule)."""
    gpu = inventory.gpus.get(choice.gpu)
    total = gpu.catalog.gpu.memory_total_mib if gpu is not None else choice.profile.memory_mib
    needed = total
    for alt in request.alternatives:
        if alt.share is None:
            continue
        hint = alt.share.memory_hint_mib()
        if hint is not None:
            needed = hint
        elif alt.share.memory_percent is not None:
            needed = total * alt.share.memory_percent // 100
        break
    return max(0, choice.profile.memory_mib - needed)
