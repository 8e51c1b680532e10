"""The fault matrix: each fault runs while the churn goes on and returns whether it hit its target.

| kind | what happens |
|---|---|
| apiserver-restart | kube-apiserver stopped for `down_s`, then started again |
| etcd-compaction | etcd compacted to its current revision, kube-apiserver restarted at once: every watch
  resumes from a compacted revision; a watch from the old revision must get 410 Gone |
| controller-crash-between-claim-writes | the leader is restarted armed (controller/runtime/crashpoints.py) and
  SIGKILLs itself after writing a claim's finalizer, before writing its allocation |
| controller-crash-before-gate-removal | the same, after the allocation, before the pod's gate goes |
| leader-handover | the leading replica is SIGKILLed during a burst; the other must take over |
| plugin-crash-mid-prepare | a MIG node's plugin restarted armed at `after-ci-create`, SIGKILLed there |
| plugin-crash-mid-unprepare | armed at `mid-destroy`, a running MIG pod deleted, SIGKILLed there |
| kubelet-restart | a node's kubelet stand-in restarted (it wipes the slices and re-registers the plugin) |
| webhook-unreachable | the webhook's address refuses connections for `down_s`; pods created then must be refused |
| lost-responses, rolling-update, webhook-flood, hostile-specs | at the boundaries: faults_boundary.py |
"""

from __future__ import annotations

import enum
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.kube.rest import request
from tests.e2e.scenario import SimNode

from .cluster import SoakCluster, wait_for
from .faults_boundary import hostile_specs, lost_responses, rolling_update, webhook_flood
from .workload import Churn, PodKind


class Fault(enum.StrEnum):
    APISERVER_RESTART = "apiserver-restart"
    ETCD_COMPACTION = "etcd-compaction"
    CTRL_CRASH_CLAIM_WRITES = "controller-crash-between-claim-writes"
    CTRL_CRASH_GATE = "controller-crash-before-gate-removal"
    LEADER_HANDOVER = "leader-handover"
    PLUGIN_CRASH_PREPARE = "plugin-crash-mid-prepare"
    PLUGIN_CRASH_UNPREPARE = "plugin-crash-mid-unprepare"
    KUBELET_RESTART = "kubelet-restart"
    WEBHOOK_UNREACHABLE = "webhook-unreachable"
    LOST_RESPONSES = "lost-responses"
    ROLLING_UPDATE = "rolling-update"
    WEBHOOK_FLOOD = "webhook-flood"
    HOSTILE_SPECS = "hostile-specs"


@dataclass(frozen=True)
class FaultResult:
    fault: Fault
    reached: bool  # the fault hit its target (e.g. the crashpoint fired)
    detail: str
    seconds: float


@dataclass
class FaultContext:
    cluster: SoakCluster
    churn: Churn
    rng: random.Random
    down_s: float  # how long the API server / webhook stay away
    takeover_s: float = 90.0  # a lease (15 s) + renew, with room for a loaded machine


def run_fault(fault: Fault, ctx: FaultContext) -> FaultResult:
    t0 = time.monotonic()
    reached, detail = _FAULTS[fault](ctx)
    return FaultResult(fault, reached, detail, time.monotonic() - t0)


def _apiserver_restart(ctx: FaultContext) -> tuple[bool, str]:
    ctx.cluster.stop_apiserver()
    time.sleep(ctx.down_s)
    ctx.cluster.start_apiserver()
    return True, f"down {ctx.down_s:.0f}s"


def _etcd_compaction(ctx: FaultContext) -> tuple[bool, str]:
    c = ctx.cluster
    old_rv = request(c.api, "GET", "/apis/resource.k8s.io/v1/resourceclaims", query=[("limit", "1")])[
        "metadata"
    ]["resourceVersion"]
    time.sleep(2)  # let some writes happen after old_rv
    rev = c.etcd_compact()
    c.stop_apiserver()  # watches re-established against a compacted store
    time.sleep(1)
    c.start_apiserver()
    gone = _watch_status(ctx, old_rv)
    return gone == 410, f"compacted at revision {rev}; a watch from resourceVersion {old_rv} got {gone}"


def _watch_status(ctx: FaultContext, rv: str) -> int | None:
    """The status of a claims watch from `rv`: 410 when its history is compacted away (an ERROR event
    in a 200 stream from the watch cache, or the response status), None when there is no answer."""
    api = ctx.cluster.api
    query = [("watch", "1"), ("resourceVersion", rv), ("timeoutSeconds", "2")]
    try:
        method, url, headers, _, _ = api.param_serialize(
            method="GET", resource_path="/apis/resource.k8s.io/v1/resourceclaims", query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        resp = api.rest_client.pool_manager.request(method, url, headers=headers, timeout=15)
    except Exception:  # the API server may still be coming back: no answer
        return None
    if resp.status != 200:
        return int(resp.status)
    for line in resp.data.decode(errors="replace").splitlines():
        event = json.loads(line) if line.strip() else {}
        if event.get("type") == "ERROR":
            return int((event.get("object") or {}).get("code") or 0)
    return 200


def _controller_crash(point: str) -> Callable[[FaultContext], tuple[bool, str]]:
    """The leader restarted in place (same identity, so it takes its own Lease back at once) armed at
    `point`; it SIGKILLs itself there on the next allocation and is started again unarmed."""

    def run(ctx: FaultContext) -> tuple[bool, str]:
        c = ctx.cluster
        leader = c.leader() or "a"
        c.kill_replica(leader)
        rep = c.start_replica(leader, crashpoints=point)
        for _ in range(3):  # something to allocate, so the armed step is reached
            ctx.churn.create(PodKind.HAMI)
        assert rep.proc is not None
        proc = rep.proc
        died = wait_for(lambda: proc.proc.poll() is not None, 120)
        fired = died and "controller crashpoint reached" in proc.log_text()
        code = c.kill_replica(leader)
        c.start_replica(leader)
        wait_for(lambda: c.leader() is not None, ctx.takeover_s)
        return fired, f"{leader} armed, exit code {code}, leader now {c.leader()}"

    return run


def _leader_handover(ctx: FaultContext) -> tuple[bool, str]:
    c = ctx.cluster
    leader = c.leader()
    if leader is None:
        return False, f"no single leader to kill (leading: {c.leaders()})"
    ctx.churn.burst(ctx.rng.randint(8, 12))
    t0 = time.monotonic()
    c.kill_replica(leader)
    other = next(n for n in c.replicas if n != leader)
    took = wait_for(lambda: c.leader() == other, ctx.takeover_s)
    c.start_replica(leader)
    return (
        took,
        f"killed {leader}; {other} leads after {time.monotonic() - t0:.1f}s" if took else "no takeover",
    )


def _mig_node(ctx: FaultContext, busiest: bool) -> SimNode:
    """A MIG node: the one with the fewest devices taken (room for a new one, so a prepare happens) or,
    if `busiest`, the most GPU instances (a running pod to delete, so an unprepare happens); ties at
    random. Never the burst node for a prepare: gated bursts wait for its every free slot (a 35-minute
    soak missed there). Taken counts the devices allocated there too, not only the instances: pods
    allocated and not yet prepared (after a controller crash, many of them) fill a node that has few
    instances, and a prepare fault aimed at it missed twice in CI."""
    nodes = [n for n in ctx.cluster.nodes.values() if n.spec.mode == "mig"]
    ctx.rng.shuffle(nodes)
    if busiest:
        return sorted(nodes, key=lambda n: len(n.instances()), reverse=True)[0]
    nodes = [n for n in nodes if n.name != ctx.churn.pinned_node] or nodes
    allocated: dict[str, int] = {}
    for claim in request(ctx.cluster.api, "GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        for result in results or ():
            allocated[str(result.get("pool"))] = allocated.get(str(result.get("pool")), 0) + 1
    return min(nodes, key=lambda n: max(len(n.instances()), allocated.get(n.name, 0)))


def _plugin_crash(
    ctx: FaultContext, point: str, trigger: Callable[[SimNode], None], busiest: bool
) -> tuple[bool, str]:
    c, node = ctx.cluster, _mig_node(ctx, busiest)
    c.restart_plugin(node, crashpoints=point)
    trigger(node)
    fired = wait_for(node.nd.marker.exists, 40)
    for _ in range(2):  # a full node (every GPU busy, other pods gated before ours) gets room made
        if fired or busiest:
            break
        _make_room(ctx, node)
        trigger(node)
        fired = wait_for(node.nd.marker.exists, 40)
    if not fired and busiest:
        fired = wait_for(node.nd.marker.exists, 80)
    c.restart_plugin(node, kill=True)
    return fired, f"{node.name}: {point} {'reached, SIGKILLed there' if fired else 'not reached in 120s'}"


def _make_room(ctx: FaultContext, node: SimNode) -> None:
    """Delete one running churn pod on `node` (its instance goes), so a pod waiting for room there is
    placed and prepared."""
    pods = request(ctx.cluster.api, "GET", f"/api/v1/namespaces/{ctx.churn.ns}/pods")["items"]
    for p in pods:
        name = p["metadata"]["name"]
        if p["spec"].get("nodeName") == node.name and name in ctx.churn.live:
            ctx.churn.delete(name)
            return


def _prepare_trigger(ctx: FaultContext) -> Callable[[SimNode], None]:
    def trigger(node: SimNode) -> None:
        ctx.churn.create(PodKind.HAMI, node=node.name, smallest=True)
        ctx.churn.create(PodKind.CLAIM, node=node.name, smallest=True)

    return trigger


def _unprepare_trigger(ctx: FaultContext) -> Callable[[SimNode], None]:
    def trigger(node: SimNode) -> None:
        # A running pod on the node whose claim has a MIG instance; make one if there is none.
        def victim() -> str | None:
            pods = request(ctx.cluster.api, "GET", f"/api/v1/namespaces/{ctx.churn.ns}/pods")["items"]
            for p in pods:
                on_node = p["spec"].get("nodeName") == node.name
                running = (p.get("status") or {}).get("phase") == "Running"
                if on_node and running and node.instances() and p["metadata"]["name"] in ctx.churn.live:
                    return str(p["metadata"]["name"])
            return None

        if victim() is None:
            ctx.churn.create(PodKind.HAMI, node=node.name)
            ctx.churn.create(PodKind.CLAIM, node=node.name)
        deadline = time.monotonic() + 90
        while (name := victim()) is None and time.monotonic() < deadline:
            time.sleep(1)
        if name is not None:
            ctx.churn.delete(name)

    return trigger


def _kubelet_restart(ctx: FaultContext) -> tuple[bool, str]:
    node = ctx.rng.choice(list(ctx.cluster.nodes.values()))
    ctx.cluster.restart_standin(node)
    return True, f"restarted the stand-in of {node.name}"


def _webhook_unreachable(ctx: FaultContext) -> tuple[bool, str]:
    c = ctx.cluster
    c.forwarder.pause()
    refused = admitted = 0
    deadline = time.monotonic() + ctx.down_s
    try:
        while time.monotonic() < deadline:
            before = ctx.churn.stats.refused
            name = ctx.churn.create(ctx.rng.choice((PodKind.HAMI, PodKind.CLAIM, PodKind.TEMPLATE)))
            refused += ctx.churn.stats.refused - before
            admitted += name is not None  # the invariants judge what an admitted pod looks like
            time.sleep(1.0)
    finally:
        c.forwarder.resume()
    return refused > 0 and admitted == 0, f"{refused} pods refused, {admitted} admitted while unreachable"


_FAULTS: dict[Fault, Callable[[FaultContext], tuple[bool, str]]] = {
    Fault.APISERVER_RESTART: _apiserver_restart,
    Fault.ETCD_COMPACTION: _etcd_compaction,
    Fault.CTRL_CRASH_CLAIM_WRITES: _controller_crash("before-allocation-write"),
    Fault.CTRL_CRASH_GATE: _controller_crash("before-gate-removal"),
    Fault.LEADER_HANDOVER: _leader_handover,
    Fault.PLUGIN_CRASH_PREPARE: lambda ctx: _plugin_crash(
        ctx, "after-ci-create", _prepare_trigger(ctx), False
    ),
    Fault.PLUGIN_CRASH_UNPREPARE: lambda ctx: _plugin_crash(
        ctx, "mid-destroy", _unprepare_trigger(ctx), True
    ),
    Fault.KUBELET_RESTART: _kubelet_restart,
    Fault.WEBHOOK_UNREACHABLE: _webhook_unreachable,
    Fault.LOST_RESPONSES: lost_responses,
    Fault.ROLLING_UPDATE: rolling_update,
    Fault.WEBHOOK_FLOOD: webhook_flood,
    Fault.HOSTILE_SPECS: hostile_specs,
}
