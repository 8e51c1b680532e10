"""What `flexmig status` shows, as values: who holds each allocated device, and each GPU's occupancy.

Input is what the API shows: the published ResourceSlices (as an `Inventory`), the ResourceClaims and,
optionally, the Pods. A device counts as taken when a claim's `status.allocation` names it (whoever
allocated it), exactly as the controller's ledger counts it. The pod that uses a claim comes from the
claim's `status.reservedFor`, else from its owner (a claim generated from a pod's template), else from
a pod that references it. A GPU whose whole device says MIG mode is off and needs a reset to change
(Ampere) is marked `mig_mode_off`. The realised identity (GPU instance id, MIG UUID) is kept when the node wrote
it into the claim's `status.devices[].data` at prepare. Shared (HAMi-core) devices are held by many
claims, one share each (controller/shared/view.py), so they are never reported as conflicts.

Pure. The text view is controller/views/statusview.py, the JSON/YAML one controller/views/statusdata.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api import devicecontract as dc
from api.constants import DRIVER_NAME
from controller.claims.podclaims import referenced_claims
from controller.shared.view import ShareHolding, share_holdings
from controller.state.inventory import DeviceKey, Inventory, InventoryGpu
from driver.catalog.types import MigProfile
from driver.placement.fragmentation import capacity, fragmentation
from driver.placement.occupancy import Occupancy, OccupancyError, PlacedProfile

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Holder:
    """The claim (and the pods) holding one allocated device."""

    claim: str  # namespace/name
    pods: tuple[str, ...] = ()  # namespace/name; empty when no pod could be found
    data: Mapping[str, Any] | None = None  # the node's status.devices[].data for the device

    @property
    def who(self) -> str:
        """Short label: the pod(s), or the claim when no pod is known."""
        return ",".join(self.pods) if self.pods else self.claim

    @property
    def identity(self) -> str:
        """Realised identity written by the node, or '' before prepare."""
        if not self.data:
            return ""
        parts = []
        if self.data.get("gpuInstanceID") is not None:
            parts.append(f"GI {self.data['gpuInstanceID']}")
        if self.data.get("computeInstanceID") is not None:
            parts.append(f"CI {self.data['computeInstanceID']}")
        if self.data.get("migUUID"):
            parts.append(str(self.data["migUUID"]))
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Allocations:
    """Allocated devices by (pool, device), and problems found while reading the claims."""

    holders: Mapping[DeviceKey, Holder] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()
    shares: Mapping[DeviceKey, tuple[ShareHolding, ...]] = field(default_factory=dict)


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _pods_of(claim: Obj, referencing: Mapping[str, list[str]]) -> tuple[str, ...]:
    meta = claim.get("metadata") or {}
    ns = meta.get("namespace", "")
    reserved = [
        f"{ns}/{r.get('name')}"
        for r in (claim.get("status") or {}).get("reservedFor") or ()
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name")
    ]
    if reserved:
        return tuple(reserved)
    owners = [
        f"{ns}/{o.get('name')}"
        for o in meta.get("ownerReferences") or ()
        if o.get("kind") == "Pod" and o.get("apiVersion") == "v1" and o.get("name")
    ]
    if owners:
        return tuple(owners)
    return tuple(sorted(referencing.get(_key(claim), ())))


def collect_allocations(
    claims: Iterable[Obj], pods: Iterable[Obj] = (), driver: str = DRIVER_NAME
) -> Allocations:
    """Every device of `driver` named in a claim's status.allocation, with its holder."""
    referencing: dict[str, list[str]] = defaultdict(list)
    for pod in pods:
        if not (pod.get("metadata") or {}).get("name"):
            continue
        for claim_key in referenced_claims(pod):
            referencing[claim_key].append(_key(pod))
    holders: dict[DeviceKey, Holder] = {}
    conflicts: list[str] = []
    shares: dict[DeviceKey, list[ShareHolding]] = defaultdict(list)
    for claim in sorted(claims, key=_key):
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        # adminAccess results watch a device without holding it: not a holder, never a conflict.
        ours = [
            r
            for r in results
            if r.get("driver") == driver and r.get("pool") and r.get("device") and not r.get("adminAccess")
        ]
        if not ours:
            continue
        data = {
            (str(d.get("pool")), str(d.get("device"))): d.get("data")
            for d in status.get("devices") or ()
            if d.get("driver") == driver and isinstance(d.get("data"), Mapping)
        }
        pods_of = _pods_of(claim, referencing)
        name = _key(claim)
        for key, share in share_holdings(claim, Holder(name, pods_of)) if driver == DRIVER_NAME else ():
            shares[key].append(share)
        shared_keys = {k for k in shares}
        for r in ours:
            key = (str(r["pool"]), str(r["device"]))
            if key in shared_keys:
                continue
            other = holders.get(key)
            if other is not None:
                if other.claim != name:
                    conflicts.append(f"{key[0]}/{key[1]} is allocated to both {other.claim} and {name}")
                continue
            holders[key] = Holder(name, pods_of, data.get(key))
    return Allocations(holders, tuple(conflicts), {k: tuple(v) for k, v in shares.items()})


@dataclass(frozen=True, slots=True)
class Instance:
    placed: PlacedProfile
    device: str
    holder: Holder


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu: InventoryGpu
    occupancy: Occupancy
    instances: tuple[Instance, ...]
    whole: Holder | None  # the whole-GPU device's holder, when it is allocated
    problems: tuple[str, ...]
    mig_mode: str | None = None  # published only where a change needs a reset (api/devicecontract.py)
    mig_mode_needs_reset: bool | None = None  # None: not MIG-capable, or an older node plugin

    @property
    def mig_mode_off(self) -> bool:
        """MIG stays off until an administrator enables it and resets the GPU (Ampere)."""
        return self.mig_mode == dc.MIG_MODE_OFF and bool(self.mig_mode_needs_reset)

    @property
    def memory_slices(self) -> int:
        return self.gpu.catalog.memory_slices

    def fits(self) -> list[tuple[str, int]]:
        """(profile, reachable instances) for every allowed profile that still fits at least once."""
        if self.whole is not None:
            return []
        out = [(name, n) for name, n in capacity(self.occupancy).items() if n > 0]
        if self.gpu.whole_device is not None and self.occupancy.is_empty:
            out.append(("whole GPU", 1))
        return out

    def fragmentation(self) -> float | None:
        if self.whole is not None or not self.gpu.catalog.profiles:
            return None
        return fragmentation(self.occupancy)


def _profile(gpu: InventoryGpu, inventory: Inventory, device: str) -> MigProfile | None:
    dev = inventory.device((gpu.pool, device))
    if dev is None or dev.profile is None:
        return None
    gi = (dev.raw.get("attributes") or {}).get(dc.ATTR_GI_PROFILE_ID, {}).get("int")
    by_name = [p for p in gpu.catalog.profiles if p.name == dev.profile]
    return next((p for p in by_name if p.gi_profile_id == gi), by_name[0] if by_name else None)


def gpu_view(gpu: InventoryGpu, inventory: Inventory, holders: Mapping[DeviceKey, Holder]) -> GpuView:
    occ = Occupancy.for_catalog(gpu.catalog)
    instances: list[Instance] = []
    problems: list[str] = []
    for (_, start), device in sorted(gpu.mig_devices.items(), key=lambda item: (item[0][1], item[0][0])):
        holder = holders.get((gpu.pool, device))
        if holder is None:
            continue
        profile = _profile(gpu, inventory, device)
        if profile is None:
            problems.append(f"{device} ({holder.claim}): profile not published")
            continue
        try:
            occ = occ.place(profile, start)
        except OccupancyError as exc:
            problems.append(f"{device} ({holder.claim}): {exc}")
            continue
        instances.append(Instance(PlacedProfile(profile, start), device, holder))
    whole = holders.get((gpu.pool, gpu.whole_device)) if gpu.whole_device is not None else None
    if whole is not None and instances:
        problems.append(f"whole GPU allocated to {whole.claim} while MIG devices are allocated too")
    dev = inventory.device((gpu.pool, gpu.whole_device)) if gpu.whole_device is not None else None
    mode = dev.attribute(dc.ATTR_MIG_MODE) if dev is not None else None
    needs_reset = dev.attribute(dc.ATTR_MIG_MODE_CHANGE_NEEDS_RESET) if dev is not None else None
    return GpuView(
        gpu,
        occ,
        tuple(instances),
        whole,
        tuple(problems),
        None if mode is None else str(mode),
        None if needs_reset is None else bool(needs_reset),
    )
