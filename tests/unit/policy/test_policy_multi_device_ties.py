"""Multi-device pods on many identical nodes: `PackingPolicy._best_bounded`'s stop within a group.

Nodes of one first-device group are visited by name and the visit stops once (cost bound, least free,
name) is not below the best key found. The bound must hold although nodes of one group differ in their
other GPUs (the second device may land elsewhere on the node), so the clusters here repeat a few GPU
states over many nodes, with some GPUs tighter (less free) on later nodes, and the decisions are
compared with the plain scan of reference_policy.py, hinted pods included.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_policy import ReferencePackingPolicy, decide_alike, release_random, scanned_nodes, twin

from driver.catalog.simulated import simulated_catalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import AllowedTable, DeviceRequest, EndHint, GpuRef, GpuState


def _gpus(rng: random.Random) -> list[GpuState]:
    models = rng.sample(("A100-40GB", "A100-80GB", "H100-80GB"), rng.randint(1, 2))
    per_node = rng.randint(2, 4)
    gpus = []
    for n in range(rng.randint(20, 60)):
        cat = simulated_catalog(models[n % len(models)])
        for i in range(per_node):
            occ = Occupancy.for_catalog(cat)
            # A handful of fills only, so a state recurs on many nodes; smallest profiles packed
            # from the lowest start, so tighter GPUs (less free) share states too.
            for _ in range(rng.choice((0, 0, 1, 2, 3, 5))):
                free = occ.free_placements(cat.profiles[0])
                if free:
                    occ = occ.place(cat.profiles[0], free[0].start)
            gpus.append(GpuState(GpuRef(f"node-{n:03d}", i), cat, occ))
    return gpus


def _requests(rng: random.Random, gpus: list[GpuState], now: float) -> list[DeviceRequest]:
    sizes = sorted({p.memory_mib for g in gpus for p in g.catalog.profiles[:4]})
    filt = None
    if rng.random() < 0.2:
        table = {
            g.ref: frozenset((p.name, pl.start) for p in g.catalog.profiles for pl in p.placements)
            for g in gpus
        }
        filt = AllowedTable(table, None)
    hint = None
    if rng.random() < 0.3:
        end = now + rng.choice((5.0, 20.0, 80.0))
        hint = EndHint(end, end - now)
    return [
        DeviceRequest(f"r{k}", rng.choice(sizes), None, None, frozenset(), filt, end_hint=hint)
        for k in range(rng.choice((2, 2, 3)))
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_multi_device_pods_on_identical_nodes_decide_like_the_plain_scan(seed: int) -> None:
    rng = random.Random(seed)
    gpus = _gpus(rng)
    fast_cluster, ref_cluster = twin(gpus)
    fast, ref = PackingPolicy(hint_weight=0.3), ReferencePackingPolicy(hint_weight=0.3)
    now = 0.0
    for _ in range(12):
        now += 5.0
        requests = _requests(rng, gpus, now)
        decide_alike(fast, ref, fast_cluster, ref_cluster, requests)
        if rng.random() < 0.5:
            release_random(rng, gpus, fast_cluster, ref_cluster)


def test_identical_empty_nodes_stop_after_the_first_by_name() -> None:
    """On empty identical nodes the first node's key meets the bound (cost, least free, name), so the
    search prices that node only, and picks it, as the plain scan does."""
    cat = simulated_catalog("A100-80GB")
    gpus = [
        GpuState(GpuRef(f"node-{n:03d}", i), cat, Occupancy.for_catalog(cat))
        for n in range(50)
        for i in range(4)
    ]
    requests = [DeviceRequest("a", 20000), DeviceRequest("b", 10000)]
    with scanned_nodes() as priced:
        got = PackingPolicy().place(ClusterState(gpus), requests)
    assert got == ReferencePackingPolicy().place(ClusterState(dataclasses.replace(g) for g in gpus), requests)
    assert {c.gpu.node for c in got.choices} == {"node-000"}
    assert priced == ["node-000"]
