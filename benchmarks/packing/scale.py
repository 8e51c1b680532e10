"""Decision latency and memory at scale: the MIG policy directly on 1,000 / 5,000 nodes x 8 GPUs.

Each size runs in its own process (`python -m benchmarks.packing.scale NODES DECISIONS [DEVICES]`) so
its peak RSS is its own. The cluster (models mixed per node) is filled to about 70 % of its GPUs' memory
with random pods, then each timed decision places one pod of DEVICES devices (default 1; each a random
size from SIZES, all on one node) and, to keep the fill level, releases a random earlier pod.
"""

from __future__ import annotations

import json
import random
import resource
import sys
import time

from driver.catalog.simulated import simulated_catalog
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuRef, GpuState

MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
SIZES = (4000, 8000, 16000, 19000, 30000, 39000, 70000)


def measure(nodes: int, decisions: int, devices: int = 1) -> dict[str, float]:
    catalogs = [simulated_catalog(m) for m in MODELS]
    cluster = ClusterState(
        GpuState(GpuRef(f"node-{n:05d}", i), catalogs[n % 4], Occupancy.for_catalog(catalogs[n % 4]))
        for n in range(nodes)
        for i in range(8)
    )
    policy = PackingPolicy()
    rng = random.Random(nodes)
    live: list[tuple[Choice, ...]] = []
    total = sum(g.catalog.memory_slices for g in cluster.gpus())
    used = 0
    while used < 0.7 * total:  # fill directly (first free placement), not timed
        ref = GpuRef(f"node-{rng.randrange(nodes):05d}", rng.randrange(8))
        gpu = cluster.gpu(ref)
        profile = rng.choice(gpu.catalog.profiles[:3])
        free = gpu.occupancy.free_placements(profile)
        if free:
            choice = Choice("fill", ref, profile, free[0].start)
            cluster.commit([choice])
            live.append((choice,))
            used += profile.memory_slices
    times: list[float] = []
    for _ in range(decisions):
        requests = [DeviceRequest(f"d{d}", rng.choice(SIZES)) for d in range(devices)]
        began = time.perf_counter()
        placement = policy.place(cluster, requests)
        times.append(time.perf_counter() - began)
        if placement.ok:
            cluster.commit(placement.choices)
            live.append(placement.choices)
        for c in live.pop(rng.randrange(len(live))):
            cluster.release(c.gpu, c.profile, c.start)
    times.sort()
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "decisions": decisions,
        "devices": devices,
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))],
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


if __name__ == "__main__":
    print(json.dumps(measure(*(int(a) for a in sys.argv[1:4]))))
