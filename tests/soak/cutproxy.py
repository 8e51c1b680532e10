"""A TCP proxy between a controller replica and kube-apiserver that, while cutting, lets requests through
and then drops their responses: the API server has applied the write, the controller never hears so.

TLS passes through untouched (the controller still verifies the API server's certificate), so the
proxy cannot read a request; it works on the exchange instead. HTTP/1.1 over one connection alternates
request and response: when the client has sent and the server's first bytes come back, the proxy, with
probability `cut_rate`, closes both sides instead of forwarding them. Only exchanges whose request
was at least `min_request_bytes` long are cut: with the bearer token every request is over 1 KiB, and
a claim written whole (its spec, finalizer, allocation) is the largest, so a threshold aims the cuts at
the writes that matter (their outcome unknown) instead of the watches and reads (retried anyway).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading


class ResponseCutter:
    def __init__(self, upstream_port: int, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.cut_rate = 0.0
        self.min_request_bytes = 0
        self.cuts = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:  # the API server is down (a fault of its own): refuse like it would
                client.close()
                continue
            state = {"sent": 0}
            threading.Thread(target=self._up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict[str, int]) -> None:
        """Client -> server; counts the bytes of the request going out."""
        try:
            while data := client.recv(65536):
                state["sent"] += len(data)
                upstream.sendall(data)
        except OSError:
            pass
        _close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict[str, int]) -> None:
        """Server -> client; the first bytes answering a request may be dropped with the connection."""
        try:
            while data := upstream.recv(65536):
                if state["sent"]:
                    sent, state["sent"] = state["sent"], 0
                    if sent >= self.min_request_bytes and self._cut_now():
                        break
                client.sendall(data)
        except OSError:
            pass
        _close(client, upstream)

    def _cut_now(self) -> bool:
        with self._lock:
            if self.cut_rate <= 0 or self._rng.random() >= self.cut_rate:
                return False
            self.cuts += 1
            return True


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()
