"""How the allocation loop takes in what the watch brings (a mixin of controller/allocation/loop.py's
`Controller`): each event applied to its versioned store, then what it changes for the allocation --
the ledger (claims), the pods waiting and the claims to check (pods), the inventory (slices and taint
rules, rebuilt once per batch), the candidate index (device classes), node filters (nodes). A change
that frees capacity or may unblock a pod marks the pending pods dirty for the next step. One object
that cannot be processed is skipped with a metric and an Event (controller/allocation/skips.py); it
never stops the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from controller.allocation.allocate import Pending, allocated_devices
from controller.allocation.deallocate import has_finalizer
from controller.allocation.lifetime import ClaimEnds, running_end
from controller.allocation.nodefilter import schedulable_view
from controller.allocation.skips import SkipReporter
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.claims.podclaims import LiveRefs, is_gated, is_terminal, referenced_claims
from controller.kube.store import Event, resource_version
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer
from controller.runtime.metrics import ControllerMetrics
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from controller.state.taintrules import with_taint_rules

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


class EventIntake:
    cache: WatchCache
    writer: Writer | None
    metrics: ControllerMetrics
    is_leader: Callable[[], bool]
    ledger: Ledger
    index: CandidateIndex
    cel: CelEnvironment
    pending: dict[str, Pending]
    dirty: set[str]
    claims_to_check: set[str]
    pods_by_uid: dict[str, Obj]
    live_refs: LiveRefs
    claim_ends: ClaimEnds
    hint_warned: dict[str, str]
    skips: SkipReporter
    _slices_dirty: bool

    def apply(self, events: list[Event]) -> None:
        capacity_changed = False
        for event in events:
            store = self.cache.stores[event.resource]
            stale_before = store.stale_ignored
            try:
                changes = store.apply(event)
            except Exception as exc:  # a malformed event (no metadata, not an object): nothing to apply
                self._skip(event.resource, "", event.obj, exc)
                continue
            self.metrics.stale_events.inc(store.stale_ignored - stale_before)
            for key, old, new in changes:
                try:
                    capacity_changed |= self._on_change(event.resource, key, old, new)
                except Exception as exc:
                    self._skip(event.resource, key, new if new is not None else old, exc)
        if self._slices_dirty and self.cache.stores["resourceslices"].synced:
            try:
                self._rebuild()
            except Exception as exc:  # the old inventory stays; the next slice change tries again
                self._slices_dirty = False
                self._skip("resourceslices", "", None, exc)
            capacity_changed = True
        if capacity_changed:
            self.dirty |= set(self.pending)

    def _skip(self, resource: str, key: str, obj: Obj | None, exc: Exception) -> None:
        self.skips.skip(resource, key, obj, exc, self.writer, leading=self._leading())

    def _leading(self) -> bool:
        try:
            return self.is_leader()
        except Exception:  # an elector that cannot tell is not leading
            return False

    def _on_change(self, resource: str, key: str, old: Obj | None, new: Obj | None) -> bool:
        if resource in ("resourceslices", "devicetaintrules"):  # a rule's taints are on the devices
            self._slices_dirty = True
            return False
        if resource == "deviceclasses":
            self._reindex()
            return True
        if resource == "nodes":
            # Heartbeats change node status every few seconds; only what the node filter reads matters.
            return schedulable_view(old) != schedulable_view(new)
        if resource == "resourceclaims":
            obj = new or old
            assert obj is not None
            uid = obj["metadata"]["uid"]
            before = len(self.ledger.owners)
            if new is None:
                self.ledger.forget(uid)
                self.ledger.expect_end(uid, None)
            else:
                # Only a known end is given: no entry means no pod seen yet (the ledger may already
                # hold the end of our own decision, whose write this may be), not "no hint".
                end = self.claim_ends.end(key)
                if end is not None:
                    self.ledger.expect_end(uid, end)
                self.ledger.observe(uid, allocated_devices(new), resource_version(new))
            if has_finalizer(obj):
                self.claims_to_check.add(key)
            # A new claim may be what a pending pod waited for.
            self.dirty |= {k for k, p in self.pending.items() if p.reason == "WaitingForClaims"}
            return len(self.ledger.owners) < before
        if resource == "pods":
            obj = new or old
            assert obj is not None
            uid = obj["metadata"].get("uid", "")
            if new is None or is_terminal(new):
                self.pods_by_uid.pop(uid, None)
                self.live_refs.drop(uid)
                self.pending.pop(key, None)
                self.hint_warned.pop(uid, None)
                self.claims_to_check |= referenced_claims(obj)
                self._hint_claims(uid, referenced_claims(obj), None)
                return False
            refs = referenced_claims(new)  # first: a pod it cannot read is skipped before it counts
            self.pods_by_uid[uid] = new
            self.live_refs.set(uid, refs)
            if not is_gated(new):  # a gated pod's hint is given when it is decided (allocate.py)
                known = self.claim_ends.of_pod(uid, refs)  # its decision's, until it starts
                self._hint_claims(uid, refs, running_end(new, time.time(), known))
            if is_gated(new):
                self.dirty.add(key)
                self.pending.setdefault(key, Pending(time.monotonic()))
            else:
                self.pending.pop(key, None)
        return False

    def _hint_claims(self, pod_uid: str, claim_keys: set[str], end: float | None) -> None:
        """The expected end of a pod referencing these claims (None: none any more); each claim's end
        (the latest of its pods') to the ledger."""
        self.claim_ends.set(pod_uid, claim_keys, end)
        for claim_key in claim_keys:
            claim = self.cache["resourceclaims"].get(claim_key)
            if claim is not None:
                self.ledger.expect_end(str(claim["metadata"]["uid"]), self.claim_ends.end(claim_key))

    def _rebuild(self) -> None:
        started = time.monotonic()
        rules = self.cache.stores.get("devicetaintrules")  # absent where the API does not serve them
        slices = self.cache["resourceslices"].values()
        inventory = Inventory(with_taint_rules(slices, rules.objects.values()) if rules else slices)
        self.ledger = self.ledger.rebuilt(inventory)
        self.cel.clear_memos()
        self._reindex()
        self._slices_dirty = False
        log.info(
            "inventory rebuilt",
            pools=len(inventory.pools),
            gpus=len(inventory.gpus),
            seconds=round(time.monotonic() - started, 3),
        )

    def _reindex(self) -> None:
        self.index = CandidateIndex(self.ledger.inventory, self.cel)
        for pending in self.pending.values():
            pending.size = None  # read through the index: new devices or classes may change it


__all__ = ["EventIntake"]
