"""Prepare/unprepare round-trip latency through kubelet's gRPC socket, at 1, 10 and 100 concurrent claims.

    python benchmarks/prepare_latency_e2e.py [--rounds-1 20] [--rounds-10 5] [--rounds-100 2]

The plugin's own cost, without the API server and gRPC, is measured by benchmarks/prepare_latency.py.

What runs: a real control plane (tests/e2e/cluster.py's ControlPlane; binaries built or taken from the
cache by tests/e2e/k8sbuild/build.sh, or FLEXMIG_K8S_BIN), and `flexmig kubeletplugin` as a separate
process on the NVML simulator with 16 A100-40GB GPUs in MIG mode and simulator latency zero. 100
claims, each allocated one 1g.5gb device, with a pod reserving each, are created up front. A round
sends N NodePrepareResources calls at once (one claim each, as kubelet does for N pods starting
together) over the plugin's unix socket, then N NodeUnprepareResources calls; every call's round trip
is measured on the client side. Latency covers everything the plugin does per claim: claim GET, NVML
(GI + CI create / destroy, each a locked transaction on the simulator's state file), CDI spec write,
checkpoint writes (fsynced), claim status and pod annotation writes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from driver.nvml.sim import SimGpuSpec  # noqa: E402
from tests.e2e.cluster import ControlPlane, build_binaries  # noqa: E402
from tests.e2e.k8sobjects import create_namespace, create_ready_node  # noqa: E402
from tests.e2e.plugin_harness import (  # noqa: E402
    ClaimFactory,
    Kubelet,
    NodeDir,
    PluginProcess,
    ensure_device_class,
    heartbeats,
    instances,
)

NODE = "bench-node"
NS = "bench"
GPUS = 16
CLAIMS = 100
# Far above kubelet's 45 s: the benchmark measures queueing at 100 claims instead of failing on it.
CALL_TIMEOUT_S = 600.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds-1", type=int, default=20)
    parser.add_argument("--rounds-10", type=int, default=5)
    parser.add_argument("--rounds-100", type=int, default=2)
    args = parser.parse_args()
    rounds = {1: args.rounds_1, 10: args.rounds_10, 100: args.rounds_100}

    print("starting control plane ...", file=sys.stderr)
    with ControlPlane(build_binaries()) as cp:
        api = cp.api_client()
        create_ready_node(api, NODE)
        create_namespace(api, NS)
        ensure_device_class(api)
        nd = NodeDir.create(NODE, cp.kubeconfig, [SimGpuSpec("A100-40GB") for _ in range(GPUS)])
        factory = ClaimFactory(api, NS)
        claims = [
            factory.create(f"c{i}", NODE, [f"gpu-{i // 7}-mig-1g5gb-19-{i % 7}"]) for i in range(CLAIMS)
        ]
        plugin = PluginProcess(nd).wait_ready()
        kubelet = Kubelet(nd)
        kubelet.register()
        results: dict[int, tuple[list[float], list[float]]] = {}
        errors: list[str] = []
        lock = threading.Lock()

        def prepare(c: dict[str, str]) -> None:
            r = kubelet.prepare([c], timeout_s=CALL_TIMEOUT_S)[c["uid"]]
            if r.error:
                with lock:
                    errors.append(r.error)

        def unprepare(c: dict[str, str]) -> None:
            e = kubelet.unprepare([c], timeout_s=CALL_TIMEOUT_S)[c["uid"]]
            if e:
                with lock:
                    errors.append(e)

        try:
            with heartbeats(api, lambda: [NODE]), ThreadPoolExecutor(max_workers=CLAIMS) as pool:
                prepare(claims[0])  # warm-up: first-call costs (connections, imports) are not latency
                unprepare(claims[0])
                for n, count in rounds.items():
                    prep: list[float] = []
                    unprep: list[float] = []
                    batch = claims[:n]
                    for _ in range(count):
                        prep += list(pool.map(lambda c: _timed(lambda: prepare(c)), batch))
                        if len(instances(nd)) != n:
                            errors.append(f"expected {n} instances after prepare, found {len(instances(nd))}")
                        unprep += list(pool.map(lambda c: _timed(lambda: unprepare(c)), batch))
                    results[n] = (prep, unprep)
                    print(f"  {n} concurrent: done", file=sys.stderr)
        finally:
            kubelet.close()
            plugin.stop()
            nd.cleanup()

    print(f"\nprepare/unprepare round trip, {GPUS}x A100-40GB simulated, simulator latency 0")
    print(
        f"{'concurrent':>10} {'calls':>6} {'prep p50':>10} {'prep p99':>10} {'unprep p50':>11} {'unprep p99':>11}"
    )
    for n, (prep, unprep) in results.items():
        if not prep:
            continue
        print(
            f"{n:>10} {len(prep):>6} {statistics.median(prep) * 1000:>8.1f}ms {_percentile(prep, 0.99) * 1000:>8.1f}ms"
            f" {statistics.median(unprep) * 1000:>9.1f}ms {_percentile(unprep, 0.99) * 1000:>9.1f}ms"
        )
    if errors:
        print(f"\n{len(errors)} errors, first: {errors[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
