"""The controller's metrics port: /metrics for Prometheus and /healthz (/livez) for the liveness probe.

/healthz answers 503 naming the loop when any background loop of the process (reflectors, allocation,
leader election, webhook maintenance, this server's own accept loop) is dead or stuck, as the kubelet
plugin's does (kubeletplugin/agent/metrics.py): a process whose watch or allocation loop hangs is restarted
instead of silently allocating nothing. A loop that keeps failing (the API server is down) is not
unhealthy by itself; its failures are in the text.

The accept loop is itself a LoopRunner: each iteration serves at most one connection (or times out
after 0.5 s), so an exception is retried with backoff and a wedged accept loop shows as stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from driver.looprunner import LoopGroup, LoopRunner

TEXT = "text/plain; charset=utf-8"


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        loops: LoopGroup,
        *,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._registry = registry
        self._loops = loops
        self._server = ThreadingHTTPServer((host, port), self._make_handler())
        self._server.daemon_threads = True
        self._server.timeout = 0.5
        self.runner = loops.add(
            LoopRunner("metrics-http", self._server.handle_request, stuck_after_s=60.0, on_error=on_error)
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
        self.runner.join(5)
        self._server.server_close()

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        registry, loops = self._registry, self._loops

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez"):
                    ok, text = loops.check()
                    self._reply(200 if ok else 503, text.encode(), TEXT)
                else:
                    self._reply(404, b"not found: try /metrics or /healthz\n", TEXT)

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would drown the controller's own logs

        return Handler


__all__ = ["HealthServer"]
