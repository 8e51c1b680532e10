"""python3 -m benchmarks.e2e.backlog [--nodes 10] [--gpus-per-node 8] [--pods 200,500]

How fast the controller works off a backlog of GPU pods on the real control plane: issue 23's "the
controller sustains at least 100 allocations/s", measured where nothing else paces it. A burst from
16 clients (benchmarks/e2e) is paced by the clients and the webhook: the controller allocates each
pod as it comes. Here every node is cordoned first, the claim pods of the burst are created (the
webhook gates them; the controller finds no schedulable node for them and leaves them pending), and
then every node is uncordoned at once: the controller has the whole backlog in front of it.

Reported per backlog: from the uncordon to the first and to the last gate removed, allocations/s over
that span (pods / (last - uncordon)) and sustained (between the first and the last), the p50 / p99
time to the gate's removal, the time until the last pod Runs (kube-scheduler and the kubelet
stand-ins work alongside, as they would), and the controller's CPU seconds. An allocation here is
one pod's claim allocated and reserved (one status write), then its gate removed (one pod patch),
both on the real API server, with the wait for the claim watch's echo between them (docs/architecture.md).
The same 10 nodes x 8 H100-80GB, 1g.10gb claims, as benchmarks/e2e.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from controller.kube.rest import request
from tests.e2e.cluster import ControlPlane, build_binaries
from tests.e2e.scenario import SCENARIO_LABEL, NodeSpec, Scenario

from .__main__ import _options
from .procstats import usage
from .run import _clean, percentile
from .timeline import Timeline
from .workloads import create_burst, wait_for

SETTLE_S = 3.0  # after the last POST: the controller has seen every pod and found no node for it


@dataclass(frozen=True)
class Backlog:
    pods: int
    ungated: int
    first_s: float  # uncordon -> first gate removed
    last_s: float  # uncordon -> last gate removed
    p50_s: float  # uncordon -> gate removed, per pod
    p99_s: float
    running_s: float  # uncordon -> last pod Running
    controller_cpu_s: float
    echo_wait_mean_s: float  # the controller's wait for its claim watch to show each allocation
    uncordon_s: float = float("nan")  # the PATCHes that uncordon every node, one after the other
    released_first_s: float = float("nan")  # uncordon -> the controller's first / last release, from
    released_last_s: float = float("nan")  # its own metrics (polled every 250 ms)

    @property
    def released_per_s(self) -> float:
        """Releases per second between the controller's first and last, as it counts them."""
        span = self.released_last_s - self.released_first_s
        return (self.pods - 1) / span if span > 0 else float("nan")

    @property
    def per_s(self) -> float:
        return self.ungated / self.last_s if self.last_s > 0 else float("nan")

    @property
    def sustained_per_s(self) -> float:
        span = self.last_s - self.first_s
        return (self.ungated - 1) / span if span > 0 else float("nan")


def _histogram(sc: Scenario, name: str) -> tuple[float, float]:
    """(sum, count) of the controller's histogram `name`, from its /metrics."""
    assert sc.controller is not None
    found = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(sc.controller.metrics()):
        if family.name == name:
            for sample in family.samples:
                for part in found:
                    if sample.name.endswith(f"_{part}"):
                        found[part] = sample.value
    return found["sum"], found["count"]


def _echo_wait(sc: Scenario) -> tuple[float, float]:
    return _histogram(sc, "flexmig_controller_gate_echo_wait_seconds")


def _released(sc: Scenario) -> float:
    """Pods the controller has released (gate removed and applied): its allocation latency's count."""
    return _histogram(sc, "flexmig_allocation_latency_seconds")[1]


def _cordon(sc: Scenario, on: bool) -> None:
    for name in sc.nodes:
        body = {"spec": {"unschedulable": on}}
        request(sc.api, "PATCH", f"/api/v1/nodes/{name}", body, content_type="application/merge-patch+json")


def measure_backlog(sc: Scenario, count: int, round_no: int) -> Backlog:
    ns = sc.test_namespace(f"backlog-{round_no}")
    timeline = Timeline(sc.api, ns).start()
    _cordon(sc, True)
    try:
        failed = create_burst(sc.api, ns, "claim", count, {SCENARIO_LABEL: sc.suffix}, timeline)
        if failed:
            raise RuntimeError(f"{len(failed)} of {count} pods not created: {failed[:3]}")
        time.sleep(SETTLE_S)
        early = [n for n, t in timeline.pods.items() if t.ungated is not None]
        if early:
            raise RuntimeError(f"{len(early)} pods were ungated while every node was cordoned: {early[:3]}")
        assert sc.controller is not None
        cpu_before = usage(sc.controller.proc.pid).cpu_s
        echo_before = _echo_wait(sc)
        released_before = _released(sc)
        opened = time.monotonic()
        _cordon(sc, False)
        uncordoned = time.monotonic() - opened
        # The controller's own count of released pods, polled: the timeline's watch decodes every
        # pod event in this process and may fall behind a fast controller.
        seen: dict[str, float] = {}

        def all_released() -> bool:
            done = _released(sc) - released_before
            if done >= 1:
                seen.setdefault("first", time.monotonic() - opened)
            if done >= count:
                seen.setdefault("last", time.monotonic() - opened)
            return done >= count

        def all_ungated() -> bool:
            return sum(1 for t in timeline.pods.values() if t.ungated is not None) >= count

        wait_for(all_released, 60 + count * 0.2, every_s=0.25)
        wait_for(all_ungated, 60 + count * 0.2)
        cpu_s = usage(sc.controller.proc.pid).cpu_s - cpu_before
        echo_sum, echo_count = (a - b for a, b in zip(_echo_wait(sc), echo_before, strict=True))
        wait_for(lambda: timeline.running_count() >= count, 60 + count * 0.5)
    finally:
        _cordon(sc, False)
        timeline.stop()
    gates = sorted(t.ungated - opened for t in timeline.pods.values() if t.ungated is not None)
    runs = [t.running - opened for t in timeline.pods.values() if t.running is not None]
    result = Backlog(
        pods=count,
        ungated=len(gates),
        first_s=gates[0] if gates else float("nan"),
        last_s=gates[-1] if gates else float("nan"),
        p50_s=statistics.median(gates) if gates else float("nan"),
        p99_s=percentile(gates, 0.99),
        running_s=max(runs) if len(runs) == count else float("nan"),
        controller_cpu_s=cpu_s,
        echo_wait_mean_s=echo_sum / echo_count if echo_count else float("nan"),
        uncordon_s=uncordoned,
        released_first_s=seen.get("first", float("nan")),
        released_last_s=seen.get("last", float("nan")),
    )
    _clean(sc, ns)
    return result


HEADER = (
    "| pods | uncordon s | gates removed | first s | last s | allocations/s | sustained/s | gate p50 / p99 s "
    "| last Running s | controller CPU s | echo wait mean ms | controller's first / last release s "
    "| releases/s |\n" + "|---" * 13 + "|"
)


def row(r: Backlog) -> str:
    return (
        f"| {r.pods} | {r.uncordon_s:.2f} | {r.ungated} | {r.first_s:.2f} | {r.last_s:.2f} | {r.per_s:.1f} | {r.sustained_per_s:.1f} "
        f"| {r.p50_s:.2f} / {r.p99_s:.2f} | {r.running_s:.1f} | {r.controller_cpu_s:.1f} "
        f"| {1000 * r.echo_wait_mean_s:.0f} | {r.released_first_s:.2f} / {r.released_last_s:.2f} "
        f"| {r.released_per_s:.1f} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=10, help="simulated nodes, 1..200 (default 10)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="H100-80GB per node, 1..16 (default 8)")
    p.add_argument("--pods", default="200,500", help="backlog sizes, comma-separated (default 200,500)")
    p.add_argument(
        "--write-concurrency", type=int, default=0, help="the controller's, 1..64 (default: its own)"
    )
    args = p.parse_args()
    if not 1 <= args.nodes <= 200 or not 1 <= args.gpus_per_node <= 16:
        raise SystemExit("--nodes: 1..200, --gpus-per-node: 1..16")
    if not 0 <= args.write_concurrency <= 64:
        raise SystemExit("--write-concurrency: 1..64, or 0 for the controller's default")
    try:
        sizes = [int(x) for x in args.pods.split(",") if x]
    except ValueError:
        raise SystemExit(f"--pods: {args.pods!r} is not a comma-separated list of pod counts") from None
    slots = args.nodes * args.gpus_per_node * 7
    if not sizes or min(sizes) < 2 or max(sizes) > slots:
        raise SystemExit(f"--pods: each backlog must be 2..{slots} (7 x 1g.10gb per GPU on these nodes)")
    nodes = [NodeSpec(f"bench{i:03d}", ("H100-80GB",) * args.gpus_per_node) for i in range(args.nodes)]
    options = _options("controller")
    if args.write_concurrency:
        extra = (*options.controller_args, f"--write-concurrency={args.write_concurrency}")
        options = dataclasses.replace(options, controller_args=extra)
    results = []
    print("[backlog] control plane ...", file=sys.stderr)
    with ControlPlane(build_binaries()) as cp, Scenario(cp, nodes, options, release="flexmig-backlog") as sc:
        sc.wait_webhook()
        for n, size in enumerate(sizes, start=1):
            results.append(measure_backlog(sc, size, n))
            print(f"[backlog] {row(results[-1])}", file=sys.stderr)
    print(
        f"\nflexmig controller, backlog of 1g.10gb claim pods released at once: {args.nodes} simulated "
        f"nodes x {args.gpus_per_node} H100-80GB\n"
    )
    print(HEADER)
    for r in results:
        print(row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
