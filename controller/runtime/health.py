"""The controller's metrics port: /metrics for Prometheus and /healthz (/livez) for the liveness probe.

/healthz answers 503 naming the loop when any background loop of the process (reflectors, allocation,
leader election, webhook maintenance, this server's own accept loop) is dead or stuck, as the kubelet
plugin's does (kubeletplugin/agent/metrics.py): a process whose watch or allocation loop hangs is restarted
instead of silently allocating nothing. A loop that keeps failing (the API server is down) is not
unhealthy by itself; its failures are in the text.

The server itself, its accept loop (a LoopRunner, so an exception is retried with backoff and a wedged
accept loop shows as stuck) and the endpoints are the shared ones in driver/httpserve.py, bounded as
driver/boundedhttp.py describes; this module adds the controller's registry and loop group, and counts
what the port refused in `flexmig_controller_http_connections_rejected_total{reason}`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from driver.httpserve import ProbeServer
from driver.looprunner import LoopGroup


class HealthServer(ProbeServer):
    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        loops: LoopGroup,
        *,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        rejected = Counter(
            "flexmig_controller_http_connections_rejected",
            "Connections or requests the metrics/health port refused to bound what clients hold, by "
            "reason (driver/boundedhttp.py): capacity, evicted, deadline, headers_too_large",
            ["reason"],
            registry=registry,
        )
        super().__init__(
            host,
            port,
            metrics=lambda: generate_latest(registry),
            metrics_content_type=CONTENT_TYPE_LATEST,
            healthy=loops.check,
            on_error=on_error,
            on_reject=lambda reason: rejected.labels(reason=reason).inc(),
        )
        loops.add(self.runner)  # its own accept loop counts towards /healthz


__all__ = ["HealthServer"]
