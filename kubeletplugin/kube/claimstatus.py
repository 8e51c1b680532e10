"""What the plugin writes back to the API: claim `status.devices[]` and the pod's HAMi mirror. Pure.

`status.devices[].data` carries the realised identity (the source of truth for tools):
    {"migUUID", "gpuInstanceID", "computeInstanceID", "parentUUID", "profile", "placement": {start, size}}
for a whole GPU {"uuid"}, and for each share of a HAMi-core shared GPU (with its `shareID`)
{"uuid", "memoryMiB", "cores"}.

The pod annotation `hami.io/vgpu-mig-allocations` is HAMi's array. `containerIndex` counts init
containers first, then app containers; `deviceIndex` is the position of the MIG device among all MIG
devices the container gets, in the order the container lists its claims (`resources.claims`) and, per
claim, in the order of the claim's allocation results. A container entry that names a `request` only
gets that request's devices (a subrequest `req/sub` belongs to request `req`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.migannotation import MigAllocationRecord
from kubeletplugin.checkpoint.model import ClaimCheckpoint, PreparedDeviceRecord

JsonDict = dict[str, Any]


def device_status_entries(driver: str, devices: Sequence[PreparedDeviceRecord]) -> list[JsonDict]:
    out: list[JsonDict] = []
    for d in devices:
        data: JsonDict
        if d.is_mig:
            data = {
                "migUUID": d.mig_uuid,
                "gpuInstanceID": d.gi_id,
                "computeInstanceID": d.ci_id,
                "parentUUID": d.gpu_uuid,
                "profile": d.profile,
                "placement": {"start": d.placement_start, "size": d.placement_size},
            }
        elif d.is_shared:
            # The API only accepts a status entry per allocated (device, shareID): one per share.
            for share in d.shares:
                entry: JsonDict = {"driver": driver, "pool": d.pool, "device": d.device_name}
                if share.share_id is not None:
                    entry["shareID"] = share.share_id
                entry["data"] = {"uuid": d.gpu_uuid, "memoryMiB": share.memory_mib, "cores": share.cores}
                out.append(entry)
            continue
        else:
            data = {"uuid": d.gpu_uuid}
        out.append({"driver": driver, "pool": d.pool, "device": d.device_name, "data": data})
    return out


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One MIG device as one container of a pod sees it."""

    container_index: int
    container_name: str
    device_index: int
    claim_uid: str
    device: PreparedDeviceRecord


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod-level claim name -> ResourceClaim name (direct references and generated from templates)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    names: dict[str, str] = {}
    for rc in spec.get("resourceClaims") or []:
        if rc.get("resourceClaimName"):
            names[str(rc["name"])] = str(rc["resourceClaimName"])
    for st in status.get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            names[str(st["name"])] = str(st["resourceClaimName"])
    return names


def _matches_request(device: PreparedDeviceRecord, request: str | None) -> bool:
    if not request:
        return True
    return any(r == request or r.split("/", 1)[0] == request for r in device.request_names)


def pod_mig_devices(
    pod: Mapping[str, Any], claims_by_name: Mapping[str, ClaimCheckpoint]
) -> list[ContainerDevice]:
    """Every realised MIG device of `claims_by_name` (ResourceClaim name -> checkpoint) per container."""
    spec = pod.get("spec") or {}
    resolve = pod_claim_names(pod)
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    out: list[ContainerDevice] = []
    for c_index, container in enumerate(containers):
        d_index = 0
        for ref in (container.get("resources") or {}).get("claims") or []:
            claim = claims_by_name.get(resolve.get(str(ref.get("name", "")), ""))
            if claim is None:
                continue
            for device in claim.devices:
                if (
                    not device.is_mig
                    or not device.realised
                    or not _matches_request(device, ref.get("request"))
                ):
                    continue
                out.append(
                    ContainerDevice(c_index, str(container.get("name", "")), d_index, claim.uid, device)
                )
                d_index += 1
    return out


def annotation_records(devices: Sequence[ContainerDevice]) -> list[MigAllocationRecord]:
    records = []
    for cd in devices:
        d = cd.device
        assert d.profile is not None and d.placement_start is not None and d.placement_size is not None
        records.append(
            MigAllocationRecord(
                container_index=cd.container_index,
                device_index=cd.device_index,
                gpu_uuid=d.gpu_uuid,
                profile=d.profile,
                placement_start=d.placement_start,
                placement_size=d.placement_size,
                mig_uuid=d.mig_uuid,
                gpu_instance_id=d.gi_id,
                compute_instance_id=d.ci_id,
            )
        )
    return records
