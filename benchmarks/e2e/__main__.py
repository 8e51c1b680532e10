"""python3 -m benchmarks.e2e [--nodes 10] [--gpus-per-node 8] [--pods 50,200] [--kinds legacy,claim,nogpu]
[--modes controller,scheduler] [--latency zero,realistic] [--idle-grace 0,30] [--churn] [--sim memory]
[--real-node]

Prints one row per configuration: pods Running, pods/s over the burst (first POST to last Running),
created -> Running latency p50/p99 and the p99 of each stage (admission, gate removal, scheduling,
prepare), CPU seconds of the controller and of the plugins per 1,000 pods, and peak RSS. Then what
flexmig adds: a GPU kind's p99 minus the no-GPU pods' p99 in the same mode, latency and burst size.
See benchmarks/e2e/__init__.py for what runs; results are kept in benchmarks/RESULTS.md.

`--idle-grace` installs flexmig once per value with the plugin keeping idle MIG instances that many
seconds (0 = off; the mode column then reads e.g. `controller+idle30s`), and `--churn` adds, per GPU
kind, a round whose measured burst follows an unmeasured one deleted just before (kind `claim/churn`):
with a grace period its pods land on the idle instances the first burst left (reuse), without one on
freshly created instances. Compare the churn rows of `--idle-grace 0,30`.

`--control-plane-qps N` raises kube-scheduler's and kube-controller-manager's client rate limits (N
requests/s, burst 2N; defaults 50 and 20). At the defaults a burst of DRA pods queues in those two
clients, not in flexmig: kube-controller-manager creates each template's claim and records it on the
pod (2 requests), kube-scheduler binds, posts an event and, for every pod with claims, patches
nominatedNodeName before PreBind (3). Raising them shows what flexmig itself adds.

`--sim memory` (the default) runs the plugins on `sim-memory:` (state loaded once, per-GPU locks,
changes written back to the file: per-call cost closer to hardware's); `--sim file` on the e2e tests'
file-backed `sim:`, where every NVML call is a locked rewrite of the node's state file and the prepare
stage mostly measures the simulator. In memory mode the NVML call counts per pod are those written back
with the last change on each node, so the read-only calls after a node's last change are missing.

`--real-node` runs the same matrix on ONE real node instead of the stand-ins (`--nodes` is ignored; the
node has `--gpus-per-node` simulated H100-80GB, at most 109 pods a burst: the kubelet's maxPods less the
plugin's anchor pod): a real kubelet, containerd and runc (tests/e2e/realnode, built once and cached
under ~/.cache/flexmig; needs root), the plugin registered through the kubelet's plugin watcher, the
kubelet calling NodePrepareResources itself, containerd injecting the plugin's CDI devices, and every
pod really running a container (the e2e tests' busybox image, imported, never pulled; it sleeps until
stopped). What is stood in: the GPUs (the NVML simulator) and their device nodes (character devices with
/dev/null's numbers), the driver's /proc and files, and the plugin's pod (a local process): see
tests/e2e/realnode/scenario.py. The prepare stage (bound -> Running) then includes the kubelet's pod
worker, the sandbox and the container start by containerd + runc, which no-GPU pods pay too: the
"added by flexmig" lines are what flexmig adds. A last section splits the node's share: CPU of the
kubelet, containerd and its shims, and the plugin's own mean time per prepared claim. Then the pods
whose first PrepareDynamicResources failed (the kubelet's FailedPrepareDynamicResources events, e.g. its
claim read refused while the API server's node authorizer has not yet seen the pod bound): the kubelet
retries those only at its next periodic sync of the pod, 60-90 s later (kubernetes/kubernetes#139836),
so a burst's p99 is either a few seconds or over a minute; the p99 of the other pods is printed too.
Legacy pods ask for 10000 MiB, more than an H100-80GB's 1g.10gb (9984 MiB): the controller gives each a
2g.20gb, 3 a GPU, which bounds a legacy burst here (24 pods on the default 8 GPUs; `--gpus-per-node 16`:
48).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from tests.e2e.cluster import ControlPlane, build_binaries
from tests.e2e.realnode.node import NodeBinaries
from tests.e2e.scenario import NodeSpec, Scenario, ScenarioOptions

from .realnode import MAX_PODS, BenchRealNodeScenario, node_binaries
from .run import Result, measure, set_latency
from .workloads import KINDS, LEGACY_MIB

MODES = ("controller", "scheduler")
# Pods each stand-in kubelet prepares at once: kubelet works on every pod in its own goroutine; one
# thread per node (the tests' setting) made a node's prepares queue behind each other's round trips.
POD_WORKERS = 16
LATENCIES = ("zero", "realistic")
# Legacy pods that fit one H100-80GB: 10000 MiB is more than a 1g.10gb (9984 MiB), so the controller
# gives each a 2g.20gb, 3 a GPU (a 30-pod burst on 8 GPUs left 6 pods unplaced).
LEGACY_PER_GPU = 3


def _list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"{flag}: {','.join(bad) or text!r} not allowed; allowed: {', '.join(allowed)}")
    return items


def _options(
    mode: str, idle_grace_s: float = 0.0, fast_reconcile: bool = False, sim: str = "memory"
) -> ScenarioOptions:
    extra: tuple[str, ...] = ()
    if idle_grace_s > 0:
        extra += ("--set", f"kubeletPlugin.idleInstances.gracePeriodSeconds={idle_grace_s:g}")
    if fast_reconcile:
        # Idle instances expire at the first reconcile pass after their grace period: a short interval
        # lets the next round start on empty GPUs soon. Given to every install of a run that keeps
        # idle instances, so the rows with and without reuse differ in nothing else.
        extra += ("--set-json", 'kubeletPlugin.extraArgs=["--reconcile-interval=2"]')
    backend = "sim-memory" if sim == "memory" else "sim"
    if mode == "controller":
        return ScenarioOptions(
            webhook=True, extra_values=extra, nvml_backend=backend, pod_workers=POD_WORKERS
        )
    return ScenarioOptions(
        start_controller=False,
        extra_values=("--set", "allocationMode=scheduler", *extra),
        nvml_backend=backend,
        pod_workers=POD_WORKERS,
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def _row(r: Result) -> str:
    per_k = 1000 / max(1, r.running)
    ctl = f"{r.controller.cpu_s * per_k:.1f}" if r.controller else "-"
    ctl_rss = f"{r.controller.peak_rss_mib:.0f}" if r.controller else "-"
    return (
        f"| {r.mode} | {r.latency} | {r.kind} | {r.pods} | {r.running} | {r.pods_per_s:.1f} "
        f"| {_ms(r.p50['total'])} / {_ms(r.p99['total'])} | {_ms(r.p99['admission'])} | {_ms(r.p99['gate'])} "
        f"| {_ms(r.p99['scheduling'])} | {_ms(r.p99['prepare'])} | {ctl} | {ctl_rss} "
        f"| {r.plugins_cpu_s * per_k:.1f} | {r.plugin_peak_rss_mib:.0f} |"
    )


HEADER = (
    "| mode | NVML latency | kind | pods | running | pods/s | total p50 / p99 ms | admission p99 | gate p99 "
    "| scheduling p99 | prepare p99 | controller CPU s /1k pods | controller peak RSS MiB "
    "| plugins CPU s /1k pods | plugin peak RSS MiB |\n" + "|---" * 15 + "|"
)


def _real_node_report(results: list[Result]) -> None:
    print(
        "\nthe real node during each burst: CPU seconds per 1,000 pods of the kubelet, containerd and its"
        " runc shims (children included), and the plugin's own mean time per prepared claim:"
    )
    for r in results:
        per_k = 1000 / max(1, r.running)
        cpu = ", ".join(f"{k} {v * per_k:.1f}" for k, v in r.node_cpu_s.items())
        seconds, claims = r.plugin_prepare
        mean = f"{seconds / claims * 1000:.0f} ms over {claims} claims" if claims else "no claims"
        print(f"  {r.mode:10} {r.latency:9} {r.kind:6} {r.pods:5} pods: {cpu}; plugin prepare {mean}")
    failed = [r for r in results if r.failed_prepares]
    if failed:
        print(
            "\npods whose first PrepareDynamicResources failed (the kubelet retries at its next periodic"
            " sync of the pod, 60-90 s later: kubernetes/kubernetes#139836), and the p99 of the others:"
        )
    base = {(r.mode, r.latency, r.pods): r for r in results if r.kind == "nogpu"}
    for r in failed:
        b = base.get((r.mode, r.latency, r.pods))
        added = f", minus no-GPU p99 {_ms(r.p99_unretried['total'] - b.p99['total'])}" if b else ""
        last = next(iter(r.failed_prepares.values()))[-160:]
        print(
            f"  {r.mode:10} {r.latency:9} {r.kind:6} {r.pods:5} pods: {len(r.failed_prepares)} retried;"
            f" the others' total p99 {_ms(r.p99_unretried['total'])} ms (prepare"
            f" {_ms(r.p99_unretried['prepare'])}){added}; first error: ...{last}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--pods", default="50,200")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--latency", default=",".join(LATENCIES))
    p.add_argument("--idle-grace", default="0", help="idle-instance grace periods (s), one install each")
    p.add_argument("--churn", action="store_true", help="add a churn round per GPU kind (see above)")
    p.add_argument("--sim", choices=("memory", "file"), default="memory", help="plugin simulator (see above)")
    p.add_argument(
        "--control-plane-qps",
        type=int,
        default=0,
        help="kube-scheduler's and kube-controller-manager's client rate limit, requests/s (burst twice "
        "that); 0: their defaults (50 and 20). See above",
    )
    p.add_argument(
        "--real-node", action="store_true", help="one real kubelet + containerd + runc node (see above)"
    )
    args = p.parse_args()
    kinds = _list(args.kinds, KINDS, "--kinds")
    modes = _list(args.modes, MODES, "--modes")
    latencies = _list(args.latency, LATENCIES, "--latency")
    try:
        sizes = [int(x) for x in args.pods.split(",") if x]
    except ValueError:
        raise SystemExit(f"--pods: {args.pods!r} is not a comma-separated list of pod counts") from None
    try:
        graces = [float(x) for x in args.idle_grace.split(",") if x]
    except ValueError:
        raise SystemExit(
            f"--idle-grace: {args.idle_grace!r} is not a comma-separated list of seconds"
        ) from None
    if not graces or min(graces) < 0 or max(graces) > 3600:
        raise SystemExit("--idle-grace: each value 0..3600 seconds")
    if args.real_node:
        args.nodes = 1
    slots = args.nodes * args.gpus_per_node * 7
    if args.real_node and slots > MAX_PODS:
        slots = MAX_PODS  # the kubelet's maxPods
    if not sizes or min(sizes) < 1 or max(sizes) > slots:
        raise SystemExit(
            f"--pods: each burst must be 1..{slots} (7 x 1g.10gb per GPU on these nodes"
            + (f", {MAX_PODS} pods on a real node)" if args.real_node else ")")
        )
    legacy_slots = args.nodes * args.gpus_per_node * LEGACY_PER_GPU
    if args.real_node and "legacy" in kinds and max(sizes) > legacy_slots:
        raise SystemExit(
            f"--pods: at most {legacy_slots} legacy pods on this node: each asks for {LEGACY_MIB} MiB, more"
            f" than 1g.10gb's 9984 MiB on H100-80GB, and gets a 2g.20gb ({LEGACY_PER_GPU} per GPU)"
        )
    if not 0 <= args.control_plane_qps <= 10_000:
        raise SystemExit("--control-plane-qps: 0 (the components' defaults) to 10000 requests/s")
    if not 1 <= args.nodes <= 200 or not 1 <= args.gpus_per_node <= 16:
        raise SystemExit("--nodes: 1..200, --gpus-per-node: 1..16")

    nodes = [NodeSpec(f"bench{i:03d}", ("H100-80GB",) * args.gpus_per_node) for i in range(args.nodes)]
    bins: NodeBinaries | None = None
    if args.real_node:
        bins = node_binaries()  # root and the binaries first: a one-line error before anything starts
        nodes = [NodeSpec("real-bench", ("H100-80GB",) * args.gpus_per_node)]
    results: list[Result] = []
    t0 = time.monotonic()
    print("[e2e-bench] control plane ...", file=sys.stderr)
    with ControlPlane(build_binaries(), client_qps=args.control_plane_qps or None) as cp:
        round_no = 0
        for mode, grace in [(m, g) for m in modes for g in graces]:
            label = f"{mode}+idle{grace:g}s" if grace > 0 else mode
            where = "real node" if bins is not None else "nodes"
            print(
                f"[e2e-bench] {label}: {args.nodes} {where} x {args.gpus_per_node} H100-80GB",
                file=sys.stderr,
            )
            release = f"flexmig-{mode[:5]}" + (f"-i{round(grace)}" if grace > 0 else "")
            options = _options(mode, grace, fast_reconcile=max(graces) > 0, sim=args.sim)
            scenario = (
                Scenario(cp, nodes, options, release=release)
                if bins is None
                else BenchRealNodeScenario(cp, bins, nodes, options)
            )
            with scenario as sc:
                if mode == "controller":
                    sc.wait_webhook()
                for i, latency in enumerate(latencies):
                    # A sim-memory plugin loaded the file's (zero) latencies when it started.
                    restart = args.sim == "memory" and (i > 0 or latency == "realistic")
                    set_latency(sc, latency == "realistic", restart=restart)
                    for size in sizes:
                        for kind, churn in [(k, c) for k in kinds for c in (False, True)]:
                            if kind == "legacy" and mode == "scheduler":
                                continue  # no webhook in scheduler mode: legacy limits are not served
                            if churn and (not args.churn or kind == "nogpu"):
                                continue
                            round_no += 1
                            r = measure(sc, label, kind, size, latency == "realistic", round_no, churn)
                            results.append(r)
                            print(f"[e2e-bench] {time.monotonic() - t0:6.0f}s {_row(r)}", file=sys.stderr)
    where = (
        "ONE real node (kubelet + containerd + runc; pods run a busybox container) with"
        if bins is not None
        else f"{args.nodes} simulated nodes x"
    )
    print(
        f"\nflexmig end to end: {where} {args.gpus_per_node} H100-80GB "
        f"({args.sim} simulator), 1g.10gb-sized pods, bursts from 16 concurrent clients\n"
    )
    print(HEADER)
    for r in results:
        print(_row(r))
    print("\nadded by flexmig (p99 of the GPU kind minus p99 of no-GPU pods, same mode/latency/size):")
    base = {(r.mode, r.latency, r.pods): r for r in results if r.kind == "nogpu"}
    for r in results:
        b = base.get((r.mode, r.latency, r.pods))
        if r.kind != "nogpu" and b is not None:
            print(
                f"  {r.mode:10} {r.latency:9} {r.kind:6} {r.pods:5} pods: "
                f"{_ms(r.p99['total'] - b.p99['total'])} ms"
            )
    print("\nNVML calls per running pod during the burst (all nodes; the top five functions):")
    for r in results:
        if r.kind != "nogpu" and r.running:
            top = sorted(r.nvml_calls.items(), key=lambda kv: -kv[1])[:5]
            per_pod = sum(r.nvml_calls.values()) / r.running
            detail = ", ".join(f"{f.removeprefix('nvml')} {n / r.running:.1f}" for f, n in top)
            creates = r.nvml_calls.get("nvmlDeviceCreateGpuInstanceWithPlacement", 0)
            print(
                f"  {r.mode:10} {r.latency:9} {r.kind:6} {r.pods:5} pods: {per_pod:.1f} ({detail});"
                f" GPU instances created: {creates}"  # fewer than pods: idle instances reused
            )
    if bins is not None:
        _real_node_report(results)
    incomplete = [r for r in results if r.running < r.pods]
    for r in incomplete:
        print(f"INCOMPLETE: {r.mode}/{r.latency}/{r.kind}/{r.pods}: {r.running} running", file=sys.stderr)
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
