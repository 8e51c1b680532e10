"""A TCP forwarder standing in for the webhook's Service: the API server calls one address, the
forwarder passes each connection (TLS untouched) to the first controller replica that accepts it.

`pause()` closes the listening socket, so the API server's calls are refused as they would be with no
ready endpoint behind the Service; `resume()` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence


class TcpForwarder:
    def __init__(self, port: int, backends: Callable[[], Sequence[int]]) -> None:
        self.port = port
        self.backends = backends  # ports of the replicas, asked at every new connection
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = (
            set()
        )  # live connections, cut on pause (the API server keeps them alive)

    def start(self) -> TcpForwarder:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        with self._lock:
            self._listener = sock
        self._thread = threading.Thread(target=self._accept, args=(sock,), name="webhook-fwd", daemon=True)
        self._thread.start()
        return self

    resume = start

    def pause(self) -> None:
        with self._lock:
            sock, self._listener = self._listener, None
        with self._lock:
            live, self._open = list(self._open), set()
        for conn in ([sock] if sock is not None else []) + live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    stop = pause

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._listener is None

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return  # closed by pause()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        for port in self.backends():
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
                upstream.settimeout(None)
                break
            except OSError:
                continue
        if upstream is None:
            client.close()
            return
        with self._lock:
            if self._listener is None:  # paused meanwhile
                client.close()
                upstream.close()
                return
            self._open.update((client, upstream))

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(30)
        with self._lock:
            self._open.discard(client)
            self._open.discard(upstream)
        client.close()
        upstream.close()
