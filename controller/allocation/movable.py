"""Which running pods may be moved (evicted and recreated elsewhere) to defragment: docs/moves.md.

A move restarts a pod, so only its owner may allow it: the pod annotation `gpu.flexmig.dev/movable`
("true"), or a namespace the operator lists as movable by default (batch namespaces), where
"false" opts a pod out. Beyond consent, a pod is movable only when a move can actually complete and
pays for itself:

- a controller recreates it (an owner reference with `controller: true`: ReplicaSet, Job,
  StatefulSet...); a bare pod would just be killed;
- every claim of its comes from a ResourceClaimTemplate, so its replacement gets fresh claims that
  the controller can allocate at the reserved destination (a named claim would follow the pod back to
  the devices it already holds);
- it is not expected to end soon: with the lifetime hint (`gpu.flexmig.dev/expected-duration`, read
  as the allocation policy reads it) a pod whose expected end is less than `min_remaining_s` away is
  left alone: the room it frees by ending costs nobody a restart. Among the plans with the fewest
  moves the planner then prefers the youngest pods (`age_s`): the least work lost.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from typing import Any

from api.constants import ANNOTATION_MOVABLE
from controller.allocation.lifetime import running_end

MIN_REMAINING_S = 600.0
"""A hinted pod expected to end within this is never moved: waiting for it costs less than its restart."""


def opted_in(pod: Mapping[str, Any], namespaces: Collection[str]) -> bool:
    """The pod's own annotation, else whether its namespace is movable by default."""
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_MOVABLE)
    if value is not None:
        return str(value).strip().lower() == "true"
    return str(meta.get("namespace") or "") in namespaces


def controller_owner(pod: Mapping[str, Any]) -> str | None:
    """The uid of the object that recreates the pod (its controller owner reference), if any."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid"):
            return str(ref["uid"])
    return None


def claim_shape(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """(entry, template) of every claim of the pod; None when one is not from a template. The same
    shape and controller owner identify a moved pod's replacement."""
    shape = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        template = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
        if not template:
            return None
        shape.append((str(entry.get("name")), str(template)))
    return tuple(sorted(shape)) or None


def _start(pod: Mapping[str, Any]) -> float | None:
    value = (pod.get("status") or {}).get("startTime")
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age_s(pod: Mapping[str, Any], now: float) -> float:
    """Seconds the pod has run (the work a move loses); 0 when its start is not known."""
    began = _start(pod)
    return max(0.0, now - began) if began is not None else 0.0


def why_not_movable(
    pod: Mapping[str, Any], now: float, namespaces: Collection[str], min_remaining_s: float = MIN_REMAINING_S
) -> str | None:
    """None when the pod may be moved; else the first reason it may not (for logs and tests)."""
    if not opted_in(pod, namespaces):
        return "not opted in"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "terminating"
    if controller_owner(pod) is None:
        return "no controller recreates it"
    if claim_shape(pod) is None:
        return "a claim not from a template"
    end = running_end(pod, now)
    if end is not None and end - now < min_remaining_s:
        return "expected to end soon"
    return None


__all__ = ["MIN_REMAINING_S", "age_s", "claim_shape", "controller_owner", "opted_in", "why_not_movable"]
