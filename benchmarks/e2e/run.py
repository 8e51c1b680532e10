"""One measured configuration: a burst of pods of one kind, in one mode, at one simulator latency."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.prepare_latency import REALISTIC_DEFAULT_S, REALISTIC_S
from controller.kube.rest import request
from tests.e2e.hook_pods import restart_plugin
from tests.e2e.scenario import SCENARIO_LABEL, Scenario

from .procstats import ProcUsage, usage
from .timeline import Timeline
from .workloads import create_burst, wait_for


@dataclass(frozen=True)
class Result:
    mode: str
    kind: str
    pods: int
    latency: str
    running: int
    failed_posts: int
    pods_per_s: float
    p50: dict[str, float]  # stage -> seconds
    p99: dict[str, float]
    controller: ProcUsage | None  # CPU used during the burst, peak RSS so far
    plugins_cpu_s: float  # all nodes' plugins together
    plugin_peak_rss_mib: float  # the largest plugin
    nvml_calls: dict[str, int]  # per function, all nodes, during the burst (prepares; no deletes yet)
    # A churn round: the measured burst follows an unmeasured one of the same size in the same
    # namespace, deleted just before (its MIG instances idle when the plugin keeps them).
    churn: bool = False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def set_latency(sc: Scenario, realistic: bool, restart: bool = False) -> None:
    """Zero, or the plugin benchmark's assumed per-call latencies (not a measurement: no authoritative
    GI/CI latency is published): GI create 300 ms, CI create 100 ms, destroys 150/50 ms.

    `restart`: restart every plugin afterwards, as a `sim-memory:` plugin reads the file's latencies
    only when it starts (driver/nvml/sim/writeback.py); call it between rounds, with no GPU in use."""
    for node in sc.nodes.values():
        admin = node.nd.admin()
        admin.clear_latency()
        if realistic:
            admin.set_latency(REALISTIC_DEFAULT_S, **REALISTIC_S)
    if restart:
        for node in sc.nodes.values():
            restart_plugin(sc, node, node.nd.metrics_address, node.nd.metrics_port)


def _nvml_calls(sc: Scenario) -> dict[str, int]:
    total: dict[str, int] = {}
    for node in sc.nodes.values():
        for function, n in node.nd.admin().call_counts().items():
            total[function] = total.get(function, 0) + n
    return total


def _pids(sc: Scenario) -> tuple[int | None, list[int]]:
    ctl = sc.controller.proc.pid if sc.controller is not None else None
    plugins = [n.plugin.proc.pid for n in sc.nodes.values() if n.plugin is not None]
    return ctl, plugins


def _warm_burst(sc: Scenario, ns: str, kind: str, count: int) -> None:
    """An unmeasured burst, Running, then deleted (pods and claims) until every pod is gone and no
    GPU instance has a compute instance left: what churn leaves for the measured burst to reuse."""
    timeline = Timeline(sc.api, ns).start()
    try:
        failed = create_burst(sc.api, ns, kind, count, {SCENARIO_LABEL: sc.suffix}, timeline, prefix="w-")
        wait_for(lambda: timeline.running_count() >= count - len(failed), 60 + count * 0.5)
    finally:
        timeline.stop()
    request(sc.api, "DELETE", f"/api/v1/namespaces/{ns}/pods")
    request(sc.api, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")

    def released() -> bool:
        pods: list[Any] = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods").get("items", [])
        return not pods and all(not gi[4] for n in sc.nodes.values() for gi in n.instances())

    if not wait_for(released, 300, 0.5):
        raise RuntimeError(f"churn round {ns}: pods or compute instances left after 300 s")


def measure(
    sc: Scenario, mode: str, kind: str, count: int, realistic: bool, round_no: int, churn: bool = False
) -> Result:
    ns = sc.test_namespace(f"bench-{round_no}")
    if churn:
        _warm_burst(sc, ns, kind, count)
    timeline = Timeline(sc.api, ns).start()
    ctl_pid, plugin_pids = _pids(sc)
    ctl_before = usage(ctl_pid) if ctl_pid else None
    plugins_before = sum(usage(p).cpu_s for p in plugin_pids)
    calls_before = _nvml_calls(sc)
    try:
        failed = create_burst(
            sc.api, ns, kind, count, {SCENARIO_LABEL: sc.suffix}, timeline, prefix="m-" if churn else ""
        )
        expected = count - len(failed)
        wait_for(lambda: timeline.running_count() >= expected, 60 + count * 0.5)
    finally:
        timeline.stop()
    ctl_after = usage(ctl_pid) if ctl_pid else None
    calls_after = _nvml_calls(sc)
    plugin_usages = [usage(p) for p in plugin_pids]
    durations = [d for t in list(timeline.pods.values()) if (d := t.stage_durations()) is not None]
    posted = [t.posted for t in timeline.pods.values() if t.posted is not None]
    running = [t.running for t in timeline.pods.values() if t.running is not None]
    span = (max(running) - min(posted)) if running and posted else float("nan")
    stages = ("admission", "gate", "scheduling", "prepare", "total")
    result = Result(
        mode=mode,
        kind=f"{kind}/churn" if churn else kind,
        pods=count,
        latency="realistic" if realistic else "zero",
        running=len(running),
        failed_posts=len(failed),
        pods_per_s=len(running) / span if span and span > 0 else float("nan"),
        p50={s: statistics.median([d[s] for d in durations]) if durations else float("nan") for s in stages},
        p99={s: percentile([d[s] for d in durations], 0.99) for s in stages},
        controller=ctl_after.minus(ctl_before) if ctl_after and ctl_before else None,
        plugins_cpu_s=sum(u.cpu_s for u in plugin_usages) - plugins_before,
        plugin_peak_rss_mib=max((u.peak_rss_mib for u in plugin_usages), default=0.0),
        nvml_calls={
            f: n - calls_before.get(f, 0) for f, n in calls_after.items() if n > calls_before.get(f, 0)
        },
        churn=churn,
    )
    _clean(sc, ns)
    return result


def _clean(sc: Scenario, ns: str) -> None:
    """Delete the round's namespace and wait until its pods are gone and every GPU instance with them,
    so the next round starts on empty GPUs (idle instances, when kept, expire within the grace period
    plus the plugin's reconcile interval)."""
    request(sc.api, "DELETE", f"/api/v1/namespaces/{ns}")

    def empty() -> bool:
        pods: list[Any] = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods").get("items", [])
        return not pods and all(not n.instances() for n in sc.nodes.values())

    if not wait_for(empty, 300, 1.0):
        raise RuntimeError(f"round {ns}: pods or GPU instances left after 300 s")
    time.sleep(1.0)
