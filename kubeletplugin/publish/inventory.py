"""The node's devices by published name: what a device name in an allocation means on this node.

The controller (or kube-scheduler) chose the device; the plugin only looks up what that name stands
for — GPU, profile and placement — and realises it. It never picks a placement itself.

It also keeps the GPU catalogs honest. A Hopper-or-newer GPU whose NVML refused profile queries while
MIG mode was off got its catalog from flexmig's built-in table (driver/catalog/discover.py). Once MIG
is on (the plugin switches it on at the first MIG prepare), `CatalogVerifier` asks NVML, and when the
answer differs from what was published the node republishes from NVML's facts: `verifying_builder`
wraps the slice builder the publisher calls on every sync, so the check costs one MIG-mode query per
still-unchecked GPU per sync and nothing once every GPU is checked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from api.constants import DeviceKind, mig_device_name, shared_gpu_device_name, whole_gpu_device_name
from driver.catalog.allowlist import MigProfileAllowlist
from driver.catalog.discover import ProfileSource, discover
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.types import GpuInfo, NvmlError, Placement
from kubeletplugin.publish.slices import NodeSlices

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class NodeDevice:
    name: str
    kind: DeviceKind
    gpu: GpuInfo
    profile: MigProfile | None  # None for a whole or shared GPU
    placement: Placement | None


class Inventory:
    def __init__(self, devices: Mapping[str, NodeDevice]) -> None:
        self._devices = dict(devices)
        self._lock = threading.Lock()

    @classmethod
    def from_catalogs(cls, catalogs: Iterable[GpuCatalog]) -> Inventory:
        devices: dict[str, NodeDevice] = {}
        for cat in catalogs:
            whole = whole_gpu_device_name(cat.gpu.index)
            devices[whole] = NodeDevice(whole, DeviceKind.WHOLE, cat.gpu, None, None)
            # Every kind a GPU could be published as; the plugin keeps only what it published.
            shared = shared_gpu_device_name(cat.gpu.index)
            devices[shared] = NodeDevice(shared, DeviceKind.SHARED, cat.gpu, None, None)
            for profile in cat.profiles:
                for placement in profile.placements:
                    name = mig_device_name(
                        cat.gpu.index, profile.name, profile.gi_profile_id, placement.start
                    )
                    devices[name] = NodeDevice(name, DeviceKind.MIG, cat.gpu, profile, placement)
        return cls(devices)

    @classmethod
    def published(cls, catalogs: Iterable[GpuCatalog], slices: NodeSlices) -> Inventory:
        """Only the devices `slices` publish."""
        full = cls.from_catalogs(catalogs)
        names = {d["name"] for s in slices.slices for d in s.body["spec"].get("devices") or []}
        return cls({n: d for n in names if (d := full.get(n)) is not None})

    def replace_with(self, other: Inventory) -> None:
        """Take `other`'s devices (after a republish), in place: every holder sees the new ones."""
        with other._lock:
            devices = dict(other._devices)
        with self._lock:
            self._devices = devices

    def get(self, name: str) -> NodeDevice | None:
        with self._lock:
            return self._devices.get(name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._devices)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._devices)


class CatalogVerifier:
    """The node's GPU catalogs; those NVML could not answer for yet are re-read once MIG is on."""

    def __init__(
        self, nvml: ProfileSource, catalogs: Sequence[GpuCatalog], allowlist: MigProfileAllowlist
    ) -> None:
        self._nvml = nvml
        self._allowlist = allowlist
        self._catalogs = list(catalogs)
        self._lock = threading.Lock()

    def catalogs(self) -> list[GpuCatalog]:
        with self._lock:
            return list(self._catalogs)

    def pending(self) -> list[int]:
        """GPU indices whose catalog still waits for NVML."""
        with self._lock:
            return [c.gpu.index for c in self._catalogs if c.awaits_nvml]

    def verify(self) -> list[int]:
        """Re-read every waiting GPU whose MIG mode is now on; the indices whose catalog changed.

        A GPU whose NVML facts equal the built-in ones is marked checked and nothing changes. One that
        differs, or an unknown model that now reports profiles, gets NVML's catalog and is returned,
        so the caller republishes. NVML errors leave the GPU waiting (checked again next time).
        """
        changed: list[int] = []
        for pos, old in enumerate(self.catalogs()):
            if not old.awaits_nvml:
                continue
            index = old.gpu.index
            try:
                if not self._nvml.mig_mode(index).current:
                    continue
                fresh = discover(self._nvml, index, self._allowlist)
            except NvmlError as exc:
                log.warning("cannot check the GPU's MIG profiles against NVML yet", gpu=index, error=str(exc))
                continue
            if fresh.awaits_nvml:  # MIG went off again between the two calls
                continue
            with self._lock:
                self._catalogs[pos] = fresh
            same = (fresh.all_profiles, fresh.profiles) == (old.all_profiles, old.profiles)
            if same:
                log.info("NVML confirms the built-in MIG profile table", gpu=index, model=fresh.model)
                continue
            changed.append(index)
            log.warning(
                "NVML's MIG profiles differ from what was published; republishing from NVML",
                gpu=index,
                model=fresh.model,
                origin=old.origin.value,
                differences=profile_differences(old.all_profiles, fresh.all_profiles),
            )
        return changed


def profile_differences(old: Sequence[MigProfile], new: Sequence[MigProfile]) -> list[str]:
    """Human-readable differences between two profile lists (by profile id), for the log."""
    before = {p.gi_profile_id: p for p in old}
    after = {p.gi_profile_id: p for p in new}
    out: list[str] = []
    for pid in sorted(before.keys() | after.keys()):
        a, b = before.get(pid), after.get(pid)
        if a is None and b is not None:
            out.append(f"+{b.name} (id {pid})")
        elif b is None and a is not None:
            out.append(f"-{a.name} (id {pid})")
        elif a is not None and b is not None and a != b:
            fields = [f for f in MigProfile.__dataclass_fields__ if getattr(a, f) != getattr(b, f)]
            out.append(
                f"{b.name} (id {pid}): " + ", ".join(f"{f} {getattr(a, f)}->{getattr(b, f)}" for f in fields)
            )
    return out


CatalogSliceBuilder = Callable[[Sequence[GpuCatalog], int], NodeSlices]


def verifying_builder(
    verifier: CatalogVerifier, inventory: Inventory, build: CatalogSliceBuilder
) -> Callable[[int], NodeSlices]:
    """The publisher's slice builder: check waiting catalogs first, and when one changed, build from
    the new catalogs and swap the plugin's inventory to what is now published."""

    def build_verified(generation: int) -> NodeSlices:
        changed = verifier.verify() if verifier.pending() else []
        catalogs = verifier.catalogs()
        slices = build(catalogs, generation)
        if changed:
            inventory.replace_with(Inventory.published(catalogs, slices))
        return slices

    return build_verified
