"""Run a pod stream through an allocation policy on simulated GPUs, realising every decision in NVML.

Each simulated node has its own in-memory NVML simulator (the simulator's fast mode: same hardware
rules as the state-file mode, without a file transaction per call), and every placement the policy
picks is created for real through the NVML port (GPU instance at the chosen placement, then a full compute
instance) and destroyed when the pod leaves. So the run proves the decisions are legal on the
simulated hardware, not only in the policy's own model.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST
from driver.catalog.discover import discover_all
from driver.nvml.port import Nvml
from driver.nvml.sim import SimGpuSpec, init_memory_sim, open_sim
from driver.placement.fragmentation import fragmentation
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import Policy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuRef, GpuState
from flexmig.simulation.workload import PodSpec


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    skus: tuple[str, ...]  # one simulator SKU key per GPU


@dataclass(frozen=True, slots=True)
class Realized:
    choice: Choice
    gi_id: int
    ci_id: int


@dataclass(slots=True)
class RunResult:
    policy: str
    pods: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    decision_seconds: list[float] = field(default_factory=list)
    fragmentation_samples: list[float] = field(default_factory=list)
    busy_gpu_samples: list[int] = field(default_factory=list)
    allocated_memory_samples: list[float] = field(default_factory=list)  # share of MIG memory in use
    asked_mib: int = 0  # memory asked by all pods (MiB, every device counted)
    accepted_mib: int = 0  # of which the placed pods'
    asked_by_size: Counter[int] = field(default_factory=Counter)  # pods per memory size (MiB)
    refused_by_size: Counter[int] = field(default_factory=Counter)
    timeline: list[tuple[float, float, float]] = field(
        default_factory=list
    )  # (time, acceptance, memory in use)
    final_map: list[tuple[str, str, int, list[tuple[str, int, int]]]] = field(default_factory=list)
    realized: bool = True  # False for the bound: nothing was created in NVML
    nvml_creates: int = 0
    nvml_destroys: int = 0
    leaked_instances: int = 0  # GPU instances NVML still reports after every pod left (must be 0)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.pods if self.pods else 0.0

    @property
    def memory_acceptance(self) -> float:
        """Share of the asked memory that was placed: big refused pods weigh more than small ones."""
        return self.accepted_mib / self.asked_mib if self.asked_mib else 0.0


class SimulatedCluster:
    """Nodes of simulated GPUs, each behind its own NVML port, as the node agents would see them."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.ports: dict[str, Nvml] = {}
        gpus: list[GpuState] = []
        for node in nodes:
            nvml = open_sim(init_memory_sim([SimGpuSpec(sku=s) for s in node.skus], seed=node.name))
            nvml.init()
            self.ports[node.name] = nvml
            for catalog in discover_all(nvml, DEFAULT_MIG_PROFILE_ALLOWLIST):
                ref = GpuRef(node.name, catalog.gpu.index)
                gpus.append(GpuState(ref, catalog, Occupancy.for_catalog(catalog)))
        self.state = ClusterState(gpus)

    def realize(self, choice: Choice) -> Realized:
        nvml = self.ports[choice.gpu.node]
        gi = nvml.create_gpu_instance(choice.gpu.gpu_index, choice.profile.gi_profile_id, choice.start)
        try:
            ci = nvml.create_compute_instance(choice.gpu.gpu_index, gi.gi_id)
        except Exception:
            nvml.destroy_gpu_instance(choice.gpu.gpu_index, gi.gi_id)
            raise
        return Realized(choice, gi.gi_id, ci.ci_id)

    def destroy(self, realized: Realized) -> None:
        nvml = self.ports[realized.choice.gpu.node]
        index = realized.choice.gpu.gpu_index
        nvml.destroy_compute_instance(index, realized.gi_id, realized.ci_id)
        nvml.destroy_gpu_instance(index, realized.gi_id)

    def count_instances(self) -> int:
        return sum(len(nvml.gpu_instances(gpu.index)) for nvml in self.ports.values() for gpu in nvml.gpus())

    def close(self) -> None:
        for nvml in self.ports.values():
            nvml.shutdown()


def run(
    policy: Policy,
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    *,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    result = RunResult(policy=policy.name)
    cluster = SimulatedCluster(nodes)
    try:
        _run_events(cluster, policy, pods, result, progress)
    finally:
        cluster.close()
    return result


def _run_events(
    cluster: SimulatedCluster,
    policy: Policy,
    pods: Sequence[PodSpec],
    result: RunResult,
    progress: Callable[[str], None] | None,
) -> None:
    departures: list[tuple[float, str]] = []
    running: dict[str, list[Realized]] = {}
    total_mig_memory = sum(g.catalog.memory_slices for g in cluster.state.gpus()) or 1
    step = max(1, len(pods) // 10)
    began_run = time.monotonic()
    for n, pod in enumerate(pods, start=1):
        while departures and departures[0][0] <= pod.arrival:
            _, name = heapq.heappop(departures)
            for done in running.pop(name):
                cluster.destroy(done)
                cluster.state.release(done.choice.gpu, done.choice.profile, done.choice.start)
                result.nvml_destroys += 1
        requests = [DeviceRequest(f"gpu-{d}", pod.memory_mib) for d in range(pod.devices)]
        began = time.perf_counter()
        placement = policy.place(cluster.state, requests)
        result.decision_seconds.append(time.perf_counter() - began)
        result.pods += 1
        result.asked_by_size[pod.memory_mib] += 1
        result.asked_mib += pod.memory_mib * pod.devices
        if placement.ok:
            result.accepted_mib += pod.memory_mib * pod.devices
            realized = [cluster.realize(c) for c in placement.choices]
            result.nvml_creates += len(realized)
            cluster.state.commit(placement.choices)
            running[pod.name] = realized
            heapq.heappush(departures, (pod.arrival + pod.duration, pod.name))
            result.accepted += 1
        else:
            result.rejected[str(placement.reason)] += 1
            result.refused_by_size[pod.memory_mib] += 1
        _sample(cluster.state, result, total_mig_memory)
        result.timeline.append((pod.arrival, result.acceptance, result.allocated_memory_samples[-1]))
        if progress is not None and (n % step == 0 or n == len(pods)):
            progress(
                f"[{policy.name}] {n}/{len(pods)} pods, {result.accepted} placed, "
                f"{time.monotonic() - began_run:.1f} s"
            )
    result.final_map = slice_map(cluster.state)
    # Let every pod leave, then ask NVML itself whether anything is left behind.
    for realized_list in running.values():
        for done in realized_list:
            cluster.destroy(done)
            cluster.state.release(done.choice.gpu, done.choice.profile, done.choice.start)
            result.nvml_destroys += 1
    result.leaked_instances = cluster.count_instances()


def _sample(state: ClusterState, result: RunResult, total_slices: int) -> None:
    busy = [g for g in state.gpus() if not g.occupancy.is_empty]
    result.busy_gpu_samples.append(len(busy))
    used = sum(g.occupancy.used_memory_slices for g in state.gpus())
    result.allocated_memory_samples.append(used / total_slices)
    if busy:
        result.fragmentation_samples.append(sum(fragmentation(g.occupancy) for g in busy) / len(busy))


def slice_map(state: ClusterState) -> list[tuple[str, str, int, list[tuple[str, int, int]]]]:
    """Per GPU: its name, model, memory slices and the instances on it (profile, start, size)."""
    return [
        (
            str(g.ref),
            g.model,
            g.catalog.memory_slices,
            sorted((i.profile.name, i.placement.start, i.placement.size) for i in g.occupancy.instances),
        )
        for g in sorted(state.gpus(), key=lambda g: (g.ref.node, g.ref.gpu_index))
    ]


def memory_slices(nodes: Sequence[NodeSpec]) -> int:
    """MIG memory slices over every GPU of `nodes` (the denominator of "memory in use")."""
    from driver.catalog.simulated import simulated_catalog

    return sum(simulated_catalog(sku).memory_slices for node in nodes for sku in node.skus)


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
