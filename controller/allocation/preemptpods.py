"""Who may be preempted for whom: pod priorities, and the pods that hold our devices on each node.

kube-scheduler's rules, read from the pod as it does: the priority is `spec.priority` (the Priority
admission plugin copies it from the PriorityClass; absent counts as 0), and a pod with
`spec.preemptionPolicy: Never` never preempts. Only pods of strictly lower priority may be victims.

A victim is a pod bound to a node (`spec.nodeName`), not finished, not gated, whose claims hold devices
of our driver on that node. Evicting it frees only the claims it alone uses: a claim another pod also
has in `status.reservedFor` stays allocated after the eviction, so it is not counted as freed. A pod
already being deleted (`deletionTimestamp`) is not evicted again, but what it holds is about to be
freed: the search counts it as going at no cost (after a controller restart, or a partial eviction
that a PodDisruptionBudget stopped, the pods already evicted are used before any more are chosen).
A claim whose device another claim also holds (a double hold, controller/allocation/doublehold.py)
frees nothing by going and is left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.claims.podclaims import is_gated, is_terminal, referenced_claims
from controller.kube.store import object_key
from controller.state.ledger import Ledger

Obj = dict[str, Any]


def priority(pod: Mapping[str, Any]) -> int:
    """The pod's priority as kube-scheduler reads it (`spec.priority`, 0 when absent)."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def may_preempt(pod: Mapping[str, Any]) -> bool:
    """False for `preemptionPolicy: Never` (the pod waits instead, as with kube-scheduler)."""
    return (pod.get("spec") or {}).get("preemptionPolicy") != "Never"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running pod whose eviction would free `claims` (claim uids) on `node`."""

    key: str  # namespace/name
    uid: str
    node: str
    priority: int
    started: str  # status.startTime (RFC 3339 sorts as time); "" when not known
    claims: tuple[str, ...]
    terminating: bool = False


def _reserved_by_others(claim: Mapping[str, Any], pod_uid: str) -> bool:
    reserved = (claim.get("status") or {}).get("reservedFor") or ()
    return any(str(r.get("uid")) != pod_uid for r in reserved if isinstance(r, Mapping))


def candidates_by_node(
    pods: Iterable[Mapping[str, Any]], claims: Mapping[str, Mapping[str, Any]], ledger: Ledger
) -> dict[str, list[Candidate]]:
    """Every pod whose eviction frees devices of ours, by the node it runs on."""
    pools = ledger.inventory.pools
    out: dict[str, list[Candidate]] = defaultdict(list)
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or is_terminal(dict(pod)) or is_gated(dict(pod)):
            continue
        uid = str(meta.get("uid", ""))
        freed: list[str] = []
        for key in sorted(referenced_claims(dict(pod))):
            claim = claims.get(key)
            if claim is None or _reserved_by_others(claim, uid):
                continue
            claim_uid = str(claim["metadata"].get("uid", ""))
            held = ledger.claims.get(claim_uid, ())
            if not held or claim_uid in ledger.assumed:
                continue  # nothing of ours, or our own write not yet confirmed: not a settled holding
            pool_nodes = {pools[h[0]].node if h[0] in pools else None for h in held}
            if pool_nodes != {node} or any(len(ledger.holders(h)) > 1 for h in held):
                continue
            freed.append(claim_uid)
        if freed:
            out[str(node)].append(
                Candidate(
                    key=object_key(dict(pod)),
                    uid=uid,
                    node=str(node),
                    priority=priority(pod),
                    started=str((pod.get("status") or {}).get("startTime") or ""),
                    claims=tuple(freed),
                    terminating=bool(meta.get("deletionTimestamp")),
                )
            )
    return dict(out)


__all__ = ["Candidate", "candidates_by_node", "may_preempt", "priority"]
