"""The HTTPS endpoint the API server calls: stdlib `ThreadingHTTPServer` with `ssl`, one thread per
connection, the TLS context swapped (not mutated) when the certificate changes.

Every accepted connection is wrapped with the context current at that moment, and its handshake runs
in the connection's own thread under a timeout, so a slow or silent client never stalls the accept
loop, and a rotated certificate applies to the next connection without a restart.
"""

from __future__ import annotations

import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import structlog

from controller.webhook.certs import CertBundle

log = structlog.get_logger(__name__)

MAX_BODY = 8 * 1024 * 1024
"""The API server sends at most one object (etcd's 1.5 MiB limit) plus the old one; more is not a review."""
CONNECTION_TIMEOUT_S = 30.0

Handler = Callable[[bytes], tuple[int, bytes]]
"""Request body -> (HTTP status, JSON response body)."""


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], tls: TlsState, handler: Handler, path: str) -> None:
        self.tls = tls
        self.review_handler = handler
        self.webhook_path = path
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _RequestHandler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        context = self.tls.context
        if context is None:  # not reachable: the server is only started once a certificate exists
            sock.close()
            raise OSError("no TLS certificate yet")
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops the connection or fails the handshake is not the server's problem.
        log.debug("webhook connection failed", client=str(client_address), exc_info=True)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections
    timeout = CONNECTION_TIMEOUT_S

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook http", message=format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, text: str) -> None:
        """Answer without reading the body, and close: on a kept-alive connection the unread body
        would be parsed as the next request."""
        self.close_connection = True
        self._send(status, text.encode(), "text/plain")

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            self._send(200, b"ok\n", "text/plain")
        else:
            self._refuse(404, "not found\n")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != self.server.webhook_path:
            self._refuse(404, f"no webhook at {self.path}; it is at {self.server.webhook_path}\n")
            return
        raw = self.headers.get("Content-Length")
        if raw is None:
            self._refuse(411, "Content-Length required\n")
            return
        try:
            length = int(raw)
        except ValueError:
            self._refuse(400, f"Content-Length {raw!r} is not a number\n")
            return
        if length < 0:
            self._refuse(400, f"Content-Length {length} is negative\n")
            return
        if length > MAX_BODY:
            self._refuse(413, f"body of {length} bytes; at most {MAX_BODY}\n")
            return
        body = self.rfile.read(length)
        status, response = self.server.review_handler(body)
        self._send(status, response)


class WebhookServer:
    def __init__(self, address: str, port: int, path: str, handler: Handler, tls: TlsState) -> None:
        self._server = _Server((address, port), tls, handler, path)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-https", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

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
