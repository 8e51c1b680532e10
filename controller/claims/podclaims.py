"""A pod's claims by name, and the `hami.io/vgpu-mig-allocations` mirror of what it was given."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from api import devicecontract as dc
from api.constants import ALLOCATION_GATE, DRIVER_NAME, DeviceKind, parse_device_name
from controller.state.inventory import Inventory
from driver.migannotation import MigAllocationRecord, encode_mig_allocations

Obj = Mapping[str, Any]


class ClaimsPending(Exception):
    """A claim the pod needs does not exist yet (template not instantiated, or not in the cache)."""


def is_gated(pod: Obj) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == ALLOCATION_GATE for g in gates)


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def claim_names(pod: Obj) -> dict[str, str]:
    """Pod claim entry name -> ResourceClaim name; raises ClaimsPending while one is unknown."""
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    out: dict[str, str] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("resourceClaimName"):
            out[entry["name"]] = entry["resourceClaimName"]
        elif entry.get("resourceClaimTemplateName"):
            status = statuses.get(entry["name"])
            if status is None:
                raise ClaimsPending(f"claim for {entry['name']!r} not generated from its template yet")
            if status.get("resourceClaimName"):  # unset: no claim needed for this entry
                out[entry["name"]] = status["resourceClaimName"]
    return out


def _has_share(results: Iterable[Mapping[str, Any]]) -> bool:
    for r in results:
        if r.get("driver") != DRIVER_NAME:
            continue
        try:
            if parse_device_name(str(r.get("device"))).kind is DeviceKind.SHARED:
                return True
        except ValueError:
            continue
    return False


def allocation_results(claim: Obj) -> list[Mapping[str, Any]]:
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or ())


def split_share_problem(pod: Obj, results_by_entry: Mapping[str, Iterable[Mapping[str, Any]]]) -> str | None:
    """Why the pod cannot run as allocated when a container would get HAMi-core shares from more than one
    claim (None when none would).

    HAMi-core's limits are environment variables numbered by the container's visible GPUs
    (`CUDA_DEVICE_MEMORY_LIMIT_<k>`); each claim's CDI spec numbers its own devices from 0, so a runtime
    merging two such claims keeps one claim's value for the other's GPU, possibly a larger limit. Such a
    pod is refused rather than run with limits nobody asked for. `results_by_entry` maps pod claim entry
    names to their allocation results.
    """
    spec = pod.get("spec") or {}
    shared = {entry for entry, results in results_by_entry.items() if _has_share(results)}
    split = []
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or ():
            used = {c.get("name") for c in (container.get("resources") or {}).get("claims") or ()}
            if len(used & shared) > 1:
                split.append(str(container.get("name")))
    if not split:
        return None
    return (
        f"container(s) {', '.join(split)} would get HAMi-core shares from more than one claim; HAMi-core "
        "limits are per container, so give each container one hami-core claim (with any number of GPUs)"
    )


def referenced_claims(pod: Obj) -> set[str]:
    """namespace/name of every claim the pod references (best effort, never raises)."""
    ns = pod["metadata"].get("namespace")
    names = {e.get("resourceClaimName") for e in (pod.get("spec") or {}).get("resourceClaims") or ()}
    names |= {
        s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    return {f"{ns}/{n}" for n in names if n}


class LiveRefs:
    """Which claims live pods reference, kept per pod as pods come and go, so that a resync asks
    `in_use(claim)` in O(1) instead of scanning every pod for every claim."""

    def __init__(self) -> None:
        self._by_pod: dict[str, frozenset[str]] = {}
        self._count: dict[str, int] = {}

    def set(self, pod_uid: str, refs: Iterable[str]) -> None:
        new = frozenset(refs)
        old = self._by_pod.get(pod_uid, frozenset())
        if new == old:
            return
        for key in old - new:
            left = self._count[key] - 1
            if left:
                self._count[key] = left
            else:
                del self._count[key]
        for key in new - old:
            self._count[key] = self._count.get(key, 0) + 1
        if new:
            self._by_pod[pod_uid] = new
        else:
            self._by_pod.pop(pod_uid, None)

    def drop(self, pod_uid: str) -> None:
        self.set(pod_uid, ())

    def in_use(self, claim_key: str) -> bool:
        return claim_key in self._count


def mirror_annotation(pod: Obj, claims: Mapping[str, Obj], inventory: Inventory) -> str | None:
    """HAMi's annotation: per container (init first), the MIG devices it uses; no runtime fields.

    `claims` maps pod claim entry name -> claim. None when the pod uses no flexmig MIG device.
    """
    spec = pod.get("spec") or {}
    containers = list(spec.get("initContainers") or ()) + list(spec.get("containers") or ())
    records: list[MigAllocationRecord] = []
    for ci, container in enumerate(containers):
        device_index = 0
        for ref in (container.get("resources") or {}).get("claims") or ():
            claim = claims.get(ref.get("name"))
            if claim is None:
                continue
            wanted = ref.get("request")
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
                "results"
            ) or ()
            for result in results:
                if result.get("driver") != DRIVER_NAME:
                    continue
                request = str(result.get("request", ""))
                if wanted and request != wanted and not request.startswith(wanted + "/"):
                    continue
                dev = inventory.device((result["pool"], result["device"]))
                if dev is None or dev.kind is not DeviceKind.MIG or dev.profile is None:
                    continue
                gpu = inventory.gpus.get(dev.gpu) if dev.gpu is not None else None
                records.append(
                    MigAllocationRecord(
                        container_index=ci,
                        device_index=device_index,
                        gpu_uuid=gpu.uuid if gpu is not None else str(dev.attribute(dc.ATTR_PARENT_UUID)),
                        profile=dev.profile,
                        placement_start=dev.start or 0,
                        placement_size=dev.size or 1,
                    )
                )
                device_index += 1
    return encode_mig_allocations(records) if records else None
