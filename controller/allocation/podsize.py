"""How much a gated pod asks for, so that a step's pending pods are decided largest first.

The allocation loop (controller/allocation/loop.py `Controller.step`) decides the pods that are dirty
in one step in the placer's batch order (driver/policy/placer.py `Placer.batch_order`): most memory
first, then most devices, then oldest. A pod's size is read from its claims not yet allocated, the
way the decision reads them (controller/claims/requests.py `claim_requests`, classified by
controller/shared/shares.py `classify`), taking each request's first alternative (the preferred one):

- MIG devices: the smallest published MIG profile the selectors admit (what the policy places at
  least), times the count;
- whole GPUs: the memory of the smallest GPU the selectors admit, times the count;
- shares of hami-core GPUs: the least memory one share consumes on a GPU it may use, times the count.

A pod whose size cannot be read (its claims are not created yet, a request the controller refuses,
nothing published matches) has none and is decided after the sized pods, oldest first; the decision
itself then says what is wrong. A pod with one MIG device asked one way, and no claim allocated yet,
whose selectors ask for memory only (controller/claims/requests.py `CandidateIndex.memory_only`)
gets a plan key (`PodSize.plan_key`: its node constraints): pods with equal keys may be planned together (driver/policy/placer.py `Placer.burst_group`). The size only orders and
advises: a stale or rough one costs packing, never correctness, because each pod is still decided on
the state the pods before it leave.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from api.constants import ANNOTATION_EXPECTED_DURATION
from controller.claims.candidates import CandidateIndex
from controller.claims.podclaims import claim_names
from controller.claims.requests import Alternative, RequestError, claim_requests
from controller.claims.resultconfig import dedicated
from controller.shared.shares import AltKind, ShareAmounts, classify
from driver.policy.placer import PodSize

Obj = Mapping[str, Any]


def pod_size(
    pod: Obj, claims: Mapping[str, Obj], classes: Mapping[str, Obj], index: CandidateIndex
) -> PodSize | None:
    """The memory (MiB) and device count `pod`'s unallocated claims ask for; None when not readable
    yet (a claim missing from `claims`, keyed namespace/name, raises ClaimsPending or KeyError)."""
    ns = pod["metadata"]["namespace"]
    memory = devices = 0
    # The one MIG request a burst plan may place (None once anything else is seen).
    plannable: Alternative | None = None
    other = False
    amounts = ShareAmounts(index.inventory, index.share_amounts_cache)
    for name in claim_names(pod).values():
        claim = claims[f"{ns}/{name}"]
        if (claim.get("status") or {}).get("allocation"):
            other = True  # an allocated claim pins the node: not the burst's node filter
            continue
        try:
            requests = claim_requests(claim, classes, index)
        except RequestError:
            return None
        for req in requests:
            alt = req.alternatives[0]
            if alt.admin:  # consumes nothing; its placement is no burst plan's (adminaccess.py)
                other = True
                continue
            where = f"claim {req.claim} spec.devices.requests[{alt.result_name}]"
            try:
                kind = classify(index, dedicated(index, alt), where)
            except RequestError:
                return None
            if (
                kind.kind is AltKind.MIG
                and len(req.alternatives) == 1
                and alt.count == 1
                and plannable is None
                and not alt.capacity_requested
                and index.memory_only(alt.selectors)
            ):
                plannable = alt
            else:
                other = True
            if kind.kind is AltKind.MIG:
                each = kind.mig.min_memory_mib
            elif kind.kind is AltKind.WHOLE:
                each = min(index.inventory.gpus[ref].catalog.gpu.memory_total_mib for ref in kind.whole)
            elif kind.kind is AltKind.SHARED:
                options, _, _ = amounts.amounts(alt, kind.shared, where)
                if not options:
                    return None
                each = min(a.memory_mib for a in options.values())
            else:
                return None
            memory += each * alt.count
            devices += alt.count
    # A hinted pod is priced with its co-location term, which the plan does not model.
    hinted = ANNOTATION_EXPECTED_DURATION in ((pod.get("metadata") or {}).get("annotations") or {})
    key = None if other or hinted or plannable is None else _plan_key(pod)
    return PodSize(memory, devices, plan_key=key)


def _plan_key(pod: Obj) -> str:
    """What must be equal for pods to share one burst plan, given that their selectors ask for
    memory only (`CandidateIndex.memory_only`): the pod's node constraints (one node filter), as
    canonical JSON."""
    spec = pod.get("spec") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    return json.dumps(
        {
            "nodeName": spec.get("nodeName") or "",
            "nodeSelector": spec.get("nodeSelector") or {},
            "required": affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {},
            "tolerations": spec.get("tolerations") or [],
        },
        sort_keys=True,
        default=str,
    )
