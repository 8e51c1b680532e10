"""`adminAccess` requests: devices given for monitoring, in use or not, never counted as held.

Upstream (the structured allocator, GA since 1.36) gives an adminAccess request any device its
selectors and tolerations admit, whether or not another claim holds it; the device is not marked in
use, so later claims may still take it, and each result carries `adminAccess: true`. One claim never
gets one device twice. The API server admits such claims only in namespaces labelled
`resource.kubernetes.io/admin-access: "true"` (on create, and on the status write of an allocation),
so the controller needs no namespace view of its own.

flexmig's devices differ from upstream's plain ones in what exists: a MIG device is a placement whose
GI is created by the claim that holds it. An admin request is therefore given a MIG device only while
another claim holds it, or another claim of the same pod is being given it (an instance exists, or
is being made, for the admin to watch); a free placement has nothing to monitor and creating one
would take capacity nobody counts. Whole GPUs and shared GPUs exist regardless and are given whether
used or not. Upstream also checks counters for
admin requests, which refuses every in-use device of a partitionable GPU (its own counters are taken)
— the very devices monitoring is for; flexmig does not (docs/native-claims.md, deliberate differences).

The admin devices go on the node the rest of the pod's devices chose (or, for a pod of admin requests
only, the first node by name where they all fit), first fit in slice order, constraints of the claim
checked over all its devices. allocationMode All gives every eligible device of the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.constants import DRIVER_NAME, DeviceKind
from controller.allocation.decision import ClaimAllocation, ControllerReason, Decision
from controller.allocation.upstream import tolerated
from controller.claims.candidates import CandidateIndex
from controller.claims.fields import ALLOCATION_RESULTS_MAX
from controller.claims.requests import Alternative, ClaimRequest
from controller.claims.resultconfig import allocation_config
from controller.state.inventory import PublishedDevice
from controller.state.ledger import Ledger

# Device choices tried per pod before a constraint over admin devices is declared unsatisfiable.
MAX_STEPS = 20_000


@dataclass(frozen=True, slots=True)
class AdminRequest:
    claim_index: int
    request: ClaimRequest

    @property
    def alt(self) -> Alternative:
        return self.request.alternatives[0]

    @property
    def where(self) -> str:
        return f"claim {self.request.claim} spec.devices.requests[{self.alt.result_name}].exactly.adminAccess"


def split(per_claim: Sequence[Sequence[ClaimRequest]]) -> tuple[list[AdminRequest], list[list[ClaimRequest]]]:
    """The pod's admin requests, and every claim's other requests (admin is only ever in `exactly`)."""
    admins = [
        AdminRequest(ci, r) for ci, reqs in enumerate(per_claim) for r in reqs if r.alternatives[0].admin
    ]
    rest = [[r for r in reqs if not r.alternatives[0].admin] for reqs in per_claim]
    return admins, rest


class AdminPicker:
    def __init__(self, ledger: Ledger, index: CandidateIndex, admins: Sequence[AdminRequest]) -> None:
        self.ledger = ledger
        self.admins = admins
        self._match = {a.alt.selectors: index.matcher(a.alt.selectors) for a in admins}
        self._eligible: dict[tuple[tuple[str, ...], str], list[PublishedDevice]] = {}
        # MIG devices this pod's other claims are being given: an admin may watch them too (upstream
        # lets an admin take a device allocating for another claim; its instance will exist).
        self._pending: frozenset[tuple[str, str]] = frozenset()

    def eligible(self, alt: Alternative, node: str) -> list[PublishedDevice]:
        """The devices of `node` an admin alternative may get, in slice order (see the module rule)."""
        key = (alt.selectors, node)
        hit = self._eligible.get(key)
        if hit is None:
            match = self._match[alt.selectors]
            hit = [
                dev
                for pool in self.ledger.inventory.pools.values()
                if pool.node == node
                for dev in pool.devices.values()
                if dev.kind is not None
                and (
                    dev.kind is not DeviceKind.MIG
                    or (dev.pool, dev.name) in self._pending
                    or self.ledger.holders((dev.pool, dev.name))
                )
                and match(dev)
            ]
            self._eligible[key] = hit
        return hit

    def nodes(self, node_ok: Callable[[str], bool] | None) -> set[str]:
        """Nodes where every admin request finds enough eligible devices (before constraints)."""
        names = {p.node for p in self.ledger.inventory.pools.values() if p.node is not None}
        return {
            n
            for n in names
            if (node_ok is None or node_ok(n))
            and all(
                len(self.eligible(a.alt, n)) >= (1 if a.alt.all_devices else a.alt.count) for a in self.admins
            )
        }

    def why_none(self) -> Decision:
        first = self.admins[0]
        return Decision(
            reason=ControllerReason.NO_MATCHING_DEVICE,
            message=f"{first.where}: no node that may take the pod has the "
            f"{'matching devices' if first.alt.all_devices else f'{first.alt.count} matching device(s)'} "
            "for every adminAccess request; a MIG device is given to an admin only while another claim "
            "holds it (a free placement has no instance to watch): select whole GPUs "
            "(class gpu.flexmig.dev) to see a GPU whatever runs on it",
        )

    def complete(
        self,
        decision: Decision,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        per_claim: Sequence[Sequence[ClaimRequest]],
    ) -> Decision:
        """`decision` (the pod's other devices, on decision.node) with the admin devices added."""
        node = decision.node
        assert node is not None
        by_uid = {a.uid: a for a in decision.allocations}
        allocations = [
            by_uid.get(str(c["metadata"]["uid"])) or ClaimAllocation(c, [], [], []) for c in claims
        ]
        picks = self._pick(node, claims, allocations)
        if isinstance(picks, Decision):
            return picks
        for ci, (claim, alloc) in enumerate(zip(claims, allocations, strict=True)):
            mine = [(a, d) for a, d in picks if a.claim_index == ci]
            if not mine:
                continue
            results = alloc.results + [
                tolerated(
                    {
                        "request": a.alt.result_name,
                        "driver": DRIVER_NAME,
                        "pool": d.pool,
                        "device": d.name,
                        "adminAccess": True,
                    },
                    a.alt,
                )
                for a, d in mine
            ]
            if len(results) > ALLOCATION_RESULTS_MAX:
                return Decision(
                    reason=ControllerReason.INVALID_REQUEST,
                    message=f"claim {claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}: "
                    f"these requests need {len(results)} results; a claim holds at most "
                    f"{ALLOCATION_RESULTS_MAX} (AllocationResultsMaxSize): select fewer devices for "
                    "allocationMode All, or split the requests over several claims",
                )
            chosen = {r["request"]: self._alternative(per_claim[ci], r["request"]) for r in results}
            # The admin devices are not held: `held` stays what the other requests hold, and a claim
            # of admin requests only holds nothing (ClaimAllocation.keys).
            allocations[ci] = ClaimAllocation(
                claim,
                results,
                allocation_config(claim, classes, chosen),
                alloc.devices,
                alloc.held or [(d.pool, d.name) for d in alloc.devices],
            )
        return Decision(
            node=node,
            allocations=allocations,
            stranded_mib=decision.stranded_mib,
            isolated=decision.isolated,
        )

    def decide(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        per_claim: Sequence[Sequence[ClaimRequest]],
        rest: Sequence[Sequence[ClaimRequest]],
        node_ok: Callable[[str], bool] | None,
        others: Callable[[Sequence[Sequence[ClaimRequest]], Callable[[str], bool] | None], Decision],
    ) -> Decision:
        """The pod's decision: `others` places the other requests on a node where the admin requests
        find devices too; a pod of admin requests only takes the first such node where they fit."""
        nodes = self.nodes(node_ok)
        if any(rest):
            if nodes:
                decision = others(rest, nodes.__contains__)
                done = self.complete(decision, claims, classes, per_claim) if decision.ok else decision
                if done.ok:
                    return done
            # The admin may want a MIG device this very pod is being given: decide the rest where
            # the pod may go, then look again with those devices counted as existing.
            decision = others(rest, node_ok)
            if not decision.ok:
                return decision if nodes else self.why_none()
            self._pending = frozenset((d.pool, d.name) for a in decision.allocations for d in a.devices)
            self._eligible.clear()
            done = self.complete(decision, claims, classes, per_claim)
            return done if done.ok or nodes else self.why_none()
        if not nodes:
            return self.why_none()
        failure: Decision | None = None
        for node in sorted(nodes):
            decision = self.complete(Decision(node=node), claims, classes, per_claim)
            if decision.ok:
                return decision
            failure = failure or decision
        assert failure is not None
        return failure

    @staticmethod
    def _alternative(requests: Sequence[ClaimRequest], result_name: str) -> Alternative:
        return next(a for r in requests for a in r.alternatives if a.result_name == result_name)

    # --- choosing devices ---------------------------------------------------------------------------

    def _pick(
        self, node: str, claims: Sequence[Mapping[str, Any]], allocations: Sequence[ClaimAllocation]
    ) -> list[tuple[AdminRequest, PublishedDevice]] | Decision:
        """One device per admin slot: distinct within a claim, the claim's constraints holding."""
        slots: list[tuple[AdminRequest, list[PublishedDevice]]] = []
        for a in self.admins:
            devs = self.eligible(a.alt, node)
            slots += [(a, devs)] * (len(devs) if a.alt.all_devices else a.alt.count)
        taken: list[PublishedDevice] = []
        steps = [0]

        def fits(i: int, dev: PublishedDevice) -> bool:
            a = slots[i][0]
            ci = a.claim_index
            same = [d for (b, _), d in zip(slots, taken, strict=False) if b.claim_index == ci]
            if any(d.pool == dev.pool and d.name == dev.name for d in same + allocations[ci].devices):
                return False  # upstream: one claim never gets a device twice
            return self._constraints_hold(claims[ci], allocations[ci], slots[: i + 1], [*taken, dev], ci)

        def search(i: int) -> bool:
            if i == len(slots):
                return True
            for dev in slots[i][1]:
                steps[0] += 1
                if steps[0] > MAX_STEPS:
                    return False
                if fits(i, dev):
                    taken.append(dev)
                    if search(i + 1):
                        return True
                    taken.pop()
            return False

        if search(0):
            return [(a, d) for (a, _), d in zip(slots, taken, strict=True)]
        return Decision(
            reason=ControllerReason.CONSTRAINT_UNSATISFIED,
            message=f"{self.admins[0].where}: on node {node} no choice of the admin devices keeps the "
            "claim's constraints (matchAttribute / distinctAttribute over every device of the claim) "
            "and gives one claim each device once",
        )

    @staticmethod
    def _constraints_hold(
        claim: Mapping[str, Any],
        alloc: ClaimAllocation,
        slots: Sequence[tuple[AdminRequest, list[PublishedDevice]]],
        taken: Sequence[PublishedDevice],
        ci: int,
    ) -> bool:
        """The claim's constraints over its devices so far (the others' and the admin ones picked):
        the same rules as controller/claims/constraints.py, a missing attribute failing either kind."""
        for constraint in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or ():
            names = constraint.get("requests") or []
            attr = str(constraint.get("matchAttribute") or constraint.get("distinctAttribute") or "")
            values = list(_covered_values(names, attr, alloc, slots, taken, ci))
            if not any(admin for admin, _ in values):
                continue  # only the other devices: already checked by the decision
            plain = [repr(v) for _, v in values]
            if any(v is None for _, v in values):
                return False
            if constraint.get("matchAttribute") and len(set(plain)) > 1:
                return False
            if constraint.get("distinctAttribute") and len(set(plain)) < len(plain):
                return False
        return True


def _covered_values(
    names: Sequence[str],
    attr: str,
    alloc: ClaimAllocation,
    slots: Sequence[tuple[AdminRequest, list[PublishedDevice]]],
    taken: Sequence[PublishedDevice],
    ci: int,
) -> Iterator[tuple[bool, Any]]:
    """(is admin, attribute value) of every device of the claim a constraint covers."""
    for result, dev in zip(alloc.results, alloc.devices, strict=False):
        request = str(result["request"])
        if not names or request in names or request.split("/", 1)[0] in names:
            yield False, dev.attribute(attr)
    for (a, _), dev in zip(slots, taken, strict=False):
        if a.claim_index == ci and (not names or a.request.name in names):
            yield True, dev.attribute(attr)


__all__ = ["AdminPicker", "AdminRequest", "split"]
