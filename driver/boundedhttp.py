"""An HTTP server that a hostile client cannot grow without bound: every port flexmig serves (the
webhook's HTTPS port, the metrics/liveness port of both processes) is built on it.

What a client can hold, and for how long (`Limits`):
- at most `max_connections` connections, each one thread; at the cap a new connection takes the
  place of an idle keep-alive connection or else of the one that has waited longest on its client
  (still sending its handshake, headers or body). A connection whose request is complete and being
  answered is never closed for another. Only when every connection is being answered is the new one
  shed: closed at once, after a best-effort `503` on plain HTTP (`shed_reply`);
- `request_deadline_s` for a whole request, from the connection's accept (TLS handshake included) or
  from the first byte of a kept-alive connection's next request, to the last byte of its body: a client
  trickling one byte per read is closed at the deadline, not after every read's timeout;
- `idle_timeout_s` between requests on a kept-alive connection;
- `max_header_bytes` for the request line and headers together (431 beyond it), `max_body` for a body
  (413 without reading it), and `body_budget` for the bodies of all connections together: a body that
  does not fit even after the oldest slow senders are closed is answered 503 with `Retry-After`.

So memory is bounded by about `body_budget + max_connections * (max_header_bytes + buffers)`, and a
prompt client always finds room while slow ones hold every connection: it displaces the oldest.

Deadlines are enforced by `service_actions()`, which `serve_forever` calls every poll interval (a
server driven by `handle_request` calls it itself): it shuts down the socket of every connection past
its deadline, which ends the blocked read of the connection's thread (the table of connections and
what each may hold: driver/connectiontable.py). Standard library and structlog.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from driver.connectiontable import Connection, ConnectionTable, Limits, Reject

log = structlog.get_logger(__name__)

_READ_CHUNK = 64 * 1024
SHED_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
)


class _HeaderReader:
    """The connection's input, with a budget on what the request line and headers may take."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.left = 0

    def readline(self, limit: int = -1) -> bytes:
        if self.left <= 0:
            raise http.client.LineTooLong("request headers")  # parse_request answers 431
        line: bytes = self.raw.readline(self.left if limit < 0 else min(limit, self.left))
        self.left -= len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.raw.read(size)
        return data

    def peek(self, size: int = 1) -> bytes:
        data: bytes = self.raw.peek(size)
        return data

    def close(self) -> None:
        self.raw.close()


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    """A burst waits in the kernel's accept queue (no memory of ours) instead of being refused."""
    shed_reply: bytes | None = SHED_REPLY

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BoundedHandler],
        limits: Limits,
        on_reject: Reject | None = None,
    ) -> None:
        self.limits = limits
        self.connections = ConnectionTable(limits, on_reject)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = self.connections.admit(request)
        if conn is None:
            self._shed(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(request, client_address, conn), name="http-conn", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: shed it like a connection over the cap
            self.connections.release(conn)
            self._shed(request)

    def _serve(self, request: Any, client_address: Any, conn: Connection) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.connections.release(conn)
            self.shutdown_request(request)

    def _shed(self, request: Any) -> None:
        if self.shed_reply:
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(self.shed_reply)
        self.shutdown_request(request)

    def service_actions(self) -> None:
        self.connections.expire()

    def serve(self) -> None:
        """`serve_forever`, waking every `limits.poll_s` to enforce deadlines."""
        self.serve_forever(poll_interval=self.limits.poll_s)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            # A client that drops the connection, fails the handshake or is closed at its deadline or
            # for a newer one is not the server's problem (and a traceback each would slow shedding).
            log.debug("http connection ended", client=str(client_address), error=repr(error))
        else:
            log.warning("http request failed", client=str(client_address), exc_info=True)


class BoundedHandler(BaseHTTPRequestHandler):
    """Subclasses answer in do_*: `read_body()` for a request's body, `busy()` around their own work."""

    server: BoundedHTTPServer
    conn: Connection

    def setup(self) -> None:
        self.conn = self.server.connections.of(self.request)
        # Every read also times out on its own, in case the deadline sweep is not running.
        limits = self.server.limits
        self.request.settimeout(max(limits.request_deadline_s, limits.idle_timeout_s))
        self.start_connection()
        super().setup()  # `timeout` is None: it keeps the socket's
        self.rfile = _HeaderReader(self.rfile)  # type: ignore[assignment]

    def start_connection(self) -> None:
        """Before the first request (the webhook's TLS handshake), under the first request's deadline."""

    def handle_one_request(self) -> None:
        table = self.server.connections
        reader: _HeaderReader = self.rfile  # type: ignore[assignment]
        try:
            if self.conn.served:
                table.waiting(self.conn, idle=True)
                try:
                    if not reader.peek(1):
                        self.close_connection = True
                        return
                except (TimeoutError, OSError):
                    self.close_connection = True
                    return
                table.waiting(self.conn)
            self.conn.served += 1
            reader.left = self.server.limits.max_header_bytes
            super().handle_one_request()
        finally:
            table.unreserve(self.conn)

    def handle_expect_100(self) -> bool:
        # Deferred to read_body: "100 Continue" only once the announced body is acceptable.
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if code == 431:
            self.server.connections.reject("headers_too_large")
        super().send_error(code, message, explain)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """The request is complete: our own work has no deadline and is never displaced; what follows
        (writing the response) waits on the client again."""
        self.server.connections.set_busy(self.conn)
        try:
            yield
        finally:
            self.server.connections.waiting(self.conn)

    def refuse(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        """Answer without reading the body, and close: on a kept-alive connection the unread body
        would be parsed as the next request."""
        self.close_connection = True
        body = text.encode()
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain", **(headers or {}), "Connection": "close"}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes | None:
        """The request's body, or None once the request was refused (411, 400, 413, 503) or the
        client went away. Read as it arrives: an announced length takes budget, not memory."""
        limits = self.server.limits
        if "Transfer-Encoding" in self.headers:
            self.refuse(411, "chunked bodies are not accepted; send Content-Length\n")
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.refuse(411, "Content-Length required\n")
            return None
        try:
            length = int(raw)
        except ValueError:
            self.refuse(400, f"Content-Length {raw!r} is not a number\n")
            return None
        if length < 0:
            self.refuse(400, f"Content-Length {length} is negative\n")
            return None
        if length > limits.max_body:
            self.server.connections.reject("body_too_large")
            self.refuse(413, f"body of {length} bytes; at most {limits.max_body}\n")
            return None
        if not self.server.connections.reserve(self.conn, length):
            self.server.connections.reject("busy")
            self.refuse(503, "too many request bodies in flight; retry\n", {"Retry-After": "1"})
            return None
        if self.headers.get("Expect", "").lower() == "100-continue" and self.request_version != "HTTP/1.0":
            self.send_response_only(100)
            self.end_headers()
        chunks: list[bytes] = []
        left = length
        reader: _HeaderReader = self.rfile  # type: ignore[assignment]
        while left > 0:
            chunk = reader.read(min(left, _READ_CHUNK))
            if not chunk:  # the client left, or was closed at its deadline or for a newer one
                self.close_connection = True
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", message=format % args)


__all__ = [
    "SHED_REPLY",
    "BoundedHTTPServer",
    "BoundedHandler",
    "Connection",
    "ConnectionTable",
    "Limits",
    "Reject",
]
