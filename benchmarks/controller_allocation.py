"""Controller decision throughput and latency on simulated clusters (no API server, no I/O).

For 10, 100 and 1000 nodes x 8 GPUs (models mixed per node) this publishes every node's slices with the
real slice builder, rebuilds the inventory the way the controller does, then decides pods the way the
allocation loop does (CEL candidates -> policy -> counter check -> ledger), keeping the cluster about
70% full by releasing random earlier pods. Prints decisions/s, p50/p99 decision latency, peak RSS once
the inventory and candidate sets are built ("warm MB") and peak RSS at the end (process-wide, so a
later size includes earlier ones' peaks).

    python benchmarks/controller_allocation.py [--nodes 10,100,1000] [--pods 300] [--policy flexmig]
        [--hami-core]

--hami-core: every node is a hami-core node (8 x 40 GiB shareable GPUs, split 10) and every pod asks
for 1 or 2 shares of MEMORIES MiB (the shared-GPU path: share amounts, share policy, ledger shares).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.constants import DRIVER_NAME
from controller.allocation.decide import Decider
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.policy.allocator import FirstFitPolicy, PackingPolicy
from driver.policy.placer import Placer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "controller"))
from ctl_helpers import CLASSES, claim, node_slices
from shared_helpers import CLASSES as SHARED_CLASSES
from shared_helpers import claim as shared_claim
from shared_helpers import hami_body, shared_slice

MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
MEMORIES = (4000, 9000, 15000, 19000, 30000, 39000, 60000)


def _selector(mib: int) -> str:
    return f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("{mib}Mi")) >= 0'


def build(nodes: int, hami_core: bool = False) -> tuple[Decider, float]:
    started = time.perf_counter()
    slices: list[dict[str, Any]] = []
    template: dict[str, list[dict[str, Any]]] = {}
    for i in range(nodes):
        model = "hami-core" if hami_core else MODELS[i % len(MODELS)]
        name = f"node-{i:04d}"
        # Slices of identical nodes differ only in names; building them once per model keeps setup short.
        if model not in template:
            template[model] = (
                [shared_slice("tmpl", [40960] * 8)] if hami_core else node_slices("tmpl", model, 8)
            )
        for body in template[model]:
            spec = dict(body["spec"], nodeName=name, pool=dict(body["spec"]["pool"], name=name))
            slices.append(
                {**body, "metadata": {"name": body["metadata"]["name"].replace("tmpl", name)}, "spec": spec}
            )
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy()), (
        time.perf_counter() - started
    )


def _pod(name: str, mib: int, count: int, hami_core: bool) -> dict[str, Any]:
    pod: dict[str, Any] = (
        shared_claim(name, exactly=hami_body(memory=mib, count=count))
        if hami_core
        else claim(name, _selector(mib), count=count)
    )
    return pod


def run(nodes: int, pods: int, policy: str, seed: int, fill: float, hami_core: bool) -> dict[str, float]:
    rng = random.Random(seed)
    d, setup_s = build(nodes, hami_core)
    classes = SHARED_CLASSES if hami_core else CLASSES
    if policy == "first-fit":
        d.placer = Placer(FirstFitPolicy())
    capacity_gpus = nodes * 8
    live: list[str] = []
    latencies: list[float] = []
    placed = 0
    # Warm up the per-selector candidate sets (one scan each, cached until slices change).
    warm_started = time.perf_counter()
    for mib in MEMORIES:
        d.index.candidates(tuple(s for s in [f'device.driver == "{DRIVER_NAME}"', _selector(mib)]))
    warm_s = time.perf_counter() - warm_started
    # Peak RSS once inventory and candidate sets are built: what the decisions below add is the rest.
    warm_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Pre-fill (default ~70%) so decisions run against a realistically busy cluster.
    target_live = int(capacity_gpus * fill * 2.5)
    i = 0
    while len(live) < target_live and i < target_live * 2:
        decision = d.decide([_pod(f"fill{i}", rng.choice(MEMORIES), 1, hami_core)], classes)
        for a in decision.allocations:
            d.ledger.assume(a.uid, a.keys)
            live.append(a.uid)
        i += 1
    for k in range(pods):
        count = 2 if rng.random() < 0.15 else 1
        c = _pod(f"p{k}", rng.choice(MEMORIES), count, hami_core)
        t0 = time.perf_counter()
        decision = d.decide([c], classes)
        latencies.append(time.perf_counter() - t0)
        if decision.ok:
            placed += 1
            for a in decision.allocations:
                d.ledger.assume(a.uid, a.keys)
                live.append(a.uid)
        if live and rng.random() < 0.6:
            d.ledger.forget(live.pop(rng.randrange(len(live))))
    latencies.sort()
    return {
        "nodes": nodes,
        "setup_s": setup_s,
        "warm_s": warm_s,
        "decisions_per_s": len(latencies) / sum(latencies),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "placed": placed,
        "warm_rss_mb": warm_rss_mb,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="10,100,1000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=300, help="timed decisions per cluster size")
    parser.add_argument("--policy", default="flexmig", choices=["flexmig", "first-fit"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fill", type=float, default=0.7, help="pre-fill: pods per GPU / 2.5 (0..1)")
    parser.add_argument("--hami-core", action="store_true", help="hami-core nodes and share pods")
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes must be comma-separated integers, got {args.nodes!r}")
    print(
        f"{'nodes':>6} {'GPUs':>6} {'setup s':>8} {'warm s':>7} {'dec/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'placed':>7} {'warm MB':>7} {'RSS MB':>7}"
    )
    for n in sizes:
        r = run(n, args.pods, args.policy, args.seed, args.fill, args.hami_core)
        print(
            f"{n:>6} {n * 8:>6} {r['setup_s']:>8.2f} {r['warm_s']:>7.2f} {r['decisions_per_s']:>8.1f} "
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {int(r['placed']):>7} {r['warm_rss_mb']:>7.0f} {r['rss_mb']:>7.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
