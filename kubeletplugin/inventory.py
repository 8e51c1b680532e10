"""The node's devices by published name: what a device name in an allocation means on this node.

The controller (or kube-scheduler) chose the device; the plugin only looks up what that name stands
for — GPU, profile and placement — and realises it. It never picks a placement itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from api.constants import DeviceKind, mig_device_name, shared_gpu_device_name, whole_gpu_device_name
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.types import GpuInfo, Placement


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

    def get(self, name: str) -> NodeDevice | None:
        return self._devices.get(name)

    def __len__(self) -> int:
        return len(self._devices)

    def names(self) -> list[str]:
        return sorted(self._devices)
