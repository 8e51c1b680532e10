"""Taking devices out of the published capacity while an instance flexmig did not create holds them.

A GPU instance created out of band (by an administrator, another tool) occupies its placement: any
device that overlaps it cannot be prepared, so publishing it would let the allocator hand out a device
whose pod then waits forever. The periodic reconcile finds such instances and the publisher leaves the
overlapping devices out of the ResourceSlices; when the instance disappears they are published again.
flexmig never touches the instance itself. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, replace

from api.constants import DeviceKind
from driver.nvml.types import GpuInstance
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.publish.slices import NodeSlices, PublishedSlice


@dataclass(frozen=True, slots=True, order=True)
class ForeignInstance:
    gpu_index: int
    gi_id: int
    profile_id: int
    start: int
    size: int

    @classmethod
    def of(cls, gpu_index: int, gi: GpuInstance) -> ForeignInstance:
        return cls(gpu_index, gi.gi_id, gi.profile_id, gi.placement.start, gi.placement.size)

    def __str__(self) -> str:
        return f"GPU {self.gpu_index} GI {self.gi_id} (profile {self.profile_id}, placement {self.start}:{self.size})"


def overlapped_devices(inventory: Inventory, foreign: Iterable[ForeignInstance]) -> frozenset[str]:
    """Names of the inventory's devices that a foreign instance makes unpreparable.

    A whole GPU and a HAMi-core share need the GPU without MIG instances; a MIG device needs its
    placement free.
    """
    out: set[str] = set()
    instances = list(foreign)
    for name in inventory.names():
        nd = inventory.get(name)
        assert nd is not None
        for inst in instances:
            if inst.gpu_index != nd.gpu.index:
                continue
            if nd.kind is not DeviceKind.MIG:
                out.add(name)
                break
            assert nd.placement is not None
            if nd.placement.start < inst.start + inst.size and inst.start < nd.placement.end:
                out.add(name)
                break
    return frozenset(out)


def without_devices(published: NodeSlices, withdrawn: frozenset[str]) -> NodeSlices:
    """The same pool minus the withdrawn devices. A device slice left empty is dropped and every
    slice's resourceSliceCount follows, so the pool stays complete for the scheduler."""
    if not withdrawn:
        return published
    kept: list[PublishedSlice] = []
    for s in published.slices:
        spec = s.body["spec"]
        if "devices" not in spec:
            kept.append(s)
            continue
        devices = [d for d in spec["devices"] if d["name"] not in withdrawn]
        if not devices:
            continue
        body = copy.deepcopy(s.body)
        body["spec"]["devices"] = devices
        kept.append(PublishedSlice(s.name, body))
    out = []
    for s in kept:
        body = s.body if s.body["spec"]["pool"]["resourceSliceCount"] == len(kept) else copy.deepcopy(s.body)
        body["spec"]["pool"]["resourceSliceCount"] = len(kept)
        out.append(PublishedSlice(s.name, body))
    return replace(published, slices=tuple(out))
