"""The metrics and liveness port both processes serve: /metrics, /healthz and /livez over plain HTTP.

GET /metrics answers 200 with what `metrics()` renders (Prometheus text, `metrics_content_type`);
GET /healthz and /livez answer 200 or 503 with the text of `healthy()`; anything else 404. If
`metrics()` or `healthy()` raises, the answer is 500 naming the error. A query string is ignored. Access logs are off: probes every few seconds would drown the process's own logs.

The accept loop is a `driver/looprunner.py::LoopRunner` named `metrics-http`: each iteration serves at
most one connection (or times out after 0.5 s), so an exception is retried with backoff and a wedged
accept loop shows as stuck (no heartbeat for 60 s) instead of silently ending the endpoint; each
iteration also closes the connections past their deadline. The server is driver/boundedhttp.py's
(`PROBE_LIMITS`): at most 16 connections, each request received within 10 s, 16 KiB of request line
and headers, no body; a 17th connection displaces the one waiting longest on its client, so a prompt
probe or scrape is answered while slow clients hold every connection.

The controller (controller/runtime/health.py) and the kubelet plugin (kubeletplugin/agent/metrics.py)
each wrap this with their own registry and health check. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

from driver.boundedhttp import BoundedHandler, BoundedHTTPServer, Limits, Reject
from driver.looprunner import LoopRunner

TEXT = "text/plain; charset=utf-8"
LOOP_NAME = "metrics-http"
_ACCEPT_TIMEOUT_S = 0.5
_STUCK_AFTER_S = 60.0
PROBE_LIMITS = Limits(max_connections=16, request_deadline_s=10.0, idle_timeout_s=10.0)
"""Prometheus and the kubelet hold one or two connections each; a probe is one small GET."""


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
        limits: Limits = PROBE_LIMITS,
        on_reject: Reject | None = None,
    ) -> None:
        """Bind now (port 0 picks a free one, see `port`); serve after `start`. `on_reject` is told why
        a connection was shed or closed (driver/boundedhttp.py's reasons)."""
        self._metrics = metrics
        self._metrics_content_type = metrics_content_type
        self._healthy = healthy
        self._server = BoundedHTTPServer((host, port), self._make_handler(), limits, on_reject)
        self._server.timeout = min(_ACCEPT_TIMEOUT_S, limits.poll_s)
        self.runner = LoopRunner(LOOP_NAME, self._serve_once, stuck_after_s=_STUCK_AFTER_S, on_error=on_error)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def _serve_once(self) -> None:
        self._server.handle_request()
        self._server.service_actions()  # handle_request does not: close connections past their deadline

    def start(self) -> None:
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
        self.runner.join(5)
        self._server.server_close()

    def _make_handler(self) -> type[BoundedHandler]:
        metrics, content_type, healthy = self._metrics, self._metrics_content_type, self._healthy

        def answer(path: str) -> tuple[int, bytes, str]:
            try:
                if path == "/metrics":
                    return 200, metrics(), content_type
                if path in ("/healthz", "/livez"):
                    ok, text = healthy()
                    return 200 if ok else 503, text.encode(), TEXT
                return 404, b"not found: try /metrics or /healthz\n", TEXT
            except Exception as exc:  # a failing collector or check answers 500, not a dropped socket
                return 500, f"internal error: {type(exc).__name__}: {exc}\n".encode(), TEXT

        class Handler(BoundedHandler):
            def do_GET(self) -> None:
                with self.busy():
                    code, body, ctype = answer(self.path.split("?")[0])
                self._reply(code, body, ctype)

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


__all__ = ["LOOP_NAME", "PROBE_LIMITS", "TEXT", "ProbeServer"]
