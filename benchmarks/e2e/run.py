"""One measured configuration: a burst of pods of one kind, in one mode, at one simulator latency.

On stand-in nodes (`Scenario`) or on the real node (realnode.py's `BenchRealNodeScenario`): the nodes,
where the pods go and what they run come from realnode.py's `nodes_of` and `node_selector`."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.prepare_latency import REALISTIC_DEFAULT_S, REALISTIC_S
from controller.kube.rest import request
from tests.e2e.hook_pods import restart_plugin
from tests.e2e.realnode.scenario import RealNodeScenario
from tests.e2e.scenario import Scenario, SimNode

from .procstats import ProcUsage, usage
from .realnode import (
    BenchRealNodeScenario,
    failed_prepares,
    node_cpu,
    node_selector,
    nodes_of,
    plugin_prepare,
    restart_plugins,
)
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
    # The real node only: CPU seconds of its kubelet, containerd and shims during the burst, and the
    # plugin's own prepare time (seconds, claims) during it.
    node_cpu_s: dict[str, float] = field(default_factory=dict)
    plugin_prepare: tuple[float, int] = (0.0, 0)
    # The real node only: pod -> the kubelet's first FailedPrepareDynamicResources message.
    failed_prepares: dict[str, str] = field(default_factory=dict)
    # p99 per stage over the pods NOT in failed_prepares (empty when no pod was retried): without the
    # kubelet's 60-90 s retry.
    p99_unretried: dict[str, float] = field(default_factory=dict)


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
    for node in nodes_of(sc):
        admin = node.nd.admin()
        admin.clear_latency()
        if realistic:
            admin.set_latency(REALISTIC_DEFAULT_S, **REALISTIC_S)
    if restart and isinstance(sc, BenchRealNodeScenario):
        restart_plugins(sc)
    elif restart:
        for stand_in in nodes_of(sc):
            assert isinstance(stand_in, SimNode)
            restart_plugin(sc, stand_in, stand_in.nd.metrics_address, stand_in.nd.metrics_port)


def _nvml_calls(sc: Scenario) -> dict[str, int]:
    total: dict[str, int] = {}
    for node in nodes_of(sc):
        for function, n in node.nd.admin().call_counts().items():
            total[function] = total.get(function, 0) + n
    return total


def _pids(sc: Scenario) -> tuple[int | None, list[int]]:
    ctl = sc.controller.proc.pid if sc.controller is not None else None
    plugins = [n.plugin.proc.pid for n in nodes_of(sc) if n.plugin is not None]
    return ctl, plugins


def _warm_burst(sc: Scenario, ns: str, kind: str, count: int) -> None:
    """An unmeasured burst, Running, then deleted (pods and claims) until every pod is gone and no
    GPU instance has a compute instance left: what churn leaves for the measured burst to reuse."""
    timeline = Timeline(sc.api, ns).start()
    try:
        real = isinstance(sc, RealNodeScenario)
        failed = create_burst(sc.api, ns, kind, count, node_selector(sc), timeline, prefix="w-", real=real)
        wait_for(lambda: timeline.running_count() >= count - len(failed), _timeout_s(sc, count))
    finally:
        timeline.stop()
    request(sc.api, "DELETE", f"/api/v1/namespaces/{ns}/pods")
    request(sc.api, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")

    def released() -> bool:
        pods: list[Any] = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods").get("items", [])
        return not pods and all(not gi[4] for n in nodes_of(sc) for gi in n.instances())

    if not wait_for(released, 300, 0.5):
        raise RuntimeError(f"churn round {ns}: pods or compute instances left after 300 s")


def _timeout_s(sc: Scenario, count: int) -> float:
    """How long a burst may take to be Running: a real node starts a sandbox and a container per pod."""
    return 120 + count * 2.0 if isinstance(sc, RealNodeScenario) else 60 + count * 0.5


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
    node_before, prepare_before = node_cpu(sc), plugin_prepare(sc)
    try:
        failed = create_burst(
            sc.api,
            ns,
            kind,
            count,
            node_selector(sc),
            timeline,
            prefix="m-" if churn else "",
            real=isinstance(sc, RealNodeScenario),
        )
        expected = count - len(failed)
        wait_for(lambda: timeline.running_count() >= expected, _timeout_s(sc, count))
    finally:
        timeline.stop()
    ctl_after = usage(ctl_pid) if ctl_pid else None
    calls_after = _nvml_calls(sc)
    node_after, prepare_after = node_cpu(sc), plugin_prepare(sc)
    plugin_usages = [usage(p) for p in plugin_pids]
    durations = [d for t in list(timeline.pods.values()) if (d := t.stage_durations()) is not None]
    posted = [t.posted for t in timeline.pods.values() if t.posted is not None]
    running = [t.running for t in timeline.pods.values() if t.running is not None]
    span = (max(running) - min(posted)) if running and posted else float("nan")
    stages = ("admission", "gate", "scheduling", "prepare", "total")
    failed_prep = failed_prepares(sc, ns)
    unretried = [
        d for n, t in list(timeline.pods.items()) if n not in failed_prep and (d := t.stage_durations())
    ]
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
        node_cpu_s={k: v - node_before.get(k, 0.0) for k, v in node_after.items()},
        plugin_prepare=(prepare_after[0] - prepare_before[0], prepare_after[1] - prepare_before[1]),
        failed_prepares=failed_prep,
        p99_unretried={s: percentile([d[s] for d in unretried], 0.99) for s in stages} if failed_prep else {},
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
        return not pods and all(not n.instances() for n in nodes_of(sc))

    if not wait_for(empty, 300, 1.0):
        raise RuntimeError(f"round {ns}: pods or GPU instances left after 300 s")
    time.sleep(1.0)
