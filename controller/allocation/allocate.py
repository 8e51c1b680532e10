"""Placing one gated pod (the allocation job of controller/allocation/loop.py's `Controller`).

Resolve the pod's claims (template-generated ones through pod.status.resourceClaimStatuses), decide
all unallocated claims at once (`Decider`), assume the devices in the ledger so that the next pod cannot
get them, then write each claim (finalizer + pod annotation, then status.allocation, both with the
resourceVersion the decision was based on), then the pod (mirror annotation, gate removed). A conflict
on any claim rolls back the claims already written and retries the pod from fresh state: nothing is
ever allocated twice, and a pod gets all of its claims or none.

`PodAllocation` is a mixin of `Controller`: it reads and updates the controller's state (declared
below for the type checker) and is not used on its own.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from api.constants import ANNOTATION_EXPECTED_DURATION, ANNOTATION_MIG_ALLOCATIONS
from controller.allocation.decide import ClaimAllocation, ControllerReason, Decider, Decision, node_selector
from controller.allocation.lifetime import ClaimEnds, decision_hint
from controller.allocation.nodefilter import NodeFilter, PodRules
from controller.allocation.nodeselector import pinned_nodes
from controller.allocation.podsize import pod_size
from controller.allocation.preempt import Preemption
from controller.allocation.uncertain import UncertainClaims
from controller.allocation.upstream import shim_generated
from controller.claims.candidates import CandidateIndex
from controller.claims.podclaims import (
    ClaimsPending,
    allocation_results,
    claim_names,
    is_gated,
    mirror_annotation,
    split_share_problem,
)
from controller.kube.outcome import Outcome, write_outcome
from controller.kube.store import object_key, resource_version
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer, is_conflict, is_not_found
from controller.runtime.metrics import ControllerMetrics
from controller.state.ledger import Held, Ledger, claim_holdings
from driver.policy.model import EndHint
from driver.policy.placer import Placer, PodSize

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


def allocated_devices(claim: Mapping[str, Any] | None) -> list[Held]:
    """What a claim's allocation holds of our driver: devices, and shares with their consumed capacity."""
    return claim_holdings(claim)


class StaleCache(Exception):
    """A write to one of our claims met 409: the cache is older than the server. The claim was read
    again; the step stops, and the pod is decided again from the new state."""


@dataclass(slots=True)
class Pending:
    first_seen: float
    reason: str = ""
    message: str = ""
    size: PodSize | None = None  # what the pod asks for (controller/allocation/podsize.py), once known


class PodAllocation:
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
            written = self._write_claims(pod, decision)
            if written is None:
                self.dirty.add(key)  # conflict: decide again from the fresh state
                return
            claims.update(
                {
                    e: written[c["metadata"]["uid"]]
                    for e, c in claims.items()
                    if c["metadata"]["uid"] in written
                }
            )
        self._release(pod, pending, claims)

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

    def _write_claims(self, pod: Obj, decision: Decision) -> dict[str, Obj] | None:
        """Write every claim of the decision; the claims as written, or None when the pod must wait.

        A refusal (409, 404, 4xx) undoes what was written, and a 409 also re-reads the claim and stops
        the step (`StaleCache`): it proves the cache older than the server. An unknown outcome undoes
        nothing: the claim is held as possibly allocated (controller/allocation/uncertain.py) and the
        pod waits until that is settled; its claims already written stay allocated for it.
        """
        assert self.writer is not None and decision.node is not None
        for alloc in decision.allocations:
            # Versions up to the one decided on are stale for this assumption, whatever they show.
            decided_on = resource_version(alloc.claim)
            self.ledger.assume(alloc.uid, alloc.keys, None if decided_on is None else decided_on + 1)
        done: list[Obj] = []
        pending = list(decision.allocations)
        while pending:
            alloc = pending[0]
            try:
                claim = self.writer.protect_claim(alloc.claim, pod["metadata"]["uid"])
            except BaseException as exc:
                # No allocation was sent for this claim, whatever became of the finalizer.
                self._write_failed(pod, exc, done, pending, alloc.claim)
                return None
            self.cache.stores["resourceclaims"].assume(claim)
            protected_rv = resource_version(claim)
            # Only a version newer than our finalizer write can show whether the allocation landed.
            self.ledger.written(alloc.uid, alloc.keys, None if protected_rv is None else protected_rv + 1)
            try:
                claim = self.writer.write_allocation(claim, self._allocation(alloc, decision.node))
            except BaseException as exc:
                if write_outcome(exc) is Outcome.UNKNOWN:
                    self.uncertain.add(claim, "allocation")
                    self._settle_written(done)
                    raise
                self._unprotect([claim])
                self._write_failed(pod, exc, done, pending, claim)
                return None
            pending.pop(0)
            done.append(claim)
        self._settle_written(done)
        return {claim["metadata"]["uid"]: claim for claim in done}

    def _settle_written(self, done: list[Obj]) -> None:
        """Our allocations that landed: in the cache now, and held until the watch shows them."""
        for claim in done:
            # Our newest version, assumed: the watch's older ones (the finalizer-only write) are stale.
            self.cache.stores["resourceclaims"].assume(claim)
            self.ledger.written(claim["metadata"]["uid"], allocated_devices(claim), resource_version(claim))

    def _write_failed(
        self,
        pod: Obj,
        exc: BaseException,
        done: list[Obj],
        pending: list[ClaimAllocation],
        failed: Mapping[str, Any],
    ) -> None:
        """The write of `failed` was refused (or never sent): undo the pod's other claims, then re-read
        on a conflict, or re-raise what is not a conflict."""
        for alloc in pending:  # never written: nothing on the server holds these devices
            self._drop_assumption(alloc.uid, alloc.claim)
        self._rollback(done)
        if write_outcome(exc) is Outcome.UNKNOWN:  # the finalizer write: no allocation was sent
            raise exc
        if not isinstance(exc, ApiException) or not (is_conflict(exc) or is_not_found(exc)):
            raise exc
        self.metrics.conflicts.inc()
        log.info("claim changed while allocating", pod=object_key(pod), status=exc.status)
        if is_conflict(exc):
            self._reread(failed)
            raise StaleCache(f"claim {object_key(failed)} changed on the server since the cache saw it")

    def _drop_assumption(self, uid: str, claim: Mapping[str, Any]) -> None:
        """Back to what the API last showed of a claim whose allocation was never sent."""
        self.ledger.forget(uid)
        current = self.cache["resourceclaims"].get(object_key(claim))
        if current is not None:
            self.ledger.observe(uid, allocated_devices(current), resource_version(current))

    def _reread(self, claim: Mapping[str, Any]) -> None:
        """A fresh read of a claim the cache is stale on (a read may be retried; it changes nothing)."""
        assert self.writer is not None
        meta = claim["metadata"]
        try:
            current = self.writer.read_claim(meta["namespace"], meta["name"])
        except Exception as exc:  # the watch brings it; the pod waits for the next step
            log.info("re-read after conflict failed", claim=object_key(claim), error=str(exc))
            return
        if current["metadata"].get("uid") != meta.get("uid"):
            return
        self.cache.stores["resourceclaims"].assume(current)
        self.ledger.observe(str(meta["uid"]), allocated_devices(current), resource_version(current))

    @staticmethod
    def _allocation(alloc: ClaimAllocation, node: str) -> dict[str, Any]:
        devices: dict[str, Any] = {"results": alloc.results}
        if alloc.config:
            devices["config"] = alloc.config
        # allocationTimestamp must be set by the allocator: kube-scheduler (with DRADeviceBindingConditions,
        # beta in 1.36+) fills it in when missing, which the API rejects as a change to an allocation.
        return {
            "devices": devices,
            "nodeSelector": node_selector(node),
            "allocationTimestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def _rollback(self, done: list[Obj]) -> None:
        """Clear the allocations of `done` (written and confirmed). Only what the server confirms as
        cleared is free: a refused clear leaves the claim allocated for the pod (its retry uses it),
        an unknown one is held until settled."""
        assert self.writer is not None
        store = self.cache.stores["resourceclaims"]
        for claim in done:
            uid = str(claim["metadata"]["uid"])
            try:
                cleared = self.writer.write_allocation(claim, None)
            except Exception as exc:
                if write_outcome(exc) is Outcome.UNKNOWN:
                    self.uncertain.add(claim, "deallocation")
                log.warning("rollback failed; the claim stays held", claim=object_key(claim), error=str(exc))
                continue
            store.assume(cleared)
            # Confirmed by the server; the watch's older versions (still allocated) must not count.
            self.ledger.written(uid, allocated_devices(cleared), resource_version(cleared))
            self._unprotect([cleared])

    def _unprotect(self, claims: Iterable[Obj]) -> None:
        """Drop our finalizer from claims that hold nothing of ours (best effort: the deallocation pass
        drops any that is left)."""
        assert self.writer is not None
        for claim in claims:
            try:
                self._assume_claim(self.writer.unprotect_claim(claim))
            except Exception as exc:
                log.warning("finalizer not removed", claim=object_key(claim), error=str(exc))

    def _assume_claim(self, claim: Obj | None) -> None:
        if claim is not None:
            self.cache.stores["resourceclaims"].assume(claim)

    def _release(self, pod: Obj, pending: Pending, claims: dict[str, Obj]) -> None:
        assert self.writer is not None
        annotations: dict[str, str] = {}
        mirror = mirror_annotation(pod, claims, self.ledger.inventory)
        if mirror is not None:
            annotations[ANNOTATION_MIG_ALLOCATIONS] = mirror
        try:
            released = self.writer.release_pod(pod, annotations)
        except ApiException as exc:
            if is_conflict(exc):
                self.metrics.conflicts.inc()
                self.dirty.add(object_key(pod))  # claims stay allocated; the retry only releases
                return
            raise
        self.cache.stores["pods"].assume(released)
        self.pending.pop(object_key(pod), None)
        self.preemption.placed(self.ledger, object_key(pod))
        self.metrics.allocation_latency.observe(time.monotonic() - pending.first_seen)
        pins = pinned_nodes(claims.values())
        where = pins.description if pins is not None else "on any node"
        log.info("pod released", pod=object_key(pod), where=where, claims=sorted(claims))
        if pending.reason:
            self.writer.set_condition(released, "True", "Allocated", f"allocated {where}")

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
