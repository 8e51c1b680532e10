"""Invariants over what the API server holds: every claim's `status.allocation` against the slices.

Independent of the controller's ledger on purpose (a check that reads the allocator's own bookkeeping
cannot see the allocator's mistakes): it recounts from the claims as stored. Used by the tests (unit,
property, e2e) and usable by any soak that lists claims and slices from a live API server.

Violations:
- `device-twice`: an exclusive device (MIG or whole GPU) named in the allocations of two claims (or
  twice in one);
- `placement-overlap`: two allocated MIG devices of one GPU whose memory-slice ranges intersect;
- `whole-and-mig`: a GPU's whole device allocated while a MIG device of it is allocated too;
- `counter-exceeded`: a pool's counter set consumed beyond what it publishes (kube-scheduler's rule);
- `unreadable`: a claim whose status.allocation is not the API's shape;
- `share-exceeded`: the shares on a hami-core GPU consume more memory, cores or split slots than it
  offers (a result without consumedCapacity counts at the published defaults).
Devices the slices do not publish (withdrawn since) are not checked for geometry; two claims naming
one still count as `device-twice`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from api.constants import DRIVER_NAME, DeviceKind
from controller.shared.capacity import consumed_amount
from controller.state.inventory import Inventory
from driver.policy.model import GpuRef


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Our driver's results; ValueError when the allocation cannot be read."""
    try:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        results = (alloc.get("devices") or {}).get("results") or ()
        # adminAccess results hold nothing (upstream): a device they name is not held twice.
        return [r for r in results if r.get("driver") == DRIVER_NAME and not r.get("adminAccess")]
    except (AttributeError, TypeError) as exc:
        raise ValueError(f"status.allocation is not readable: {exc}") from exc


def audit_allocations(
    claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]
) -> list[Violation]:
    inventory = Inventory(list(slices))
    out: list[Violation] = []
    exclusive: dict[tuple[str, str], list[str]] = defaultdict(list)
    masks: dict[GpuRef, list[tuple[int, str, str]]] = defaultdict(list)  # (mask, device, claim)
    whole: dict[GpuRef, tuple[str, str]] = {}
    counters: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    shares: dict[GpuRef, list[int]] = defaultdict(lambda: [0, 0, 0])
    for claim in claims:
        who = _key(claim)
        try:
            results = _results(claim)
        except ValueError as exc:
            out.append(Violation("unreadable", f"{who}: {exc}"))
            continue
        for r in results:
            pool, device = str(r.get("pool")), str(r.get("device"))
            dev = inventory.device((pool, device))
            shared = r.get("shareID") is not None or (dev is not None and dev.kind is DeviceKind.SHARED)
            if shared:
                ref = dev.gpu if dev is not None else None
                info = inventory.shared.get(ref) if ref is not None else None
                if ref is None or info is None:
                    continue
                amount = consumed_amount(r, info) if r.get("consumedCapacity") else info.default_amount()
                if amount is None:
                    amount = info.default_amount()
                held = shares[ref]
                held[0] += amount.memory_mib
                held[1] += amount.cores
                held[2] += amount.shares
                continue
            exclusive[(pool, device)].append(who)
            if dev is None or dev.gpu is None:
                continue
            for counter_set, values in dev.consumes:
                for name, value in values:
                    counters[(pool, counter_set)][name] += value
            if dev.kind is DeviceKind.WHOLE:
                whole[dev.gpu] = (device, who)
            elif dev.start is not None and dev.size is not None:
                masks[dev.gpu].append((((1 << dev.size) - 1) << dev.start, device, who))
    for (pool, device), owners in sorted(exclusive.items()):
        if len(owners) > 1:
            out.append(Violation("device-twice", f"{pool}/{device} allocated to {sorted(owners)}"))
    for ref, placed in sorted(masks.items(), key=lambda kv: str(kv[0])):
        for i, (mask_a, dev_a, who_a) in enumerate(placed):
            for mask_b, dev_b, who_b in placed[i + 1 :]:
                if mask_a & mask_b and dev_a != dev_b:
                    out.append(
                        Violation("placement-overlap", f"{ref}: {dev_a} ({who_a}) overlaps {dev_b} ({who_b})")
                    )
        if ref in whole:
            dev_w, who_w = whole[ref]
            out.append(
                Violation(
                    "whole-and-mig", f"{ref}: whole {dev_w} ({who_w}) and MIG {placed[0][1]} ({placed[0][2]})"
                )
            )
    for (pool, counter_set), used in sorted(counters.items()):
        p = inventory.pools.get(pool)
        available = p.counter_sets.get(counter_set, {}) if p is not None else {}
        for name, value in sorted(used.items()):
            if value > available.get(name, Fraction(0)):
                out.append(
                    Violation(
                        "counter-exceeded",
                        f"{pool}/{counter_set}/{name}: {value} used of {available.get(name, 0)}",
                    )
                )
    for ref, (mem, cores, n) in sorted(shares.items(), key=lambda kv: str(kv[0])):
        cap = inventory.shared[ref].total()
        if mem > cap.memory_mib or cores > cap.cores or n > cap.shares:
            out.append(
                Violation(
                    "share-exceeded",
                    f"{ref}: memory {mem}/{cap.memory_mib} MiB, cores {cores}/{cap.cores}, "
                    f"shares {n}/{cap.shares}",
                )
            )
    return out
