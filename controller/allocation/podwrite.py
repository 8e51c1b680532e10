"""The writes of one placed pod: claims (finalizer, then allocation), then the pod (gate removed).

Part of controller/allocation/allocate.py's `PodAllocation`, split out because these run on a write
worker (controller/allocation/writepool.py) while the controller thread decides the next pods. So
nothing here changes the controller's state directly: every change to the ledger, the caches, the
uncertain writes, the pending and dirty sets is appended to `fx` as an effect, applied later on the
controller thread in the order it was recorded. Only the API is called here (the writer is safe to
share between threads; its `drain` counts the writes of every thread).

Within one pod the order is that of before: each claim's finalizer before its allocation, every claim
before the pod's gate. A refusal (409, 404, 4xx) undoes what was written, and a 409 also re-reads the
claim and stops the step (`StaleCache`): it proves the cache older than the server. An unknown outcome
undoes nothing: the claim is held as possibly allocated (controller/allocation/uncertain.py) and the
pod waits until that is settled; its claims already written stay allocated for it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from api.constants import ANNOTATION_MIG_ALLOCATIONS
from controller.allocation.decide import ClaimAllocation, Decision, node_selector
from controller.allocation.nodeselector import pinned_nodes
from controller.allocation.preempt import Preemption
from controller.allocation.uncertain import UncertainClaims
from controller.allocation.writepool import Effect, PodWrites, WritePool
from controller.claims.podclaims import mirror_annotation
from controller.kube.outcome import Outcome, write_outcome
from controller.kube.store import object_key, resource_version
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer, is_conflict, is_not_found
from controller.runtime.metrics import ControllerMetrics
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger, claim_holdings
from driver.policy.placer import PodSize

log = structlog.get_logger(__name__)

Obj = dict[str, Any]

# How long a pod's gate waits for the claim watch to deliver its allocations (controller/kube/echo.py):
# on a healthy API server milliseconds; past this the gate goes anyway and kube-scheduler may race.
GATE_ECHO_TIMEOUT_S = 2.0


@dataclass(slots=True)
class Pending:
    first_seen: float
    reason: str = ""
    message: str = ""
    size: PodSize | None = None  # what the pod asks for (controller/allocation/podsize.py), once known


class StaleCache(Exception):
    """A write to one of our claims met 409: the cache is older than the server. The claim was read
    again; the step stops, and the pod is decided again from the new state."""


class PodWriting:
    cache: WatchCache
    writer: Writer | None
    metrics: ControllerMetrics
    ledger: Ledger
    dirty: set[str]
    pending: dict[str, Pending]
    uncertain: UncertainClaims
    preemption: Preemption
    writes: WritePool
    _applied: Callable[[PodWrites], bool]  # the Controller's: one result, applied under its guard

    # --- on the controller thread -------------------------------------------------------------------

    def _assume(self, decision: Decision) -> None:
        """The decision's devices, taken in the ledger before the next pod is decided."""
        for alloc in decision.allocations:
            # Versions up to the one decided on are stale for this assumption, whatever they show.
            decided_on = resource_version(alloc.claim)
            self.ledger.assume(alloc.uid, alloc.keys, None if decided_on is None else decided_on + 1)

    def _submit_writes(
        self, key: str, pod: Obj, pending: Pending, claims: dict[str, Obj], decision: Decision | None
    ) -> None:
        """Write the pod now (one worker), or hand it to a worker of the pool."""
        job = partial(self._write_pod, key, pod, pending, claims, decision, self.ledger.inventory)
        if not self.writes.parallel:
            self._apply_writes(job())
            return
        self.writes.submit(job, (object_key(c) for c in claims.values()))

    def _apply_writes(self, result: PodWrites) -> None:
        for effect in result.effects:
            effect()
        if result.error is not None:
            raise result.error

    # --- on a write worker (or inline) --------------------------------------------------------------

    def _write_pod(
        self,
        key: str,
        pod: Obj,
        pending: Pending,
        claims: dict[str, Obj],
        decision: Decision | None,
        inventory: Inventory,
    ) -> PodWrites:
        """The pod's whole sequence; whatever it raises is returned, to be raised on the controller
        thread after the effects recorded before it."""
        out = PodWrites(key)
        try:
            if decision is not None:
                written = self._write_claims(pod, decision, out.effects)
                if written is None:
                    out.effects.append(partial(self.dirty.add, key))  # decide again from fresh state
                    return out
                claims = {e: written.get(str(c["metadata"]["uid"]), c) for e, c in claims.items()}
                self._await_echo(written.values())
            self._release(pod, pending, claims, inventory, out.effects)
        except BaseException as exc:  # re-raised where it was raised before: the controller's guard
            out.error = exc
        return out

    def _write_claims(self, pod: Obj, decision: Decision, fx: list[Effect]) -> dict[str, Obj] | None:
        """Write every claim of the decision; the claims as written, or None when the pod must wait."""
        assert self.writer is not None and decision.node is not None
        done: list[Obj] = []
        pending = list(decision.allocations)
        while pending:
            alloc = pending[0]
            try:
                claim = self.writer.protect_claim(alloc.claim, pod["metadata"]["uid"])
            except BaseException as exc:
                # No allocation was sent for this claim, whatever became of the finalizer.
                self._write_failed(pod, exc, done, pending, alloc.claim, fx)
                return None
            protected_rv = resource_version(claim)
            # Only a version newer than our finalizer write can show whether the allocation landed.
            fx.append(
                partial(self._protected, claim, alloc, None if protected_rv is None else protected_rv + 1)
            )
            try:
                claim = self.writer.write_allocation(
                    claim, self._allocation(alloc, decision.node), reserve_for=pod
                )
            except BaseException as exc:
                if write_outcome(exc) is Outcome.UNKNOWN:
                    fx.append(partial(self.uncertain.add, claim, "allocation"))
                    self._settle_written(done, fx)
                    raise
                self._unprotect([claim], fx)
                self._write_failed(pod, exc, done, pending, claim, fx)
                return None
            pending.pop(0)
            done.append(claim)
        self._settle_written(done, fx)
        return {claim["metadata"]["uid"]: claim for claim in done}

    def _await_echo(self, written: Iterable[Obj]) -> None:
        """Wait (bounded) until the claim watch has delivered these writes, so that kube-scheduler,
        watching the same API server, usually sees the allocation before the pod without its gate."""
        # Only reflectors feed the echo; a cache fed by hand (unit tests) has nothing to wait for.
        echo = self.cache.claim_echo if self.cache.started else None
        versions = {object_key(c): v for c in written if (v := resource_version(c)) is not None}
        if echo is None or not versions:
            return
        started = time.monotonic()
        seen = echo.wait(versions, GATE_ECHO_TIMEOUT_S)
        self.metrics.gate_echo_wait.labels(outcome="seen" if seen else "timeout").observe(
            time.monotonic() - started
        )
        if not seen:
            log.info(
                "claim watch did not deliver our allocation in time; releasing anyway",
                claims=sorted(versions),
            )

    def _protected(self, claim: Obj, alloc: ClaimAllocation, settles_at: int | None) -> None:
        self.cache.stores["resourceclaims"].assume(claim)
        self.ledger.written(alloc.uid, alloc.keys, settles_at)

    def _settle_written(self, done: list[Obj], fx: list[Effect]) -> None:
        """Our allocations that landed: in the cache now, and held until the watch shows them."""
        for claim in done:
            fx.append(partial(self._settled_claim, claim))

    def _settled_claim(self, claim: Obj) -> None:
        # Our newest version, assumed: the watch's older ones (the finalizer-only write) are stale.
        self.cache.stores["resourceclaims"].assume(claim)
        self.ledger.written(claim["metadata"]["uid"], claim_holdings(claim), resource_version(claim))

    def _write_failed(
        self,
        pod: Obj,
        exc: BaseException,
        done: list[Obj],
        pending: list[ClaimAllocation],
        failed: Mapping[str, Any],
        fx: list[Effect],
    ) -> None:
        """The write of `failed` was refused (or never sent): undo the pod's other claims, then re-read
        on a conflict, or re-raise what is not a conflict."""
        for alloc in pending:  # never written: nothing on the server holds these devices
            fx.append(partial(self._drop_assumption, alloc.uid, alloc.claim))
        self._rollback(done, fx)
        if write_outcome(exc) is Outcome.UNKNOWN:  # the finalizer write: no allocation was sent
            raise exc
        if not isinstance(exc, ApiException) or not (is_conflict(exc) or is_not_found(exc)):
            raise exc
        self.metrics.conflicts.inc()
        log.info("claim changed while allocating", pod=object_key(pod), status=exc.status)
        if is_conflict(exc):
            self._reread(failed, fx)
            raise StaleCache(f"claim {object_key(failed)} changed on the server since the cache saw it")

    def _drop_assumption(self, uid: str, claim: Mapping[str, Any]) -> None:
        """Back to what the API last showed of a claim whose allocation was never sent."""
        self.ledger.forget(uid)
        current = self.cache["resourceclaims"].get(object_key(claim))
        if current is not None:
            self.ledger.observe(uid, claim_holdings(current), resource_version(current))

    def _reread(self, claim: Mapping[str, Any], fx: list[Effect]) -> None:
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
        fx.append(partial(self._observed, str(meta["uid"]), current))

    def _observed(self, uid: str, current: Obj) -> None:
        self.cache.stores["resourceclaims"].assume(current)
        self.ledger.observe(uid, claim_holdings(current), resource_version(current))

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

    def _rollback(self, done: list[Obj], fx: list[Effect]) -> None:
        """Clear the allocations of `done` (written and confirmed). Only what the server confirms as
        cleared is free: a refused clear leaves the claim allocated for the pod (its retry uses it),
        an unknown one is held until settled."""
        assert self.writer is not None
        for claim in done:
            try:
                cleared = self.writer.write_allocation(claim, None)
            except Exception as exc:
                if write_outcome(exc) is Outcome.UNKNOWN:
                    fx.append(partial(self.uncertain.add, claim, "deallocation"))
                log.warning("rollback failed; the claim stays held", claim=object_key(claim), error=str(exc))
                continue
            # Confirmed by the server; the watch's older versions (still allocated) must not count.
            fx.append(partial(self._settled_claim, cleared))
            self._unprotect([cleared], fx)

    def _unprotect(self, claims: Iterable[Obj], fx: list[Effect]) -> None:
        """Drop our finalizer from claims that hold nothing of ours (best effort: the deallocation pass
        drops any that is left)."""
        assert self.writer is not None
        for claim in claims:
            try:
                unprotected = self.writer.unprotect_claim(claim)
            except Exception as exc:
                log.warning("finalizer not removed", claim=object_key(claim), error=str(exc))
                continue
            if unprotected is not None:
                fx.append(partial(self.cache.stores["resourceclaims"].assume, unprotected))

    def _release(
        self, pod: Obj, pending: Pending, claims: dict[str, Obj], inventory: Inventory, fx: list[Effect]
    ) -> None:
        assert self.writer is not None
        annotations: dict[str, str] = {}
        mirror = mirror_annotation(pod, claims, inventory)
        if mirror is not None:
            annotations[ANNOTATION_MIG_ALLOCATIONS] = mirror
        try:
            released = self.writer.release_pod(pod, annotations)
        except ApiException as exc:
            if is_conflict(exc):
                self.metrics.conflicts.inc()
                fx.append(
                    partial(self.dirty.add, object_key(pod))
                )  # claims stay allocated; the retry only releases
                return
            raise
        fx.append(partial(self._released, object_key(pod), released, time.monotonic() - pending.first_seen))
        pins = pinned_nodes(claims.values())
        where = pins.description if pins is not None else "on any node"
        log.info("pod released", pod=object_key(pod), where=where, claims=sorted(claims))
        if pending.reason:
            self.writer.set_condition(released, "True", "Allocated", f"allocated {where}")

    def _released(self, key: str, released: Obj, waited_s: float) -> None:
        self.cache.stores["pods"].assume(released)
        self.pending.pop(key, None)
        self.preemption.placed(self.ledger, key)
        self.metrics.allocation_latency.observe(waited_s)


__all__ = ["Pending", "PodWriting", "StaleCache"]
