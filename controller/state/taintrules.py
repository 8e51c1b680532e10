"""DeviceTaintRules (resource.k8s.io/v1, GA in 1.37): their taints put on the devices they select.

kube-scheduler's allocator sees every ResourceSlice with the DeviceTaintRules applied (a rule's taint
added to each device its `deviceSelector` matches: `driver`, `pool`, `device`, each optional, all
given ones equal). flexmig's controller does the same before it builds its inventory, so a device a
rule taints with NoSchedule or NoExecute is allocated only to requests that tolerate the taint
(controller/claims/fields.py), and a request's tolerations go into its results. Taints of effect
None are informational.

NoExecute on devices already allocated is kube-controller-manager's: its device taint eviction
controller evicts the pods using an allocated claim whose device carries a NoExecute taint the claim
does not tolerate, from slices or rules alike, whoever allocated the claim (docs/native-claims.md).

Slices are copied only where a rule adds a taint; the others are passed through as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from api.constants import DRIVER_NAME

Obj = Mapping[str, Any]


def _selects(selector: Obj, driver: str, pool: str, device: str) -> bool:
    given = {"driver": driver, "pool": pool, "device": device}
    return all(selector.get(k) in (None, "", v) for k, v in given.items())


def _taint(rule: Obj) -> dict[str, Any] | None:
    taint = (rule.get("spec") or {}).get("taint") or {}
    if not taint.get("key") or not taint.get("effect"):
        return None  # not a valid rule (the API requires both): nothing to apply
    out = {k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k) is not None}
    if "timeAdded" not in out and (rule.get("metadata") or {}).get("creationTimestamp"):
        # The API sets timeAdded on create; a rule read without it dates from its creation.
        out["timeAdded"] = rule["metadata"]["creationTimestamp"]
    return out


def with_taint_rules(slices: Iterable[Obj], rules: Iterable[Obj], driver: str = DRIVER_NAME) -> list[Obj]:
    """`slices` with the taints of `rules` added to the devices of `driver` they select."""
    active = [
        ((r.get("spec") or {}).get("deviceSelector") or {}, t)
        for r in rules
        if (t := _taint(r)) is not None and not (r.get("metadata") or {}).get("deletionTimestamp")
    ]
    relevant = [(sel, t) for sel, t in active if sel.get("driver") in (None, "", driver)]
    out: list[Obj] = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        if not relevant or spec.get("driver") != driver:
            out.append(s)
            continue
        added = {
            i: [t for sel, t in relevant if _selects(sel, driver, pool, str(dev.get("name")))]
            for i, dev in enumerate(spec.get("devices") or ())
        }
        if not any(added.values()):
            out.append(s)
            continue
        tainted = copy.deepcopy(dict(s))
        for i, taints in added.items():
            if taints:
                dev = tainted["spec"]["devices"][i]
                dev["taints"] = list(dev.get("taints") or ()) + taints
        out.append(tainted)
    return out


__all__ = ["with_taint_rules"]
