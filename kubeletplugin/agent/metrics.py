"""Node metrics (default port 31992): HAMi's `hami_mig_device_info` plus flexmig's own node metrics.

`hami_mig_device_info` is about MIG instances only. HAMi-core shares of a hami-core node have their own
series: `flexmig_hami_core_library_present{node}` (0 = shares are not enforced) and, per shared GPU,
`flexmig_node_shared_gpu_{shares,memory_mib,cores}_in_use`. Per MIG-capable GPU,
`flexmig_node_gpu_mig_mode` and `flexmig_node_gpu_mig_mode_needs_reset` (kubeletplugin/agent/migmodecheck.py).

Each plugin process owns one `NodeMetrics` with its own registry, so tests can run several plugins in
one interpreter without label collisions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from api.buildinfo import HAMI_METRIC_ZONE, build_labels
from driver.httpserve import LOOP_NAME, ProbeServer

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True, slots=True)
class RealizedInstance:
    """One MIG instance the plugin created, with the pod/container that uses it."""

    namespace: str
    pod: str
    container: str
    vdevice_index: int
    device_uuid: str
    mig_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class SharedGpuUsage:
    """What the prepared HAMi-core shares of one GPU add up to."""

    gpu_index: int
    gpu_uuid: str
    shares: int
    memory_mib: int
    cores: int


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.mig_device_info = Gauge(
            "hami_mig_device_info",
            "MIG instance realised by flexmig on this node, with the container that uses it",
            [
                "namespace",
                "pod",
                "container",
                "vdevice_index",
                "device_uuid",
                "mig_uuid",
                "profile",
                "gpu_instance_id",
                "compute_instance_id",
                "zone",  # HAMi's constant label, always "vGPU"
            ],
            registry=self.registry,
        )
        self.build_info = Gauge(
            "flexmig_build_info",
            "1, labelled with the running build (version, revision, python_version) and component",
            ["version", "revision", "python_version", "component"],
            registry=self.registry,
        )
        self.build_info.labels(**build_labels(), component="kubelet-plugin").set(1)
        self.prepare_seconds = Histogram(
            "flexmig_node_prepare_duration_seconds",
            "Time to prepare one claim (NVML, CDI, checkpoint, API writes)",
            ["result"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.unprepare_seconds = Histogram(
            "flexmig_node_unprepare_duration_seconds",
            "Time to unprepare one claim",
            ["result"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.nvml_errors = Counter(
            "flexmig_node_nvml_errors_total",
            "NVML calls that failed, by NVML function and return code",
            ["call", "code"],
            registry=self.registry,
        )
        self.orphans_found = Counter(
            "flexmig_node_orphan_instances_total",
            "GPU instances found on a GPU that no claim owns, by what was done about them",
            ["action"],
            registry=self.registry,
        )
        # Idle MIG instances kept for reuse (--idle-grace-period; kubeletplugin/prepare/idle.py).
        self.idle_instances = Gauge(
            "flexmig_node_idle_instances",
            "GPU instances kept idle (no compute instance, no claim) for reuse by a claim of the same shape",
            registry=self.registry,
        )
        self.idle_events = Counter(
            "flexmig_node_idle_instance_events_total",
            "What happened to idle GPU instances: kept (a claim ended), not_kept (a process still used"
            " it), reused, expired (grace period over), displaced (a different layout needed its slices),"
            " lost (gone from NVML at start)",
            ["event"],
            registry=self.registry,
        )
        self.foreign_instances = Gauge(
            "flexmig_node_foreign_instances",
            "GPU instances on this node that flexmig did not create (left untouched), as last seen by"
            " the periodic reconcile",
            registry=self.registry,
        )
        self.withdrawn_devices = Gauge(
            "flexmig_node_withdrawn_devices",
            "Devices left out of the ResourceSlices because an out-of-band instance overlaps them",
            registry=self.registry,
        )
        self.loop_errors = Counter(
            "flexmig_node_loop_errors_total",
            "Failed iterations of a background loop (retried with backoff), by loop",
            ["loop"],
            registry=self.registry,
        )
        self.http_rejected = Counter(
            "flexmig_node_http_connections_rejected_total",
            "Connections or requests the metrics/health port refused to bound what clients hold, by "
            "reason (driver/boundedhttp.py): capacity, evicted, deadline, headers_too_large",
            ["reason"],
            registry=self.registry,
        )
        self.checkpoint_claims = Gauge(
            "flexmig_node_checkpoint_claims",
            "Claims in the node checkpoint, by state",
            ["state"],
            registry=self.registry,
        )
        self.registered = Gauge(
            "flexmig_node_plugin_registered",
            "1 when kubelet reported the plugin registered, 0 otherwise",
            registry=self.registry,
        )
        self.published_devices = Gauge(
            "flexmig_node_published_devices",
            "Devices published in this node's ResourceSlices",
            registry=self.registry,
        )
        self.hami_core_library_present = Gauge(
            "flexmig_hami_core_library_present",
            "1 when HAMi-core's library is usable at --hami-core-library (shares are enforced), 0 when"
            " it is absent (shares are prepared but NOT enforced); only on hami-core nodes",
            ["node"],
            registry=self.registry,
        )
        self.hami_core_gpus = Gauge(
            "flexmig_node_hami_core_gpus",
            "GPUs in hami-core mode by what their share publishes: enforced, unenforced (library"
            " missing, published anyway: --unenforced-shares=publish) or refused (library missing,"
            " nothing shared: the default)",
            ["state"],
            registry=self.registry,
        )
        mig_mode_labels = ["gpu", "uuid", "model"]
        self.gpu_mig_mode = Gauge(
            "flexmig_node_gpu_mig_mode",
            "MIG mode of a MIG-capable GPU as last read (1 on, 0 off)",
            mig_mode_labels,
            registry=self.registry,
        )
        self.gpu_mig_mode_needs_reset = Gauge(
            "flexmig_node_gpu_mig_mode_needs_reset",
            "1 when MIG is wanted on this GPU (mig node, model allowed) but its MIG mode is off and only"
            " an administrator can switch it: nvidia-smi -i <gpu> -mig 1, then a GPU reset (Ampere)",
            mig_mode_labels,
            registry=self.registry,
        )
        shared_labels = ["gpu", "uuid"]
        self.shared_gpu_shares = Gauge(
            "flexmig_node_shared_gpu_shares_in_use",
            "HAMi-core shares prepared on a shared GPU (each counts against its splitCount)",
            shared_labels,
            registry=self.registry,
        )
        self.shared_gpu_memory = Gauge(
            "flexmig_node_shared_gpu_memory_mib_in_use",
            "Memory (MiB) the prepared HAMi-core shares of a GPU may allocate, summed",
            shared_labels,
            registry=self.registry,
        )
        self.shared_gpu_cores = Gauge(
            "flexmig_node_shared_gpu_cores_in_use",
            "SM percent the prepared HAMi-core shares of a GPU hold, summed",
            shared_labels,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._refreshers: list[Callable[[], object]] = []

    def add_refresher(self, refresh: Callable[[], object]) -> None:
        """Run `refresh` before every scrape (cheap checks whose answer should never be stale)."""
        self._refreshers.append(refresh)

    def set_shared_usage(self, usage: Iterable[SharedGpuUsage]) -> None:
        """Replace the shared-GPU series wholesale, so a GPU whose last share went reads absent."""
        with self._lock:
            gauges = (self.shared_gpu_shares, self.shared_gpu_memory, self.shared_gpu_cores)
            for gauge in gauges:
                gauge.clear()
            for u in usage:
                labels = {"gpu": str(u.gpu_index), "uuid": u.gpu_uuid}
                self.shared_gpu_shares.labels(**labels).set(u.shares)
                self.shared_gpu_memory.labels(**labels).set(u.memory_mib)
                self.shared_gpu_cores.labels(**labels).set(u.cores)

    def set_realized_instances(self, instances: Iterable[RealizedInstance]) -> None:
        """Replace the info series wholesale, so a destroyed instance disappears from /metrics."""
        with self._lock:
            self.mig_device_info.clear()
            for inst in instances:
                self.mig_device_info.labels(
                    namespace=inst.namespace,
                    pod=inst.pod,
                    container=inst.container,
                    vdevice_index=str(inst.vdevice_index),
                    device_uuid=inst.device_uuid,
                    mig_uuid=inst.mig_uuid,
                    profile=inst.profile,
                    gpu_instance_id=str(inst.gpu_instance_id),
                    compute_instance_id=str(inst.compute_instance_id),
                    zone=HAMI_METRIC_ZONE,
                ).set(1)

    def set_checkpoint_counts(self, counts: dict[str, int]) -> None:
        with self._lock:
            self.checkpoint_claims.clear()
            for state, count in counts.items():
                self.checkpoint_claims.labels(state=state).set(count)

    def render(self) -> bytes:
        for refresh in self._refreshers:
            # The refresher logs its own failures; a scrape still answers.
            with contextlib.suppress(OSError):
                refresh()
        return generate_latest(self.registry)


class MetricsServer(ProbeServer):
    """Serves /metrics and the DaemonSet's liveness probe /healthz on one port (driver/httpserve.py).

    Its accept loop (`runner`) counts its failures in `flexmig_node_loop_errors_total`; the agent adds
    it to the loops /healthz checks.
    """

    def __init__(
        self, metrics: NodeMetrics, host: str, port: int, healthy: Callable[[], tuple[bool, str]]
    ) -> None:
        super().__init__(
            host,
            port,
            metrics=metrics.render,
            metrics_content_type=CONTENT_TYPE_LATEST,
            healthy=healthy,
            on_error=lambda exc: metrics.loop_errors.labels(loop=LOOP_NAME).inc(),
            on_reject=lambda reason: metrics.http_rejected.labels(reason=reason).inc(),
        )
