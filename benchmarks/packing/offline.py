"""Offline packing: a multiset of requests, fewest GPUs; each order against the exact optimum (HiGHS)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from driver.catalog.allowlist import default_allowlist_data, parse_allowlist
from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import Policy
from driver.policy.batch import place_batch
from driver.policy.bound import model_groups
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, GpuRef, GpuState

from .mip import fewest_gpus
from .online import MIX


def a100_with_4g() -> GpuCatalog:
    data = default_allowlist_data()
    for entry in data:
        if "A100-SXM4-40GB" in entry["models"]:
            entry["profiles"] = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    return simulated_catalog("A100-40GB", parse_allowlist(data))


CASES: tuple[tuple[str, str], ...] = (
    ("A100-40GB", "A100-40GB"),
    ("A100-40GB, 4g allowlisted", "A100-40GB+4g"),
    ("H100-80GB", "H100-80GB"),
)
ORDERS = ("random", "small-first", "large-first")


def catalog_for(key: str) -> GpuCatalog:
    return a100_with_4g() if key == "A100-40GB+4g" else simulated_catalog(key)


def requests_for(catalog: GpuCatalog, count: int, seed: int) -> list[int]:
    largest = max(p.memory_mib for p in catalog.profiles)
    mix = [(m, w) for m, w in MIX if m <= largest]
    rng = random.Random(f"offline/{catalog.model}/{seed}")
    return rng.choices([m for m, _ in mix], [w for _, w in mix], k=count)


def ordered(sizes: Sequence[int], order: str, seed: int) -> list[int]:
    if order == "small-first":
        return sorted(sizes)
    if order == "large-first":
        return sorted(sizes, reverse=True)
    out = list(sizes)
    random.Random(seed).shuffle(out)
    return out


def _cluster(catalog: GpuCatalog, gpus: int) -> ClusterState:
    return ClusterState(
        GpuState(GpuRef(f"node-{i // 4:03d}", i % 4), catalog, Occupancy.for_catalog(catalog))
        for i in range(gpus)
    )


def gpus_used(policy: Policy, catalog: GpuCatalog, sizes: Sequence[int], together: bool) -> int | None:
    """GPUs holding an instance after placing `sizes` in order (one by one, or as one batch)."""
    cluster = _cluster(catalog, len(sizes))
    pods = [[DeviceRequest("d0", s)] for s in sizes]
    if together:
        placements = place_batch(policy, cluster, pods)
        if not all(p.ok for p in placements):
            return None
        for p in placements:
            cluster.commit(p.choices)
    else:
        for pod in pods:
            placement = policy.place(cluster, pod)
            if not placement.ok:
                return None
            cluster.commit(placement.choices)
    return sum(1 for g in cluster.gpus() if not g.occupancy.is_empty)


@dataclass(frozen=True, slots=True)
class OfflineRow:
    case: str
    policy: str
    order: str
    ratio: float  # mean over seeds of used / optimum


def optimum(catalog: GpuCatalog, sizes: Sequence[int]) -> int:
    best = fewest_gpus(model_groups([catalog] * len(sizes)), sizes)
    assert best is not None
    return best
