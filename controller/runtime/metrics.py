"""Controller metrics on :31993 (`hami_node_gpu_mig_instance_info` and flexmig's own).

`hami_node_gpu_mig_instance_info` has HAMi's labels exactly, with its constant label zone="vGPU". The
cluster-wide gauges (instances, gated pods, free placements, fragmentation, shared GPUs) are served by
the leader only; a standby answers them empty. Per-process series (latencies, webhook admissions,
`flexmig_build_info`) are each replica's own: scrape the pods (the chart's ServiceMonitor does).

Gauges that describe the cluster are computed at scrape time from an immutable snapshot the controller
thread publishes after each batch of events (occupancies are immutable values, so the scrape thread
never sees half an update and never takes the controller's time).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from api.buildinfo import HAMI_METRIC_ZONE, build_labels
from api.constants import DRIVER_NAME, parse_device_name
from driver.placement.fragmentation import fragmentation
from driver.policy.model import GpuRef, GpuState
from driver.policy.sharemodel import SharedGpuState

INSTANCE_INFO_LABELS = (
    "node",
    "device_uuid",
    "device_index",
    "mig_uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
    "placement_start",
    "placement_size",
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    gpus: tuple[GpuState, ...] = ()
    instances: tuple[tuple[str, ...], ...] = ()
    gated: Mapping[str, int] = field(default_factory=dict)
    shared: tuple[SharedGpuState, ...] = ()  # hami-core GPUs: capacity and what every claim's shares use
    # time.monotonic() when the longest-pending gated pod was first seen (None: none pending); the
    # wait is computed at scrape time, so it grows between snapshots as the pod keeps waiting.
    oldest_pending_since: float | None = None


def instance_rows(
    claims: Iterable[Mapping[str, Any]], pool_nodes: Mapping[str, str | None]
) -> list[tuple[str, ...]]:
    """One label tuple per realised instance, from the identity nodes write into status.devices[].data."""
    rows: list[tuple[str, ...]] = []
    for claim in claims:
        for dev in (claim.get("status") or {}).get("devices") or ():
            data = dev.get("data")
            if dev.get("driver") != DRIVER_NAME or not isinstance(data, Mapping) or not data.get("migUUID"):
                continue
            try:
                index = str(parse_device_name(str(dev.get("device"))).gpu_index)
            except ValueError:
                index = ""
            placement = data.get("placement") or {}
            rows.append(
                (
                    pool_nodes.get(str(dev.get("pool"))) or str(dev.get("pool")),
                    str(data.get("parentUUID", "")),
                    index,
                    str(data.get("migUUID")),
                    str(data.get("profile", "")),
                    str(data.get("gpuInstanceID", "")),
                    str(data.get("computeInstanceID", "")),
                    str(placement.get("start", "")),
                    str(placement.get("size", "")),
                )
            )
    return rows


class InstanceRows:
    """`instance_rows` kept per claim and rebuilt only for claims whose resourceVersion changed: the
    loop publishes a snapshot every step, and rebuilding every claim's rows each time was half of the
    loop's time with a thousand pods running (a profile of benchmarks/e2e/backlog.py)."""

    def __init__(self) -> None:
        self._pools: dict[str, str | None] = {}
        self._by_claim: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {}

    def rows(
        self, claims: Mapping[str, Mapping[str, Any]], pool_nodes: Mapping[str, str | None]
    ) -> tuple[tuple[str, ...], ...]:
        if pool_nodes != self._pools:  # a node name a row carries may have changed: rebuild all
            self._pools = dict(pool_nodes)
            self._by_claim = {}
        kept: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {}
        for key, claim in claims.items():
            version = str((claim.get("metadata") or {}).get("resourceVersion") or "")
            cached = self._by_claim.get(key)
            if version and cached is not None and cached[0] == version:
                kept[key] = cached
            else:
                kept[key] = (version, tuple(instance_rows((claim,), pool_nodes)))
        self._by_claim = kept
        return tuple(row for _, rows in kept.values() for row in rows)


class _SnapshotCollector(Collector):
    def __init__(self, owner: ControllerMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterable[GaugeMetricFamily]:
        # Cluster-wide gauges come from the leader only: every replica serves /metrics behind one
        # Service, and a standby's stale snapshot must not be mixed with the leader's answer.
        snap = self.owner.snapshot if self.owner.leading else Snapshot()
        info = GaugeMetricFamily(
            "hami_node_gpu_mig_instance_info",
            "A MIG instance realised for a pod (1 per instance)",
            labels=(*INSTANCE_INFO_LABELS, "zone"),
        )
        for row in snap.instances:
            info.add_metric([*row, HAMI_METRIC_ZONE], 1.0)
        yield info
        gated = GaugeMetricFamily(
            "flexmig_gated_pods", "Pods the controller could not place yet, by reason", labels=["reason"]
        )
        for reason, n in sorted(snap.gated.items()):
            gated.add_metric([reason], n)
        yield gated
        since = snap.oldest_pending_since
        yield GaugeMetricFamily(
            "flexmig_controller_oldest_pending_pod_seconds",
            "How long the longest-waiting gated pod has been pending (0 when none is)",
            value=0.0 if since is None else max(0.0, time.monotonic() - since),
        )
        free = GaugeMetricFamily(
            "flexmig_free_placements",
            "Free legal placements per profile and node",
            labels=["node", "profile"],
        )
        frag_gpu = GaugeMetricFamily(
            "flexmig_gpu_fragmentation",
            "Share of a GPU's free capacity placement rules make unusable",
            labels=["node", "device_index"],
        )
        frag_node = GaugeMetricFamily(
            "flexmig_node_fragmentation", "Mean GPU fragmentation of a node", labels=["node"]
        )
        per_node_free: Counter[tuple[str, str]] = Counter()
        per_node_frag: dict[str, list[float]] = {}
        for gpu in snap.gpus:
            ref: GpuRef = gpu.ref
            value = 0.0 if gpu.whole_gpu_taken else fragmentation(gpu.occupancy)
            frag_gpu.add_metric([ref.node, str(ref.gpu_index)], value)
            per_node_frag.setdefault(ref.node, []).append(value)
            for profile in gpu.catalog.profiles:
                n = 0 if gpu.whole_gpu_taken else len(gpu.occupancy.free_placements(profile))
                per_node_free[(ref.node, profile.name)] += n
        for (node, profile_name), n in sorted(per_node_free.items()):
            free.add_metric([node, profile_name], n)
        for node, values in sorted(per_node_frag.items()):
            frag_node.add_metric([node], sum(values) / len(values))
        yield free
        yield frag_gpu
        yield frag_node
        yield from _shared_families(snap.shared)


# (metric suffix, help, ShareAmount field)
_SHARED_RESOURCES = (
    ("memory_mib", "memory in MiB", "memory_mib"),
    ("cores", "percent of the SMs", "cores"),
    ("shares", "split slots (deviceSplitCount)", "shares"),
)


def _shared_families(states: Iterable[SharedGpuState]) -> Iterable[GaugeMetricFamily]:
    """Per hami-core GPU, what shares hold and what it offers, as the controller accounts them."""
    ordered = sorted(states, key=lambda st: (st.ref.node, st.ref.gpu_index))
    for suffix, what, attr in _SHARED_RESOURCES:
        used = GaugeMetricFamily(
            f"flexmig_shared_gpu_allocated_{suffix}",
            f"Shared (hami-core) GPU {what} allocated to shares, summed over every claim",
            labels=["node", "device_index"],
        )
        total = GaugeMetricFamily(
            f"flexmig_shared_gpu_capacity_{suffix}",
            f"Shared (hami-core) GPU {what} published",
            labels=["node", "device_index"],
        )
        for st in ordered:
            labels = [st.ref.node, str(st.ref.gpu_index)]
            used.add_metric(labels, getattr(st.used, attr))
            total.add_metric(labels, getattr(st.capacity, attr))
        yield used
        yield total


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.snapshot = Snapshot()
        self.allocation_latency = Histogram(
            "flexmig_allocation_latency_seconds",
            "From first seeing a gated pod to removing its gate",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.decision_latency = Histogram(
            "flexmig_decision_latency_seconds",
            "Time to decide one pod's placement (no I/O)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1),
            registry=self.registry,
        )
        self.burst_plan_latency = Histogram(
            "flexmig_controller_burst_plan_seconds",
            "Time to plan a step's one-device MIG pods together (outcome: planned, skipped: too large "
            "or out of time, failed)",
            ["outcome"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=self.registry,
        )
        self.gate_echo_wait = Histogram(
            "flexmig_controller_gate_echo_wait_seconds",
            "Wait between a pod's claim allocations landing and its gate removal, for the controller's "
            "claim watch to deliver them (outcome: seen, timeout; controller/kube/echo.py)",
            ["outcome"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
            registry=self.registry,
        )
        self.reconcile_errors = PromCounter(
            "flexmig_reconcile_errors", "Failed reconcile steps, by stage", ["stage"], registry=self.registry
        )
        self.conflicts = PromCounter(
            "flexmig_write_conflicts",
            "Optimistic-concurrency conflicts (re-read and retried)",
            registry=self.registry,
        )
        self.skipped = PromCounter(
            "flexmig_controller_skipped_objects",
            "Watched objects the controller could not process and skipped (kind, reason: the error type)",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.loop_errors = PromCounter(
            "flexmig_controller_loop_errors",
            "Exceptions caught by a background loop of the controller process (retried with backoff)",
            ["loop"],
            registry=self.registry,
        )
        self.stale_events = PromCounter(
            "flexmig_controller_stale_events",
            "Watch events older than the controller's own write of the object (ignored)",
            registry=self.registry,
        )
        self.double_holds = PromCounter(
            "flexmig_devices_held_twice",
            "Times a device was found in the allocations of two claims at once (never from this controller)",
            registry=self.registry,
        )
        self.devices_held_twice = Gauge(
            "flexmig_devices_held_twice_now",
            "Devices more than one claim's allocation names right now (kept taken until all let go)",
            registry=self.registry,
        )
        self.unknown_writes = PromCounter(
            "flexmig_claim_writes_unknown_outcome",
            "Claim writes whose response was lost (timeout, dropped connection, 5xx): held until settled",
            registry=self.registry,
        )
        self.unsettled_writes = Gauge(
            "flexmig_claim_writes_unsettled",
            "Claim writes with an unknown outcome not yet settled by a read or the watch",
            registry=self.registry,
        )
        self.catch_ups = PromCounter(
            "flexmig_leader_catch_ups",
            "Fresh lists taken on becoming leader, before the first decision",
            registry=self.registry,
        )
        self.leader = Gauge(
            "flexmig_leader", "1 while this replica holds the leader lease", registry=self.registry
        )
        self.leading = True
        """Whether this replica leads; only then are the cluster-wide gauges served. True until
        `set_leader` says otherwise (a process without election leads; a standby's snapshot is empty
        until then anyway)."""
        self.build_info = Gauge(
            "flexmig_build_info",
            "1, labelled with the running build (version, revision, python_version) and component",
            ["version", "revision", "python_version", "component"],
            registry=self.registry,
        )
        self.build_info.labels(**build_labels(), component="controller").set(1)
        self.registry.register(_SnapshotCollector(self))

    def set_leader(self, leading: bool) -> None:
        self.leading = leading
        self.leader.set(1 if leading else 0)

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot


def dump_rows(rows: Iterable[tuple[str, ...]]) -> str:
    return json.dumps([dict(zip(INSTANCE_INFO_LABELS, r, strict=True)) for r in rows])
