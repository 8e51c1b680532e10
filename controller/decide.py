"""One pod's claims -> one decision: every device of every claim on one node, or why not.

No I/O: the allocation loop, the benchmark and the property tests all call `Decider.decide` against the
same inventory/ledger. The policy (driver/policy) chooses node, GPU, profile and placement; this module
feeds it the candidates, walks `firstAvailable` alternatives in order (earlier ones win, as in
kube-scheduler), enforces `matchAttribute` / `distinctAttribute` constraints, and re-checks the result
against the published counters before anything is written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from api.constants import DRIVER_NAME
from controller.inventory import DeviceKey, PublishedDevice
from controller.ledger import Ledger
from controller.requests import (
    Alternative,
    CandidateIndex,
    Candidates,
    ClaimRequest,
    RequestError,
    allocation_config,
    claim_requests,
)
from driver.policy.allocator import Policy
from driver.policy.model import AllowedTable, Choice, DeviceRequest, GpuRef, Placement, ShortReason

MAX_ALTERNATIVE_COMBINATIONS = 16
MAX_CONSTRAINT_VALUES = 24


class ControllerReason(StrEnum):
    """Reasons the controller adds to the policy's ShortReason."""

    INVALID_REQUEST = "InvalidRequest"  # a claim asks for something we cannot allocate
    NO_MATCHING_DEVICE = "NoMatchingDevice"  # selectors admit no published MIG device
    CONSTRAINT_UNSATISFIED = "ConstraintUnsatisfied"  # matchAttribute/distinctAttribute
    COUNTERS_EXCEEDED = "CountersExceeded"  # safety net: published counters disagree


@dataclass(slots=True)
class ClaimAllocation:
    claim: Mapping[str, Any]
    results: list[dict[str, Any]]
    config: list[dict[str, Any]]
    devices: list[PublishedDevice]

    @property
    def uid(self) -> str:
        return str(self.claim["metadata"]["uid"])

    @property
    def keys(self) -> list[DeviceKey]:
        return [(d.pool, d.name) for d in self.devices]


@dataclass(slots=True)
class Decision:
    node: str | None = None
    allocations: list[ClaimAllocation] = field(default_factory=list)
    reason: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass(frozen=True, slots=True)
class _Slot:
    claim_index: int
    request: ClaimRequest
    alternative: Alternative
    policy_name: str


_EMPTY: frozenset[tuple[str, int]] = frozenset()


def node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


class Decider:
    def __init__(self, ledger: Ledger, index: CandidateIndex, policy: Policy) -> None:
        self.ledger = ledger
        self.index = index
        self.policy = policy

    def decide(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        node_ok: Callable[[str], bool] | None = None,
    ) -> Decision:
        """Place every request of `claims` on one node; `node_ok` excludes nodes (cordoned, selectors)."""
        try:
            per_claim = [claim_requests(c, classes) for c in claims]
        except RequestError as exc:
            return Decision(reason=ControllerReason.INVALID_REQUEST, message=str(exc))
        flat = [(ci, req) for ci, reqs in enumerate(per_claim) for req in reqs]
        last: Decision | None = None
        combos = itertools.product(*(req.alternatives for _, req in flat))
        for combo in itertools.islice(combos, MAX_ALTERNATIVE_COMBINATIONS):
            decision = self._try(claims, classes, list(zip(flat, combo, strict=True)), node_ok)
            if decision.ok:
                return decision
            if last is None:
                last = decision  # the first (most preferred) combination explains best
        assert last is not None
        return last

    def _try(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        picked: list[tuple[tuple[int, ClaimRequest], Alternative]],
        node_ok: Callable[[str], bool] | None,
    ) -> Decision:
        slots: list[_Slot] = []
        requests: list[DeviceRequest] = []
        for (ci, req), alt in picked:
            try:
                base, cands = self.index.device_request("", alt)
            except RequestError as exc:
                return Decision(reason=ControllerReason.INVALID_REQUEST, message=str(exc))
            if not cands.per_gpu:
                return self._no_match(req, alt, cands)
            # Same pairs as base.device_filter (restricted to node_ok's nodes), in a form the policy indexes.
            filt = AllowedTable(cands.per_gpu, node_ok)
            for i in range(alt.count):
                slot = _Slot(ci, req, alt, f"{ci}:{alt.result_name}:{i}")
                slots.append(slot)
                requests.append(DeviceRequest(slot.policy_name, base.memory_mib, device_filter=filt))
        placement = self.policy.place(self.ledger.cluster, requests)
        if placement.ok:
            problem = self._constraint_violation(claims, slots, placement)
            if problem is None:
                return self._decision(claims, classes, slots, placement)
            retried = self._retry_match(claims, classes, slots, requests, problem)
            if retried is not None:
                return retried
            return Decision(reason=ControllerReason.CONSTRAINT_UNSATISFIED, message=problem[1])
        return Decision(reason=str(placement.reason), message=placement.message)

    def _no_match(self, req: ClaimRequest, alt: Alternative, cands: Candidates) -> Decision:
        what = f"claim {req.claim} request {alt.result_name} (class {alt.class_name})"
        if cands.whole_only:
            msg = f"{what} matches only whole-GPU devices; the controller allocates MIG devices"
            return Decision(reason=ControllerReason.INVALID_REQUEST, message=msg)
        msg = f"{what}: no published MIG device matches its selectors"
        if cands.errors:
            msg += "; " + "; ".join(cands.errors)
        return Decision(reason=ControllerReason.NO_MATCHING_DEVICE, message=msg)

    # --- constraints --------------------------------------------------------------------------------

    def _device(self, choice: Choice) -> PublishedDevice:
        gpu = self.ledger.inventory.gpus[choice.gpu]
        name = gpu.mig_devices[(choice.profile.name, choice.start)]
        return self.ledger.inventory.pools[gpu.pool].devices[name]

    @staticmethod
    def _constrained(constraint: Mapping[str, Any], slot: _Slot) -> bool:
        names = constraint.get("requests") or []
        return not names or slot.request.name in names or slot.alternative.result_name in names

    def _constraint_violation(
        self, claims: Sequence[Mapping[str, Any]], slots: list[_Slot], placement: Placement
    ) -> tuple[str, str, list[_Slot]] | None:
        """(attribute, message, slots it covers) of the first violated matchAttribute, or None."""
        by_name = {c.request: c for c in placement.choices}
        for ci, claim in enumerate(claims):
            for constraint in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or ():
                covered = [s for s in slots if s.claim_index == ci and self._constrained(constraint, s)]
                values = [
                    self._device(by_name[s.policy_name]).attribute(self._attr(constraint)) for s in covered
                ]
                if constraint.get("matchAttribute"):
                    if None in values or len(set(map(repr, values))) > 1:
                        return (
                            self._attr(constraint),
                            f"claim {claim['metadata']['name']}: matchAttribute "
                            f"{constraint['matchAttribute']} needs one value across {len(covered)} devices",
                            covered,
                        )
                elif constraint.get("distinctAttribute") and len(set(map(repr, values))) < len(values):
                    return (
                        "",
                        f"claim {claim['metadata']['name']}: distinctAttribute "
                        f"{constraint['distinctAttribute']} not satisfiable by this placement",
                        covered,
                    )
        return None

    @staticmethod
    def _attr(constraint: Mapping[str, Any]) -> str:
        return str(constraint.get("matchAttribute") or constraint.get("distinctAttribute") or "")

    def _retry_match(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        slots: list[_Slot],
        requests: list[DeviceRequest],
        problem: tuple[str, str, list[_Slot]],
    ) -> Decision | None:
        """Pin the constrained requests to one attribute value at a time (most promising first)."""
        attribute, _, covered = problem
        if not attribute:
            return None
        names = {s.policy_name for s in covered}
        values: list[Any] = []
        for req in requests:
            if req.name not in names:
                continue
            for ref in self.ledger.cluster.nodes():
                for gpu in self.ledger.cluster.node_gpus(ref):
                    for profile, start in req.allowed(gpu.ref) or ():
                        dev = self.ledger.inventory.gpus[gpu.ref].mig_devices.get((profile, start))
                        if dev is None:
                            continue
                        value = (
                            self.ledger.inventory.pools[self.ledger.inventory.gpus[gpu.ref].pool]
                            .devices[dev]
                            .attribute(attribute)
                        )
                        if value is not None and value not in values:
                            values.append(value)
                    if len(values) >= MAX_CONSTRAINT_VALUES:
                        break
                if len(values) >= MAX_CONSTRAINT_VALUES:
                    break
            break
        for value in values:
            pinned = [self._pinned(r, attribute, value) if r.name in names else r for r in requests]
            placement = self.policy.place(self.ledger.cluster, pinned)
            if placement.ok and self._constraint_violation(claims, slots, placement) is None:
                return self._decision(claims, classes, slots, placement)
        return None

    def _pinned(self, request: DeviceRequest, attribute: str, value: Any) -> DeviceRequest:
        inventory = self.ledger.inventory
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
        return DeviceRequest(request.name, request.memory_mib, device_filter=filt)

    # --- result -------------------------------------------------------------------------------------

    def _decision(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        slots: list[_Slot],
        placement: Placement,
    ) -> Decision:
        by_name = {c.request: c for c in placement.choices}
        devices = [self._device(by_name[s.policy_name]) for s in slots]
        problem = self.ledger.counters_allow(devices)
        if problem is not None:
            return Decision(reason=ControllerReason.COUNTERS_EXCEEDED, message=problem)
        node = placement.node
        assert node is not None
        allocations = []
        for ci, claim in enumerate(claims):
            mine = [(s, d) for s, d in zip(slots, devices, strict=True) if s.claim_index == ci]
            chosen = {s.alternative.result_name: s.alternative for s, _ in mine}
            results = [
                {
                    "request": s.alternative.result_name,
                    "driver": DRIVER_NAME,
                    "pool": d.pool,
                    "device": d.name,
                }
                for s, d in mine
            ]
            allocations.append(
                ClaimAllocation(
                    claim, results, allocation_config(claim, classes, chosen), [d for _, d in mine]
                )
            )
        return Decision(node=node, allocations=allocations)


def short_reason_values() -> list[str]:
    return [r.value for r in ShortReason] + [r.value for r in ControllerReason]
