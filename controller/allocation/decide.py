"""One pod's claims -> one decision: every device of every claim on one node, or why not.

No I/O: the allocation loop, the benchmark and the property tests all call `Decider.decide` against the
same inventory/ledger. Every placement rule is reached through driver/policy/placer.py's `Placer`: the
MIG policy chooses node, GPU, profile and placement of MIG devices; the share policy chooses the
HAMi-core GPUs of shares; the whole-GPU policy (combined in controller/allocation/wholeplan.py) chooses
the idle GPUs of whole-GPU requests; this module feeds them the candidates, keeps every device of the
pod on one node, walks `firstAvailable` alternatives (earlier ones win, as in kube-scheduler, except
that a request of a claim generated from a shim template (its `LABEL_SHIM_TEMPLATE` label) mixing MIG
and HAMi-core alternatives takes the one stranding the least memory: controller/shared/shares.py; in
a user's claim the order is the user's priority), enforces `matchAttribute` / `distinctAttribute`
constraints, and re-checks the result against the published counters (MIG and whole devices) before
anything is written. `allocationMode: All` is tried node by node (controller/allocation/allmode.py);
adminAccess requests get their devices after the rest (controller/allocation/adminaccess.py); the
results of a placed combination are built by controller/allocation/results.py;
the rules kept from kube-scheduler's allocator (the 32-result limit, tolerations in results) are in
controller/allocation/upstream.py. docs/native-claims.md lists every field and the differences.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from controller.allocation import adminaccess, allmode
from controller.allocation.decision import (
    ClaimAllocation,
    ControllerReason,
    Decision,
    node_selector,
    short_reason_values,
)
from controller.allocation.nomatch import no_match_message
from controller.allocation.results import decision_of
from controller.allocation.upstream import explain, one_node, result_limit, shim_claim
from controller.allocation.wholeplan import Checker, Unplaced, WholePlacer
from controller.claims.candidates import CandidateIndex, Candidates
from controller.claims.constraints import Plan, Slot
from controller.claims.requests import Alternative, ClaimRequest, RequestError, claim_requests
from controller.claims.resultconfig import dedicated
from controller.shared.shares import (
    AltKind,
    Classified,
    ShareAmounts,
    classify,
    is_mixed,
)
from controller.state.ledger import Ledger
from driver.policy.model import AllowedTable, DeviceRequest, EndHint, GpuRef, ShortReason
from driver.policy.placer import Placer, Policy
from driver.policy.sharemodel import SharedGpuState, ShareRequest
from driver.policy.wholemodel import IdleGpus, WholeRequest

MAX_ALTERNATIVE_COMBINATIONS = 16


Picked = list[tuple[tuple[int, ClaimRequest], Alternative]]


class Decider:
    def __init__(self, ledger: Ledger, index: CandidateIndex, policy: Policy | Placer) -> None:
        self.ledger = ledger
        self.index = index
        self.placer = policy if isinstance(policy, Placer) else Placer(policy)
        self.amounts = ShareAmounts(ledger.inventory, index.share_amounts_cache)
        self.check = Checker(ledger.inventory)
        self._states: Mapping[GpuRef, SharedGpuState] = {}
        self._idle: IdleGpus | None = None  # the idle GPUs, computed once per decision when needed
        self._classified: dict[tuple[str, str], Classified | Decision] = {}
        self._end_hint: EndHint | None = None
        self._shim_uids: Set[str] = frozenset()

    def decide(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        node_ok: Callable[[str], bool] | None = None,
        end_hint: EndHint | None = None,
        shim_uids: Set[str] = frozenset(),
    ) -> Decision:
        """Place every request of `claims` on one node; `node_ok` excludes nodes (cordoned, selectors);
        `end_hint`, the pod's expected end (controller/allocation/lifetime.py), goes with every MIG
        device to the policy, which co-locates pods ending together. `shim_uids`: claims made from
        shim templates that predate the claim label (controller/allocation/upstream.py)."""
        self._end_hint = end_hint
        self._shim_uids = shim_uids
        try:
            per_claim = [claim_requests(c, classes, self.index) for c in claims]
        except RequestError as exc:
            return Decision(reason=ControllerReason.INVALID_REQUEST, message=str(exc))
        admins, rest = adminaccess.split(per_claim)
        if admins:
            picker = adminaccess.AdminPicker(self.ledger, self.index, admins)
            return picker.decide(
                claims, classes, per_claim, rest, node_ok, lambda r, ok: self._decide(claims, classes, r, ok)
            )
        return self._decide(claims, classes, per_claim, node_ok)

    def _decide(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        per_claim: Sequence[Sequence[ClaimRequest]],
        node_ok: Callable[[str], bool] | None,
    ) -> Decision:
        self._states = self.ledger.shared_states()
        self._idle = None
        self._classified = {}
        flat = [(ci, req) for ci, reqs in enumerate(per_claim) for req in reqs]
        mixed = {
            i
            for i, (ci, req) in enumerate(flat)
            if shim_claim(claims[ci], self._shim_uids) and self._mixed(req)
        }
        mixed_order = sorted(mixed)
        strict = [i for i in range(len(flat)) if i not in mixed]
        failures: list[Decision] = []
        tried = 0
        # Strict requests in KEP order (outer loop, first success wins); for each, every combination of
        # the mixed requests' alternatives, the least stranded memory winning (controller/shared/shares.py).
        for outer in itertools.product(*(flat[i][1].alternatives for i in strict)):
            best: tuple[tuple[int, int, int], Decision] | None = None
            for order, inner in enumerate(itertools.product(*(flat[i][1].alternatives for i in mixed_order))):
                if tried >= MAX_ALTERNATIVE_COMBINATIONS:
                    break
                tried += 1
                chosen = dict(zip(strict, outer, strict=True)) | dict(zip(mixed_order, inner, strict=True))
                picked = [(flat[i], chosen[i]) for i in range(len(flat))]
                decision = self._try(claims, classes, picked, node_ok, mixed)
                if decision.ok:
                    key = (decision.stranded_mib, -decision.isolated, order)
                    if best is None or key < best[0]:
                        best = (key, decision)
                    if not mixed:
                        break
                else:
                    failures.append(decision)
            if best is not None:
                return best[1]
            if tried >= MAX_ALTERNATIVE_COMBINATIONS:
                break
        # The reason of the first (most preferred) combination; the message says why each one failed.
        first = failures[0]
        if len(failures) > 1:
            messages = list(dict.fromkeys(f.message for f in failures if f.message))
            return Decision(reason=first.reason, message="; or: ".join(messages[:3]))
        return first

    # --- classification ------------------------------------------------------------------------------

    def _classify(self, req: ClaimRequest, alt: Alternative) -> Classified | Decision:
        key = (req.claim, alt.result_name)
        hit = self._classified.get(key)
        if hit is None:
            where = f"claim {req.claim} spec.devices.requests[{alt.result_name}]"
            try:
                hit = classify(self.index, dedicated(self.index, alt), where)
            except RequestError as exc:
                # A selector that does not compile says nothing of where it is written: name the request.
                text = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
                hit = Decision(reason=ControllerReason.INVALID_REQUEST, message=text)
            self._classified[key] = hit
        return hit

    def _mixed(self, req: ClaimRequest) -> bool:
        if len(req.alternatives) < 2:
            return False
        kinds = [c.kind for a in req.alternatives if isinstance(c := self._classify(req, a), Classified)]
        return is_mixed(kinds)

    # --- one combination ---------------------------------------------------------------------------

    def _try(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        picked: Picked,
        node_ok: Callable[[str], bool] | None,
        mixed: set[int],
    ) -> Decision:
        if not any(alt.all_devices for _, alt in picked):
            return self._try_one(claims, classes, picked, node_ok, mixed)
        wholes: dict[int, frozenset[GpuRef]] = {}
        for i, ((_, req), alt) in enumerate(picked):
            if not alt.all_devices:
                continue
            c = self._classify(req, alt)
            if isinstance(c, Decision):
                return c
            if c.kind is AltKind.NONE:
                return self._no_match(req, alt, c.mig)
            if c.kind is not AltKind.WHOLE:
                return Decision(
                    reason=ControllerReason.INVALID_REQUEST, message=allmode.refusal(req, alt, c.kind)
                )
            wholes[i] = c.whole
        if self._idle is None:
            self._idle = self.ledger.idle_gpus()
        failures = []
        for node, expanded in allmode.variants(picked, wholes, node_ok, self._idle.refs):
            decision = self._try_one(claims, classes, expanded, node.__eq__, mixed)  # this node only
            if decision.ok:
                return decision
            failures.append(decision)
        if not failures:
            return Decision(
                reason=ControllerReason.NO_MATCHING_DEVICE,
                message="allocationMode All: no node that may take the pod has every whole GPU its "
                "selectors admit free (a request for all devices cannot take fewer)",
            )
        return failures[0]

    def _try_one(
        self,
        claims: Sequence[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        picked: Picked,
        node_ok: Callable[[str], bool] | None,
        mixed: set[int],
    ) -> Decision:
        limit = result_limit([(req, alt) for (_, req), alt in picked])
        if limit is not None:
            return Decision(reason=ControllerReason.INVALID_REQUEST, message=limit)
        slots: list[Slot] = []
        mig_requests: list[DeviceRequest] = []
        share_requests: list[ShareRequest] = []
        whole_requests: list[WholeRequest] = []
        for fi, ((ci, req), alt) in enumerate(picked):
            c = self._classify(req, alt)
            if isinstance(c, Decision):
                return c
            if c.kind is AltKind.NONE:
                return self._no_match(req, alt, c.mig)
            if c.kind is AltKind.MIG:
                # The pairs the selectors admit (restricted to node_ok's nodes), in a form the policy indexes.
                filt = AllowedTable(c.mig.per_gpu, node_ok)
                for i in range(alt.count):
                    slot = Slot(ci, fi, req, alt, f"{ci}:{alt.result_name}:{i}", AltKind.MIG)
                    slots.append(slot)
                    mig_requests.append(
                        DeviceRequest(
                            slot.policy_name,
                            c.mig.min_memory_mib,
                            device_filter=filt,
                            end_hint=self._end_hint,
                        )
                    )
                continue
            if c.kind is AltKind.WHOLE:
                for i in range(alt.count):
                    slot = Slot(ci, fi, req, alt, f"{ci}:{alt.result_name}:{i}", AltKind.WHOLE)
                    slots.append(slot)
                    whole_requests.append(WholeRequest(slot.policy_name, c.whole))
                continue
            where = f"claim {req.claim} spec.devices.requests[{alt.result_name}]"
            amounts, refusal, too_large = self.amounts.amounts(alt, c.shared, where)
            if not amounts:
                reason = (
                    ControllerReason.NO_MATCHING_DEVICE if too_large else ControllerReason.INVALID_REQUEST
                )
                return Decision(reason=reason, message=refusal)
            for i in range(alt.count):
                slot = Slot(ci, fi, req, alt, f"{ci}:{alt.result_name}:{i}", AltKind.SHARED)
                slots.append(slot)
                share_requests.append(ShareRequest(slot.policy_name, amounts, group=str(ci)))
        plan = self._place(mig_requests, share_requests, whole_requests, node_ok)
        if isinstance(plan, Decision):
            if plan.reason == ShortReason.NO_SINGLE_NODE:
                nodes = set(self.ledger.cluster.nodes()) | {ref.node for ref in self._states}
                plan.message = one_node(plan.message, nodes, node_ok)
            return plan
        problem = self.check.violation(claims, slots, plan)
        if problem is None:
            return decision_of(self.ledger, self.check, claims, classes, slots, plan, mixed)
        for mig_pinned, share_pinned in self.check.pinned_variants(
            self.ledger.cluster, slots, mig_requests, share_requests, problem
        ):
            again = self._place(mig_pinned, share_pinned, whole_requests, node_ok)
            if isinstance(again, Plan) and self.check.violation(claims, slots, again) is None:
                return decision_of(self.ledger, self.check, claims, classes, slots, again, mixed)
        return Decision(reason=ControllerReason.CONSTRAINT_UNSATISFIED, message=explain(problem))

    def _place(
        self,
        mig_requests: list[DeviceRequest],
        share_requests: list[ShareRequest],
        whole_requests: list[WholeRequest],
        node_ok: Callable[[str], bool] | None,
    ) -> Plan | Decision:
        """MIG devices through the MIG policy, shares through the share policy, whole GPUs through the
        whole-GPU policy (controller/allocation/wholeplan.py), all on one node, all via the placer."""
        if whole_requests:
            if self._idle is None:
                self._idle = self.ledger.idle_gpus()
            placer = WholePlacer(self.placer, self.ledger.cluster, self._idle, self._states)
            plan = placer.place(mig_requests, share_requests, whole_requests, node_ok)
            if isinstance(plan, Unplaced):
                return Decision(reason=plan.reason, message=plan.message)
            return plan
        if not share_requests:
            placement = self.placer.mig(self.ledger.cluster, mig_requests)
            if not placement.ok:
                return Decision(reason=str(placement.reason), message=placement.message)
            return Plan(placement.choices, ())
        if not mig_requests:
            shares = self.placer.shares(self._states, share_requests, node_ok)
            if not shares.ok:
                return Decision(reason=str(shares.reason), message=shares.message)
            return Plan((), shares.choices)
        # Both kinds: only nodes where every share fits may take the MIG devices; then the shares go
        # to the node the MIG policy chose.
        candidates = set.intersection(*({ref.node for ref in r.amounts} for r in share_requests))
        nodes = self.placer.share_nodes(
            self._states, share_requests, (n for n in candidates if node_ok is None or node_ok(n))
        )
        if not nodes:
            why = self.placer.explain_shares(self._states, share_requests, node_ok)
            return Decision(reason=str(why.reason), message=why.message)
        restricted = [self.check.restrict(r, nodes) for r in mig_requests]
        placement = self.placer.mig(self.ledger.cluster, restricted)
        if not placement.ok:
            alone = self.placer.mig(self.ledger.cluster, mig_requests)
            if alone.ok:  # each kind fits, on different nodes
                return Decision(
                    reason=ShortReason.NO_SINGLE_NODE,
                    message=f"the MIG devices fit (e.g. on {alone.node}) and the shares fit on "
                    f"{', '.join(sorted(nodes)[:3])}, but no single node takes both",
                )
            return Decision(reason=str(placement.reason), message=placement.message)
        assert placement.node is not None
        hit = self.placer.shares_on(self._states, share_requests, placement.node)
        if hit is None:  # cannot happen: the node was feasible for the shares
            return Decision(reason=ShortReason.NO_SINGLE_NODE, message="shares no longer fit the chosen node")
        return Plan(placement.choices, hit[1])

    def _no_match(self, req: ClaimRequest, alt: Alternative, cands: Candidates) -> Decision:
        message = no_match_message(self.ledger.inventory, req, alt, cands.errors)
        return Decision(reason=ControllerReason.NO_MATCHING_DEVICE, message=message)


__all__ = [
    "ClaimAllocation",
    "ControllerReason",
    "Decider",
    "Decision",
    "node_selector",
    "short_reason_values",
]
