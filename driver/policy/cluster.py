"""A mutable snapshot of every GPU the allocator may use, with cluster-wide capacity kept current."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from driver.catalog.types import MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy.capacity import CapacityModel, CapacityVector, add, request_classes, sub
from driver.policy.model import Choice, GpuRef, GpuState


class ClusterState:
    def __init__(self, gpus: Iterable[GpuState]) -> None:
        self._gpus: dict[GpuRef, GpuState] = {}
        self._by_node: dict[str, list[GpuRef]] = defaultdict(list)
        for gpu in gpus:
            if gpu.ref in self._gpus:
                raise ValueError(f"GPU {gpu.ref} listed twice")
            self._gpus[gpu.ref] = gpu
            self._by_node[gpu.ref.node].append(gpu.ref)
        for refs in self._by_node.values():
            refs.sort(key=lambda r: r.gpu_index)
        self.capacity = CapacityModel(request_classes(g.catalog for g in self._gpus.values()))
        self._vectors: dict[GpuRef, CapacityVector] = {}
        self.total: CapacityVector = (0,) * len(self.capacity.classes)
        for ref, gpu in self._gpus.items():
            vec = self.capacity.vector(gpu.catalog, gpu.occupancy, gpu.whole_gpu_taken)
            self._vectors[ref] = vec
            self.total = add(self.total, vec)

    def gpu(self, ref: GpuRef) -> GpuState:
        return self._gpus[ref]

    def gpus(self) -> list[GpuState]:
        return list(self._gpus.values())

    def nodes(self) -> list[str]:
        return sorted(self._by_node)

    def node_gpus(self, node: str) -> list[GpuState]:
        return [self._gpus[r] for r in self._by_node.get(node, [])]

    def vector(self, ref: GpuRef) -> CapacityVector:
        return self._vectors[ref]

    def set_occupancy(self, ref: GpuRef, occupancy: Occupancy, whole_gpu_taken: bool | None = None) -> None:
        gpu = self._gpus[ref]
        gpu.occupancy = occupancy
        if whole_gpu_taken is not None:
            gpu.whole_gpu_taken = whole_gpu_taken
        new = self.capacity.vector(gpu.catalog, occupancy, gpu.whole_gpu_taken)
        self.total = add(sub(self.total, self._vectors[ref]), new)
        self._vectors[ref] = new

    def commit(self, choices: Iterable[Choice]) -> None:
        for choice in choices:
            gpu = self._gpus[choice.gpu]
            self.set_occupancy(choice.gpu, gpu.occupancy.place(choice.profile, choice.start))

    def release(self, ref: GpuRef, profile: MigProfile, start: int) -> None:
        gpu = self._gpus[ref]
        self.set_occupancy(ref, gpu.occupancy.remove(profile, start))
