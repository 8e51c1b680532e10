"""Deallocation of claims the controller allocated (those carrying its finalizer).

kube-scheduler's resourceclaim controller only deallocates claims that carry the builtin finalizer, so
claims allocated here are ours to free: once nobody has them reserved and the pod they were allocated
for is gone or finished (and no other live pod references them), the allocation is cleared and the
finalizer removed, which also lets a deleted claim go away. A claim that still has our finalizer but no
allocation was deallocated by someone else -- kube-scheduler's PostFilter does that when no node fits
the pod -- so the finalizer is dropped and the pod is told why its placement was lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.claims.podclaims import LiveRefs, is_gated
from controller.kube.store import resource_version
from controller.kube.watchcache import WatchCache
from controller.kube.writer import ALLOCATED_FOR_ANNOTATION, FINALIZER, Writer, is_conflict, is_not_found
from controller.state.ledger import Ledger, claim_holdings

log = structlog.get_logger(__name__)

Obj = Mapping[str, Any]


def has_finalizer(claim: Obj) -> bool:
    return FINALIZER in ((claim.get("metadata") or {}).get("finalizers") or ())


def needs_attention(
    claim: Obj,
    pod_alive: Callable[[str], bool],
    claim_in_use: Callable[[str], bool],
    pod_gated: Callable[[str], bool] = lambda _uid: False,
) -> str | None:
    """What to do with one claim: 'deallocate', 'release' (drop finalizer only) or None."""
    if not has_finalizer(claim):
        return None
    status = claim.get("status") or {}
    meta = claim["metadata"]
    owner = (meta.get("annotations") or {}).get(ALLOCATED_FOR_ANNOTATION, "")
    if not status.get("allocation"):
        # Still gated: our own allocation of it is under way (or its write was refused or did not
        # land, controller/allocation/uncertain.py), not cleared by someone else; the retry keeps it.
        return None if owner and pod_gated(owner) else "release"
    if status.get("reservedFor"):
        return None
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("deletionTimestamp"):
        return "deallocate"
    if (owner and pod_alive(owner)) or claim_in_use(key):
        return None
    return "deallocate"


def deallocate(
    writer: Writer, claim: dict[str, Any], action: str, pods_by_uid: Mapping[str, Obj]
) -> dict[str, Any] | None:
    """Carry out `action`; returns the claim as last written (None if it was deleted). Raises on 409."""
    meta = claim["metadata"]
    current: dict[str, Any] | None = claim
    if action == "deallocate":
        current = writer.write_allocation(claim, None)
        log.info("deallocated claim", claim=f"{meta['namespace']}/{meta['name']}")
    elif not meta.get("deletionTimestamp"):
        pod = pods_by_uid.get((meta.get("annotations") or {}).get(ALLOCATED_FOR_ANNOTATION, ""))
        if pod is not None:
            writer.event(
                pod,
                "Pod",
                "Warning",
                "AllocationCleared",
                f"the allocation of claim {meta['name']} was cleared by someone else (kube-scheduler does this "
                "when no node fits the pod); kube-scheduler now allocates it",
            )
    assert current is not None
    return writer.unprotect_claim(current)


class ClaimChecks:
    """The deallocation pass of controller/allocation/loop.py's `Controller` (a mixin of it)."""

    cache: WatchCache
    writer: Writer | None
    ledger: Ledger
    dirty: set[str]
    pending: dict[str, Any]
    pods_by_uid: dict[str, dict[str, Any]]
    live_refs: LiveRefs

    def _check_claim(self, key: str) -> None:
        claim = self.cache["resourceclaims"].get(key)
        if claim is None:
            return
        action = needs_attention(
            claim,
            lambda uid: uid in self.pods_by_uid,
            self.live_refs.in_use,
            lambda uid: uid in self.pods_by_uid and is_gated(self.pods_by_uid[uid]),
        )
        if action is None:
            return
        assert self.writer is not None
        try:
            result = deallocate(self.writer, claim, action, self.pods_by_uid)
        except ApiException as exc:
            if is_conflict(exc) or is_not_found(exc):
                return  # the watch brings the new version, which is checked again
            raise
        if result is not None:
            self.cache.stores["resourceclaims"].assume(result)
            self.ledger.observe(result["metadata"]["uid"], claim_holdings(result), resource_version(result))
        self.dirty |= set(self.pending)
