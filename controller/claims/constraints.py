"""Claim constraints (`matchAttribute`, `distinctAttribute`) over a combined MIG + share placement.

The policies place devices without knowing the constraints; a placement is then checked here, and a
violated `matchAttribute` is retried with every covered request pinned to one attribute value at a time
(most promising first, bounded). Shares of one claim never share a GPU (driver/policy/shared.py), so
`distinctAttribute: gpu.flexmig.dev/uuid` over shares always holds; other distinct attributes are
checked like MIG ones. As in kube-scheduler, a covered device lacking the attribute fails either kind.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from controller.claims.requests import Alternative, ClaimRequest
from controller.shared.shares import AltKind
from controller.state.inventory import Inventory, PublishedDevice
from driver.policy.cluster import ClusterState
from driver.policy.model import AllowedTable, Choice, DeviceRequest, GpuRef
from driver.policy.sharemodel import SharePick, ShareRequest

MAX_CONSTRAINT_VALUES = 24
_EMPTY: frozenset[tuple[str, int]] = frozenset()


@dataclass(frozen=True, slots=True)
class Slot:
    """One device of the pod: the claim and request it serves, the alternative, and how it is placed."""

    claim_index: int
    flat_index: int  # the request's position among all requests of the pod
    request: ClaimRequest
    alternative: Alternative
    policy_name: str
    kind: AltKind


class Plan:
    """Where every device of one combination goes: MIG choices and share picks, on one node."""

    __slots__ = ("mig", "shares")

    def __init__(self, choices: Sequence[Choice], picks: Sequence[SharePick]) -> None:
        self.mig = {c.request: c for c in choices}
        self.shares = {p.request: p for p in picks}

    @property
    def node(self) -> str | None:
        for c in self.mig.values():
            return c.gpu.node
        for p in self.shares.values():
            return p.gpu.node
        return None


@dataclass(frozen=True, slots=True)
class Problem:
    attribute: str  # set for matchAttribute (retried by pinning), empty for distinctAttribute
    message: str
    covered: tuple[Slot, ...]
    distinct: str = ""  # set for distinctAttribute (retried by pinning each device to its own value)


class ConstraintChecker:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def device(self, slot: Slot, plan: Plan) -> PublishedDevice:
        if slot.kind is AltKind.SHARED:
            return self._shared_device(plan.shares[slot.policy_name].gpu)
        choice = plan.mig[slot.policy_name]
        gpu = self.inventory.gpus[choice.gpu]
        name = gpu.mig_devices[(choice.profile.name, choice.start)]
        return self.inventory.pools[gpu.pool].devices[name]

    def _shared_device(self, ref: GpuRef) -> PublishedDevice:
        info = self.inventory.shared[ref]
        return self.inventory.pools[info.pool].devices[info.device]

    @staticmethod
    def _constrained(constraint: Mapping[str, Any], slot: Slot) -> bool:
        names = constraint.get("requests") or []
        return not names or slot.request.name in names or slot.alternative.result_name in names

    @staticmethod
    def _attr(constraint: Mapping[str, Any]) -> str:
        return str(constraint.get("matchAttribute") or constraint.get("distinctAttribute") or "")

    def violation(self, claims: Sequence[Mapping[str, Any]], slots: list[Slot], plan: Plan) -> Problem | None:
        """The first violated constraint of any claim, or None."""
        for ci, claim in enumerate(claims):
            for constraint in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or ():
                covered = tuple(s for s in slots if s.claim_index == ci and self._constrained(constraint, s))
                values = [self.device(s, plan).attribute(self._attr(constraint)) for s in covered]
                name = claim["metadata"]["name"]
                if constraint.get("matchAttribute"):
                    if None in values or len(set(map(repr, values))) > 1:
                        return Problem(
                            self._attr(constraint),
                            f"claim {name}: matchAttribute {constraint['matchAttribute']} needs one value "
                            f"across {len(covered)} devices",
                            covered,
                        )
                elif constraint.get("distinctAttribute") and (
                    None in values or len(set(map(repr, values))) < len(values)
                ):
                    # A device lacking the attribute fails the constraint, as upstream.
                    missing = " (a device lacks the attribute)" if None in values else ""
                    return Problem(
                        "",
                        f"claim {name}: distinctAttribute {constraint['distinctAttribute']} not satisfiable "
                        f"by this placement{missing}",
                        covered,
                        distinct=str(constraint["distinctAttribute"]),
                    )
        return None

    # --- retries ------------------------------------------------------------------------------------

    def _values(
        self,
        cluster: ClusterState,
        mig_requests: list[DeviceRequest],
        share_requests: list[ShareRequest],
        names: set[str],
        attribute: str,
    ) -> list[Any]:
        values: list[Any] = []
        for req in mig_requests:
            if req.name not in names:
                continue
            for ref in cluster.nodes():
                for gpu in cluster.node_gpus(ref):
                    inv = self.inventory.gpus[gpu.ref]
                    for ps in req.allowed(gpu.ref) or ():
                        dev = inv.mig_devices.get(ps)
                        if dev is None:
                            continue
                        value = self.inventory.pools[inv.pool].devices[dev].attribute(attribute)
                        if value is not None and value not in values:
                            values.append(value)
                    if len(values) >= MAX_CONSTRAINT_VALUES:
                        return values
            break
        for sreq in share_requests:
            if sreq.name not in names:
                continue
            for sref in sreq.amounts:
                value = self._shared_device(sref).attribute(attribute)
                if value is not None and value not in values:
                    values.append(value)
                if len(values) >= MAX_CONSTRAINT_VALUES:
                    return values
            break
        return values

    def pinned_variants(
        self,
        cluster: ClusterState,
        slots: list[Slot],
        mig_requests: list[DeviceRequest],
        share_requests: list[ShareRequest],
        problem: Problem,
    ) -> Iterator[tuple[list[DeviceRequest], list[ShareRequest]]]:
        """The requests with the covered ones pinned to one value of the matchAttribute, value by value;
        for a distinctAttribute, the covered MIG devices pinned to different values, set by set."""
        if problem.distinct:
            yield from self._distinct_variants(cluster, mig_requests, share_requests, problem)
            return
        if not problem.attribute:
            return
        names = {s.policy_name for s in problem.covered}
        for value in self._values(cluster, mig_requests, share_requests, names, problem.attribute):
            yield (
                [self._pinned(r, problem.attribute, value) if r.name in names else r for r in mig_requests],
                [
                    ShareRequest(
                        r.name,
                        {
                            ref: a
                            for ref, a in r.amounts.items()
                            if self._shared_device(ref).attribute(problem.attribute) == value
                        },
                        r.group,
                    )
                    if r.name in names
                    else r
                    for r in share_requests
                ],
            )

    def _distinct_variants(
        self,
        cluster: ClusterState,
        mig_requests: list[DeviceRequest],
        share_requests: list[ShareRequest],
        problem: Problem,
    ) -> Iterator[tuple[list[DeviceRequest], list[ShareRequest]]]:
        """The placement policy packs (several MIG devices on one GPU when it costs least), so a
        distinctAttribute it broke (e.g. `parentUUID`: N devices on N GPUs, the shim's meaning of
        nvidia.com/gpu: N) is retried with device i pinned to the i-th value of a set of distinct values
        offered on one node, set by set, node by node (bounded). Shares of a claim are on distinct GPUs
        already (driver/policy/shared.py), so only MIG devices are pinned."""
        attribute = problem.distinct
        names = [s.policy_name for s in problem.covered if s.kind is AltKind.MIG]
        if len(names) < 2:
            return
        covered = [r for r in mig_requests if r.name in names]
        tried = 0
        for node in cluster.nodes():
            values: list[Any] = []
            for gpu in cluster.node_gpus(node):
                inv = self.inventory.gpus[gpu.ref]
                devices = self.inventory.pools[inv.pool].devices
                for req in covered:
                    for ps in req.allowed(gpu.ref) or ():
                        dev = inv.mig_devices.get(ps)
                        value = devices[dev].attribute(attribute) if dev is not None else None
                        if value is not None and value not in values:
                            values.append(value)
            for combo in itertools.combinations(values, len(names)):
                if tried >= MAX_CONSTRAINT_VALUES:
                    return
                tried += 1
                pins = dict(zip(names, combo, strict=True))
                yield (
                    [self._pinned(r, attribute, pins[r.name]) if r.name in pins else r for r in mig_requests],
                    share_requests,
                )

    def _pinned(self, request: DeviceRequest, attribute: str, value: Any) -> DeviceRequest:
        inventory = self.inventory
        cache: dict[GpuRef, frozenset[tuple[str, int]]] = {}

        def allowed(ref: GpuRef) -> Set[tuple[str, int]]:
            hit = cache.get(ref)
            if hit is None:
                gpu = inventory.gpus[ref]
                devices = inventory.pools[gpu.pool].devices
                hit = frozenset(
                    ps
                    for ps in request.allowed(ref) or ()
                    if devices[gpu.mig_devices[ps]].attribute(attribute) == value
                )
                cache[ref] = hit
            return hit

        filt: Callable[[GpuRef], Set[tuple[str, int]]] = allowed
        return DeviceRequest(request.name, request.memory_mib, device_filter=filt, end_hint=request.end_hint)

    @staticmethod
    def restrict(request: DeviceRequest, nodes: Set[str]) -> DeviceRequest:
        """The same request, admitted only on `nodes` (kept an AllowedTable so the policy can index it)."""
        filt = request.device_filter
        if isinstance(filt, AllowedTable):
            outer = filt.node_ok
            table = AllowedTable(filt.table, lambda n: n in nodes and (outer is None or outer(n)))
            return DeviceRequest(
                request.name, request.memory_mib, device_filter=table, end_hint=request.end_hint
            )

        def allowed(ref: GpuRef) -> Set[tuple[str, int]]:
            if ref.node not in nodes:
                return _EMPTY
            return request.allowed(ref) or _EMPTY

        return DeviceRequest(
            request.name, request.memory_mib, device_filter=allowed, end_hint=request.end_hint
        )
