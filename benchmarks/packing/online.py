"""Online packing: seeded pod streams on an in-memory cluster, each policy beside the repacking bound.

No NVML here (`flexmig simulate` realises every placement in the simulator; this measures many more
pods): each policy places pods on a `ClusterState` and commits them, pods leave after their lifetime.
Statistics skip the first `warmup` share of pods (the cluster starts empty).
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import Policy
from driver.policy.bound import RepackingBound, model_groups
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, GpuRef, GpuState

from .mip import MipProgram

MIX: tuple[tuple[int, float], ...] = (
    (4000, 0.30),
    (8000, 0.25),
    (16000, 0.15),
    (19000, 0.10),
    (30000, 0.08),
    (39000, 0.07),
    (70000, 0.05),
)
INFERENCE_MIX: tuple[tuple[int, float], ...] = ((4000, 0.45), (8000, 0.30), (16000, 0.15), (19000, 0.10))
MEAN_LIFETIME = 40.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    models: tuple[str, ...]  # one per node (4 GPUs each), round-robin
    nodes: int
    mix: tuple[tuple[int, float], ...] = MIX
    two_device_share: float = 0.0


SCENARIOS = (
    Scenario("single-8 (A100-40GB x 8)", ("A100-40GB",), 2),
    Scenario("single-64 (A100-40GB x 64)", ("A100-40GB",), 16),
    Scenario("two-device 10% (A100-40GB x 16)", ("A100-40GB",), 4, two_device_share=0.1),
    Scenario("inference-heavy (A100-40GB x 16)", ("A100-40GB",), 4, mix=INFERENCE_MIX),
    Scenario(
        "mixed (A100-40GB, H100-80GB, A100-80GB, H200) x 4",
        ("A100-40GB", "H100-80GB", "A100-80GB", "H200-141GB"),
        4,
    ),
)


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    arrival: float
    lifetime: float
    sizes: tuple[int, ...]  # MiB per device


def catalogs_of(scenario: Scenario) -> list[tuple[str, list[GpuCatalog]]]:
    return [
        (f"node-{i:03d}", [simulated_catalog(scenario.models[i % len(scenario.models)])] * 4)
        for i in range(scenario.nodes)
    ]


def servable_mix(scenario: Scenario) -> tuple[tuple[int, float], ...]:
    """The mix without sizes no GPU of the cluster can serve (they would only measure the catalog)."""
    largest = max(p.memory_mib for _, cats in catalogs_of(scenario) for c in cats for p in c.profiles)
    return tuple((m, w) for m, w in scenario.mix if m <= largest)


def generate(scenario: Scenario, load: float, pods: int, seed: int) -> list[Pod]:
    """Poisson arrivals, exponential lifetimes; `load` = offered MiB x time / cluster MIG MiB."""
    mix = servable_mix(scenario)
    total_mib = sum(c.gpu.memory_total_mib for _, cats in catalogs_of(scenario) for c in cats)
    mean_mib = sum(m * w for m, w in mix) / sum(w for _, w in mix)
    mean_devices = 1 + scenario.two_device_share
    rate = load * total_mib / (MEAN_LIFETIME * mean_mib * mean_devices)
    rng = random.Random(f"{scenario.name}/{load}/{seed}")
    sizes = [m for m, _ in mix]
    weights = [w for _, w in mix]
    out: list[Pod] = []
    now = 0.0
    for i in range(pods):
        now += rng.expovariate(rate)
        size = rng.choices(sizes, weights)[0]
        devices = 2 if rng.random() < scenario.two_device_share else 1
        out.append(Pod(f"pod-{i:05d}", now, rng.expovariate(1.0 / MEAN_LIFETIME), (size,) * devices))
    return out


@dataclass(slots=True)
class Outcome:
    policy: str
    pods: int = 0
    accepted: int = 0
    mib_asked: int = 0
    mib_accepted: int = 0
    refused_by_size: Counter[int] = field(default_factory=Counter)
    asked_by_size: Counter[int] = field(default_factory=Counter)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.pods if self.pods else 0.0

    @property
    def weighted(self) -> float:
        return self.mib_accepted / self.mib_asked if self.mib_asked else 0.0

    def add(self, other: Outcome) -> None:
        self.pods += other.pods
        self.accepted += other.accepted
        self.mib_asked += other.mib_asked
        self.mib_accepted += other.mib_accepted
        self.refused_by_size.update(other.refused_by_size)
        self.asked_by_size.update(other.asked_by_size)


def build_cluster(scenario: Scenario) -> ClusterState:
    return ClusterState(
        GpuState(GpuRef(node, i), cat, Occupancy.for_catalog(cat))
        for node, cats in catalogs_of(scenario)
        for i, cat in enumerate(cats)
    )


Admit = Callable[[Pod], object]  # returns a token to release later, or None when refused


def stream(
    pods: Sequence[Pod], admit: Admit, release: Callable[[object], None], name: str, warmup: float
) -> Outcome:
    out = Outcome(name)
    leaving: list[tuple[float, int, object]] = []
    skip = int(len(pods) * warmup)
    for n, pod in enumerate(pods):
        while leaving and leaving[0][0] <= pod.arrival:
            release(heapq.heappop(leaving)[2])
        token = admit(pod)
        if token is not None:
            heapq.heappush(leaving, (pod.arrival + pod.lifetime, n, token))
        if n < skip:
            continue
        mib = sum(pod.sizes)
        out.pods += 1
        out.mib_asked += mib
        out.asked_by_size[pod.sizes[0]] += 1
        if token is not None:
            out.accepted += 1
            out.mib_accepted += mib
        else:
            out.refused_by_size[pod.sizes[0]] += 1
    return out


def run_policy(policy: Policy, scenario: Scenario, pods: Sequence[Pod], warmup: float = 0.2) -> Outcome:
    cluster = build_cluster(scenario)

    def admit(pod: Pod) -> object:
        requests = [DeviceRequest(f"d{i}", s) for i, s in enumerate(pod.sizes)]
        placement = policy.place(cluster, requests)
        if not placement.ok:
            return None
        cluster.commit(placement.choices)
        return placement.choices

    def release(token: object) -> None:
        for c in token:  # type: ignore[attr-defined]
            cluster.release(c.gpu, c.profile, c.start)

    return stream(pods, admit, release, policy.name, warmup)


def run_bound(scenario: Scenario, pods: Sequence[Pod], warmup: float = 0.2) -> Outcome:
    catalogs = [c for _, cats in catalogs_of(scenario) for c in cats]
    bound = RepackingBound(catalogs, MipProgram(model_groups(catalogs)))

    def admit(pod: Pod) -> object:
        return pod.name if bound.admit(pod.name, pod.sizes) else None

    def release(token: object) -> None:
        bound.release(str(token))

    return stream(pods, admit, release, bound.name, warmup)
