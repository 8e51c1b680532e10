"""Node metrics (default port 31992): HAMi's `hami_mig_device_info` plus flexmig's own node metrics.

Each plugin process owns one `NodeMetrics` with its own registry, so tests can run several plugins in
one interpreter without label collisions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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
            ],
            registry=self.registry,
        )
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
        self._lock = threading.Lock()

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
                ).set(1)

    def set_checkpoint_counts(self, counts: dict[str, int]) -> None:
        with self._lock:
            self.checkpoint_claims.clear()
            for state, count in counts.items():
                self.checkpoint_claims.labels(state=state).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves /metrics and the DaemonSet's liveness probe /healthz on one port."""

    def __init__(
        self, metrics: NodeMetrics, host: str, port: int, healthy: Callable[[], tuple[bool, str]]
    ) -> None:
        self._metrics = metrics
        self._healthy = healthy
        handler = self._make_handler()
        self._server = ThreadingHTTPServer((host, port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        metrics = self._metrics
        healthy = self._healthy

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
                elif self.path.split("?")[0] in ("/healthz", "/livez"):
                    ok, reason = healthy()
                    self._reply(200 if ok else 503, reason.encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                # Probes hit this every few seconds; access logs would drown the plugin's own logs.
                return

        return Handler
