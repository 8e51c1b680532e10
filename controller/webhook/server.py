"""The HTTPS endpoint the API server calls: driver/boundedhttp.py's bounded server with `ssl`, one
thread per connection, the TLS context swapped (not mutated) when the certificate changes.

Every accepted connection is wrapped with the context current at that moment, and its handshake runs
in the connection's own thread under the request deadline, so a slow or silent client never stalls the
accept loop, and a rotated certificate applies to the next connection without a restart.

Anything that reaches the port may connect (the chart's NetworkPolicy lets pods in, and the webhook
fails closed), so what one client can hold is bounded (`LIMITS`, docs/reliability.md):
- 128 connections. At the cap a new connection displaces the one waiting longest on its client (idle
  keep-alive, or still sending handshake, headers or body); reviews being answered are never
  displaced. A connection shed because all 128 are being answered is closed without a reply: a 503
  would need a TLS handshake in the accept loop.
- 10 s for a whole request, handshake included: the API server's own timeout for the call
  (webhook.timeoutSeconds, 10 s at most by default): a review arriving later is of no use to it.
  30 s idle between requests on a kept-alive connection.
- 4 MiB per body (413, unread): a CREATE review carries one pod, and the API server accepts no request
  body over 3 MiB (and etcd stores no object over 1.5 MiB), so a pod that can exist fits with room for
  the review's envelope; an UPDATE's object + oldObject of two etcd-sized objects would too.
- 32 MiB of bodies in flight over all connections (typical reviews are a few KiB): a body that does
  not fit after the oldest slow senders are closed is answered 503. With 32 KiB of headers per
  connection this keeps what clients can make the process hold near 40 MiB of raw input.
`flexmig_webhook_connections_rejected_total{reason}` counts every refusal.
"""

from __future__ import annotations

import socket
import ssl
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from controller.webhook.certs import CertBundle
from driver.boundedhttp import BoundedHandler, BoundedHTTPServer, Limits

log = structlog.get_logger(__name__)

MAX_BODY = 4 * 1024 * 1024
"""A pod's review: the API server takes no body over 3 MiB and etcd no object over 1.5 MiB."""
LIMITS = Limits(
    max_connections=128,
    request_deadline_s=10.0,
    idle_timeout_s=30.0,
    max_header_bytes=32 * 1024,
    max_body=MAX_BODY,
    body_budget=32 * 1024 * 1024,
)

Handler = Callable[[bytes], tuple[int, bytes]]
"""Request body -> (HTTP status, JSON response body)."""

_REJECTED: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()
_REJECTED_LOCK = threading.Lock()


def rejected_counter(registry: CollectorRegistry) -> Counter:
    """One counter per registry: the webhook service builds a new server after its accept loop died."""
    with _REJECTED_LOCK:
        counter = _REJECTED.get(registry)
        if counter is None:
            counter = _REJECTED[registry] = Counter(
                "flexmig_webhook_connections_rejected",
                "Webhook connections or requests refused to bound what clients hold, by reason: capacity "
                "(shed at accept), evicted (displaced by a newer connection), deadline, headers_too_large, "
                "body_too_large, busy (body budget spent).",
                ["reason"],
                registry=registry,
            )
        return counter


def ssl_context(bundle: CertBundle) -> ssl.SSLContext:
    """A server context for the bundle's certificate (TLS 1.2+; `ssl` needs files for the chain)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="flexmig-webhook-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(bundle.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(bundle.key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


class TlsState:
    """The context new connections get; `update` swaps it when the serving certificate changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._fingerprint: bytes | None = None

    def update(self, bundle: CertBundle) -> bool:
        fingerprint = bundle.fingerprint()
        if fingerprint == self._fingerprint:
            return False
        context = ssl_context(bundle)
        with self._lock:
            self._context, self._fingerprint = context, fingerprint
        return True

    @property
    def context(self) -> ssl.SSLContext | None:
        with self._lock:
            return self._context


class _Server(BoundedHTTPServer):
    allow_reuse_address = True
    shed_reply = None  # plaintext would be garbage to a TLS client; a handshake would stall accepting

    def __init__(
        self,
        address: tuple[str, int],
        tls: TlsState,
        handler: Handler,
        path: str,
        limits: Limits,
        registry: CollectorRegistry | None,
    ) -> None:
        self.tls = tls
        self.review_handler = handler
        self.webhook_path = path
        counter = rejected_counter(registry) if registry is not None else None
        on_reject = (lambda reason: counter.labels(reason=reason).inc()) if counter is not None else None
        super().__init__(address, _RequestHandler, limits, on_reject)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        context = self.tls.context
        if context is None:  # not reachable: the server is only started once a certificate exists
            sock.close()
            raise OSError("no TLS certificate yet")
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


class _RequestHandler(BoundedHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections

    def start_connection(self) -> None:
        self.request.do_handshake()

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._send(200, b"ok\n", "text/plain")
        else:
            self.refuse(404, "not found\n")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != self.server.webhook_path:
            self.refuse(404, f"no webhook at {self.path}; it is at {self.server.webhook_path}\n")
            return
        body = self.read_body()
        if body is None:
            return
        with self.busy():
            status, response = self.server.review_handler(body)
        del body
        self._send(status, response)


class WebhookServer:
    def __init__(
        self,
        address: str,
        port: int,
        path: str,
        handler: Handler,
        tls: TlsState,
        *,
        limits: Limits = LIMITS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._server = _Server((address, port), tls, handler, path, limits, registry)
        self._thread = threading.Thread(target=self._server.serve, name="webhook-https", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def connections(self) -> int:
        """Connections open now (each one thread)."""
        return len(self._server.connections)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        """False once the serving thread has ended without `stop()` (its accept loop raised)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def bind_check(address: str, port: int) -> str | None:
    """Why `address:port` cannot be served (in use, bad address), or None; for a clear error at start."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
    except OSError as exc:
        return f"cannot listen on {address}:{port}: {exc.strerror or exc}"
    return None
