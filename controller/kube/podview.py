"""The part of a pod the controller keeps in its watch cache.

The controller watches every pod in the cluster, but only allocates for pods that use claims or ask for
GPUs; an ordinary pod with managedFields costs 26-48 KiB decoded, so caching every pod whole filled the
1 Gi limit at 20,000-40,000 pods. The reflector (controller/kube/watchcache.py) therefore passes each
listed or watched pod through its `Projection` (`PROJECTIONS["pods"]`): a pod that is not `relevant`
is not kept at all (a watch event for it becomes a DELETED, so one that stops being relevant leaves the
cache), and a relevant one is `strip_pod`-ed to the fields the controller reads:

- metadata: everything but managedFields and kubectl's last-applied-configuration annotation (names,
  uid, resourceVersion, deletionTimestamp, annotations such as the lifetime hint and the mirror);
- spec: nodeName, nodeSelector, affinity.nodeAffinity, tolerations, schedulingGates (all of them: the
  gate removal writes back the others), resourceClaims, priority, schedulerName, and per (init)
  container only name and resources (claims, limits, requests);
- status: phase, startTime, resourceClaimStatuses, extendedResourceClaimStatus.

tests/unit/controller/test_podview.py runs the controller's pod-reading functions on a full and a
stripped pod and asserts the same answers; a new read of another field must be added here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api.constants import ALLOCATION_GATE, DRIVER_NAME, RESOURCE_GPU

Obj = dict[str, Any]

# Legacy requests (nvidia.com/gpu, gpumem, gpucores, ...) and extended resources of our own domain.
GPU_RESOURCE_PREFIXES = (RESOURCE_GPU, f"{DRIVER_NAME}/")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_SPEC_KEYS = (
    "nodeName",
    "nodeSelector",
    "tolerations",
    "schedulingGates",
    "resourceClaims",
    "priority",
    "schedulerName",
)
_STATUS_KEYS = ("phase", "startTime", "resourceClaimStatuses", "extendedResourceClaimStatus")
_CONTAINER_KINDS = ("initContainers", "containers")


def _asks_for_gpus(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    if resources.get("claims"):
        return True
    for part in ("limits", "requests"):
        for name in resources.get(part) or {}:
            if str(name).startswith(GPU_RESOURCE_PREFIXES):
                return True
    return False


def relevant(pod: Mapping[str, Any]) -> bool:
    """Whether allocation may ever need this pod: it uses claims, asks for GPUs or carries our gate."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    if any(g.get("name") == ALLOCATION_GATE for g in spec.get("schedulingGates") or ()):
        return True
    if (pod.get("status") or {}).get("extendedResourceClaimStatus"):
        return True
    return any(_asks_for_gpus(c) for kind in _CONTAINER_KINDS for c in spec.get(kind) or ())


def strip_pod(pod: Mapping[str, Any]) -> Obj:
    """The pod with only the fields the controller reads (see the module docstring)."""
    out: Obj = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    out["metadata"] = meta
    spec = pod.get("spec") or {}
    kept: Obj = {k: spec[k] for k in _SPEC_KEYS if k in spec}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity is not None:
        kept["affinity"] = {"nodeAffinity": node_affinity}
    for kind in _CONTAINER_KINDS:
        if kind in spec:
            kept[kind] = [{k: c[k] for k in ("name", "resources") if k in c} for c in spec.get(kind) or ()]
    out["spec"] = kept
    status = pod.get("status") or {}
    out["status"] = {k: status[k] for k in _STATUS_KEYS if k in status}
    return out


def project_pod(pod: Obj) -> Obj | None:
    """The reflector's transform for pods: the stripped pod, or None for one not to keep."""
    return strip_pod(pod) if relevant(pod) else None


@dataclass(frozen=True, slots=True)
class Projection:
    """What the cache keeps of one resource: only `relevant` objects, each as `strip` returns it."""

    relevant: Callable[[Mapping[str, Any]], bool]
    strip: Callable[[Mapping[str, Any]], Obj]

    def event(self, kind: str, obj: Obj) -> tuple[str, Obj]:
        """A watch event as the store must see it; an irrelevant object is deleted by identity."""
        if self.relevant(obj):
            return kind, self.strip(obj)
        meta = obj.get("metadata") or {}
        keep = ("name", "namespace", "uid", "resourceVersion")
        return "DELETED", {"metadata": {k: meta[k] for k in keep if k in meta}}

    def items(self, items: list[Obj]) -> tuple[Obj, ...]:
        """A list's items, dropping each decoded item as soon as it is projected (lower peak)."""
        out = []
        for i, item in enumerate(items):
            items[i] = {}
            if self.relevant(item):
                out.append(self.strip(item))
        return tuple(out)


# What the watch cache (controller/kube/watchcache.py) projects, by resource.
PROJECTIONS: Mapping[str, Projection] = {"pods": Projection(relevant, strip_pod)}
