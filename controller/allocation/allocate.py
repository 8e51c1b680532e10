"""Placing one gated pod (the allocation job of controller/allocation/loop.py's `Controller`).

Resolve the pod's claims (template-generated ones through pod.status.resourceClaimStatuses), decide
all unallocated claims at once (`Decider`), assume the devices in the ledger so that the next pod cannot
get them, then write each claim (finalizer + pod annotation, then status.allocation, both with the
resourceVersion the decision was based on), then the pod (mirror annotation, gate removed). A conflict
on any claim rolls back the claims already written and retries the pod from fresh state: nothing is
ever allocated twice, and a pod gets all of its claims or none. The writes are controller/allocation/
podwrite.py's, run on a worker of controller/allocation/writepool.py while the next pods are decided.

`PodAllocation` is a mixin of `Controller`: it reads and updates the controller's state (declared
below for the type checker) and is not used on its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from api.constants import ANNOTATION_EXPECTED_DURATION
from controller.allocation.decide import ControllerReason, Decider
from controller.allocation.lifetime import ClaimEnds, decision_hint
from controller.allocation.nodefilter import NodeFilter, PodRules
from controller.allocation.nodeselector import pinned_nodes
from controller.allocation.podsize import pod_size
from controller.allocation.podwrite import Pending, PodWriting, StaleCache
from controller.allocation.preempt import Preemption
from controller.allocation.uncertain import UncertainClaims
from controller.allocation.upstream import shim_generated
from controller.allocation.writepool import WritesStopped
from controller.claims.candidates import CandidateIndex
from controller.claims.podclaims import (
    ClaimsPending,
    allocation_results,
    claim_names,
    is_gated,
    split_share_problem,
)
from controller.kube.store import object_key
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer
from controller.runtime.metrics import ControllerMetrics
from controller.state.ledger import Held, Ledger, claim_holdings
from driver.policy.model import EndHint
from driver.policy.placer import Placer, PodSize

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


def allocated_devices(claim: Mapping[str, Any] | None) -> list[Held]:
    """What a claim's allocation holds of our driver: devices, and shares with their consumed capacity."""
    return claim_holdings(claim)


class PodAllocation(PodWriting):
    cache: WatchCache
    writer: Writer | None
    placer: Placer
    metrics: ControllerMetrics
    ledger: Ledger
    index: CandidateIndex
    pending: dict[str, Pending]
    dirty: set[str]
    hint_warned: dict[str, str]  # pod uid -> the bad expected-duration value already reported
    claim_ends: ClaimEnds  # expected ends of hinted pods, by claim (controller/allocation/lifetime.py)
    uncertain: UncertainClaims  # claim writes whose outcome is unknown (controller/allocation/uncertain.py)
    preemption: Preemption  # evictions for pods of higher priority (controller/allocation/preempt.py)

    def _pod_size(self, key: str) -> PodSize | None:
        """A pending pod's size for the batch order, read once and kept on its `Pending` record (the
        loop forgets it when the inventory or the device classes change); None while not readable."""
        pending = self.pending.get(key)
        pod = self.cache["pods"].get(key)
        if pending is None or pod is None:
            return None
        if pending.size is None:
            try:
                pending.size = pod_size(
                    pod, self.cache["resourceclaims"], self.cache["deviceclasses"], self.index
                )
            except Exception:  # claims not there yet, or a malformed object: `_process_pod` reports it
                return None
        return pending.size

    def _node_filter(self, pod: Obj, allocated: list[Obj]) -> NodeFilter:
        """Nodes kube-scheduler would bind the pod to (controller/allocation/nodefilter.py), on the node that the
        pod's claims allocated elsewhere fix, if any."""
        rules = PodRules.from_pod(pod)
        if rules.problems:
            log.warning(
                "pod placement rules not understood", pod=object_key(pod), problems=list(rules.problems)
            )
        return NodeFilter(rules, self.cache["nodes"], pinned_nodes(allocated))

    def _process_pod(self, key: str) -> None:
        pod = self.cache["pods"].get(key)
        if pod is None or not is_gated(pod):
            self.pending.pop(key, None)
            return
        pending = self.pending.setdefault(key, Pending(time.monotonic()))
        ns = pod["metadata"]["namespace"]
        try:
            names = claim_names(pod)
            # A claim two pods share: decided on the cache its writes for the other pod leave.
            self._await_writes({f"{ns}/{name}" for name in names.values()})
            claims = {entry: self.cache["resourceclaims"][f"{ns}/{name}"] for entry, name in names.items()}
        except (ClaimsPending, KeyError) as exc:
            self._unplaced(pod, pending, "WaitingForClaims", f"waiting for the pod's claims: {exc}")
            return
        unsure = sorted(
            c["metadata"]["name"]
            for c in claims.values()
            if str(c["metadata"].get("uid")) in self.uncertain.entries
        )
        if unsure:
            # Possibly allocated: deciding it again could give the pod a second set of devices.
            message = (
                f"the answer to the write of claim {', '.join(unsure)} was lost; waiting for a read or the "
                "watch to show whether it landed before deciding again"
            )
            self._unplaced(pod, pending, ControllerReason.WRITE_OUTCOME_UNKNOWN.value, message)
            return
        todo = [c for c in claims.values() if not (c.get("status") or {}).get("allocation")]
        if todo:
            allocated = [c for c in claims.values() if c not in todo]
            started = time.perf_counter()
            node_ok = self._node_filter(pod, allocated)
            hint = self._end_hint(pod)
            self.preemption.before_decide(self.ledger, key)  # what a preemption freed for it is its own
            # A moved pod's replacement: only its reserved destination (controller/allocation/moves.py).
            decide_ok = self.preemption.moves.before_decide(self.ledger, pod, node_ok)
            decision = Decider(self.ledger, self.index, self.placer).decide(
                todo,
                self.cache["deviceclasses"],
                node_ok=decide_ok,
                end_hint=hint,
                shim_uids=shim_generated(pod, claims),
            )
            self.metrics.decision_latency.observe(time.perf_counter() - started)
            if not decision.ok:
                self.preemption.not_placed(self.ledger, key)
                excluded = node_ok.summary()  # says why nodes with room did not count, if any
                parts = [decision.message] + ([f"excluded for this pod: {excluded}"] if excluded else [])
                message = "; ".join(p for p in parts if p)
                if self.preemption.will_search(pod, decision):
                    self._await_writes(None)  # victims are chosen on what every write in flight left
                preempting = self.preemption.preempt(self, pod, todo, node_ok, hint, decision)
                if preempting is not None:  # controller/allocation/preempt.py wrote the Events
                    self._unplaced(pod, pending, "Preempting", f"{message}; {preempting}", warn=False)
                    return
                self._unplaced(pod, pending, str(decision.reason), message)
                return
            results: dict[str, Iterable[Mapping[str, Any]]] = {
                e: allocation_results(c) for e, c in claims.items()
            }
            by_uid = {a.uid: a.results for a in decision.allocations}
            results.update(
                {e: by_uid[c["metadata"]["uid"]] for e, c in claims.items() if c["metadata"]["uid"] in by_uid}
            )
            problem = split_share_problem(pod, results)
            if problem:
                self._unplaced(pod, pending, ControllerReason.INVALID_REQUEST.value, problem)
                return
            # Kept by claim too: our own claim writes come back through the watch before the pod's
            # release does, and the pod starts (status.startTime) later still. No hint (any more):
            # whatever an earlier decision of this pod recorded goes.
            keys = {object_key(alloc.claim) for alloc in decision.allocations}
            self.claim_ends.set(str(pod["metadata"].get("uid", "")), keys, None if hint is None else hint.end)
            for alloc in decision.allocations:
                self.ledger.expect_end(alloc.uid, self.claim_ends.end(object_key(alloc.claim)))
            self._assume(decision)  # taken before the next pod is decided, whatever its writes become
        self._submit_writes(key, pod, pending, claims, decision if todo else None)

    def _await_writes(self, claim_keys: set[str] | None) -> None:
        """Wait for the writes in flight (of these claims; None: all) and apply them first."""
        if not self.writes.parallel or (claim_keys is not None and not self.writes.busy(claim_keys)):
            return
        if not self.writes.drain(self._applied):
            raise WritesStopped("a write result ended the step before this pod was decided")

    def _end_hint(self, pod: Obj) -> EndHint | None:
        """The pod's lifetime hint (controller/allocation/lifetime.py); a bad annotation is reported
        once per value (log, and a Warning event when leading) and the pod is placed unhinted."""
        hint, problem = decision_hint(pod, time.time())
        if problem is not None:
            uid = str(pod["metadata"].get("uid", ""))
            value = str((pod["metadata"].get("annotations") or {}).get(ANNOTATION_EXPECTED_DURATION))
            if self.hint_warned.get(uid) != value:
                self.hint_warned[uid] = value
                log.warning("lifetime hint ignored", pod=object_key(pod), problem=problem)
                if self.writer is not None:
                    try:
                        self.writer.event(
                            pod, "Pod", "Warning", "InvalidLifetimeHint", f"{problem}; placed without it"
                        )
                    except Exception as exc:  # only a warning: never what keeps the pod from running
                        log.warning("lifetime hint event not written", pod=object_key(pod), error=str(exc))
        return hint

    def _unplaced(self, pod: Obj, pending: Pending, reason: str, message: str, *, warn: bool = True) -> None:
        if (pending.reason, pending.message) == (reason, message):
            return  # already surfaced; retried when capacity changes
        log.info("pod not placed", pod=object_key(pod), reason=reason, message=message)
        if reason == "WaitingForClaims" or self.writer is None:
            pending.reason, pending.message = reason, message
            return
        self.writer.set_condition(pod, "False", reason, message)
        # Recorded only once the condition is written: a failed write is retried on the next resync
        # instead of leaving the pod gated with no stated reason.
        pending.reason, pending.message = reason, message
        if warn:  # a preemption under way has its own Normal event (Preempting)
            self.writer.event(pod, "Pod", "Warning", "FailedAllocation", f"{reason}: {message}")


__all__ = ["Pending", "PodAllocation", "StaleCache", "allocated_devices"]
