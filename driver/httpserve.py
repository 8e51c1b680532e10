"""The metrics and liveness port both processes serve: /metrics, /healthz and /livez over plain HTTP.

GET /metrics answers 200 with what `metrics()` renders (Prometheus text, `metrics_content_type`);
GET /healthz and /livez answer 200 or 503 with the text of `healthy()`; anything else 404. If
`metrics()` or `healthy()` raises, the answer is 500 naming the error; a client idle for 10 s is dropped. A query
string is ignored. Access logs are off: probes every few seconds would drown the process's own logs.

The accept loop is a `driver/looprunner.py::LoopRunner` named `metrics-http`: each iteration serves at
most one connection (or times out after 0.5 s), so an exception is retried with backoff and a wedged
accept loop shows as stuck (no heartbeat for 60 s) instead of silently ending the endpoint. Each
connection is answered in its own daemon thread.

The controller (controller/runtime/health.py) and the kubelet plugin (kubeletplugin/agent/metrics.py)
each wrap this with their own registry and health check. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from driver.looprunner import LoopRunner

TEXT = "text/plain; charset=utf-8"
LOOP_NAME = "metrics-http"
_ACCEPT_TIMEOUT_S = 0.5
_STUCK_AFTER_S = 60.0
_CONNECTION_TIMEOUT_S = 10.0


class ProbeServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: Callable[[], bytes],
        metrics_content_type: str,
        healthy: Callable[[], tuple[bool, str]],
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Bind now (port 0 picks a free one, see `port`); serve after `start`."""
        self._metrics = metrics
        self._metrics_content_type = metrics_content_type
        self._healthy = healthy
        self._server = ThreadingHTTPServer((host, port), self._make_handler())
        self._server.daemon_threads = True
        self._server.timeout = _ACCEPT_TIMEOUT_S
        self.runner = LoopRunner(
            LOOP_NAME, self._server.handle_request, stuck_after_s=_STUCK_AFTER_S, on_error=on_error
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
        metrics, content_type, healthy = self._metrics, self._metrics_content_type, self._healthy

        class Handler(BaseHTTPRequestHandler):
            # An idle or slow client must not hold its thread forever (anything that reaches the port
            # could otherwise exhaust threads).
            timeout = _CONNECTION_TIMEOUT_S

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                try:
                    if path == "/metrics":
                        self._reply(200, metrics(), content_type)
                    elif path in ("/healthz", "/livez"):
                        ok, text = healthy()
                        self._reply(200 if ok else 503, text.encode(), TEXT)
                    else:
                        self._reply(404, b"not found: try /metrics or /healthz\n", TEXT)
                except OSError:
                    raise  # the client went away: nothing to answer
                except Exception as exc:  # a failing collector or check answers 500, not a dropped socket
                    self._reply(500, f"internal error: {type(exc).__name__}: {exc}\n".encode(), TEXT)

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


__all__ = ["LOOP_NAME", "TEXT", "ProbeServer"]
