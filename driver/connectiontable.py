"""What each client of a bounded HTTP server holds (driver/boundedhttp.py): the limits, and the table
of open connections that enforces them.

`ConnectionTable` admits a connection (at the cap it evicts an idle keep-alive connection, else the one
waiting longest on its client; never one whose request is being answered), tracks each connection's
deadline (whole request, or idle between requests), reserves request bodies against the shared body
budget (evicting the oldest slow senders to make room), and kills connections past their deadline by
shutting their sockets down, which ends the blocked read of their threads. Standard library and
structlog.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

_EVICTION_WAIT_S = 0.5
"""How long a new connection waits for an evicted one's thread to let go (it is woken at once)."""

Reject = Callable[[str], None]
"""Called with why a connection or request was refused: capacity (shed at accept), evicted, deadline,
headers_too_large, body_too_large, busy (the body budget is spent)."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    request_deadline_s: float
    idle_timeout_s: float
    max_header_bytes: int = 16 * 1024
    max_body: int = 0
    """0: the server reads no bodies."""
    body_budget: int = 0
    """0: `max_connections * max_body`."""
    poll_s: float = 0.25
    """How often deadlines are checked (they hold to within this)."""


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    since: float
    """When it began waiting on its client (oldest is displaced first)."""
    deadline: float
    idle: bool = False
    busy: bool = False
    """Its request is complete and being answered: no deadline, never displaced."""
    reserved: int = 0
    closed_for: str | None = None
    served: int = 0


class ConnectionTable:
    """The open connections of one server, their deadlines and the body bytes they hold."""

    def __init__(self, limits: Limits, on_reject: Reject | None) -> None:
        self.limits = limits
        self._on_reject = on_reject or (lambda reason: None)
        self._cond = threading.Condition()
        self._conns: dict[socket.socket, Connection] = {}
        self._reserved = 0
        self._budget = limits.body_budget or limits.max_connections * limits.max_body

    def __len__(self) -> int:
        with self._cond:
            return len(self._conns)

    @property
    def reserved(self) -> int:
        """Bytes of the body budget taken now."""
        with self._cond:
            return self._reserved

    def admit(self, sock: socket.socket) -> Connection | None:
        """A slot for a new connection, displacing the one waiting longest on its client; None: shed."""
        cap = self.limits.max_connections
        with self._cond:
            # Wait only for a connection already told to go: when every one is busy, shed at once.
            full = len(self._conns) >= cap
            if full and (any(c.closed_for for c in self._conns.values()) or self._evict_oldest()):
                self._cond.wait_for(lambda: len(self._conns) < cap, _EVICTION_WAIT_S)
            if len(self._conns) >= cap:
                self.reject("capacity")
                return None
            now = time.monotonic()
            conn = Connection(sock, now, now + self.limits.request_deadline_s)
            self._conns[sock] = conn
            return conn

    def of(self, sock: socket.socket) -> Connection:
        with self._cond:
            return self._conns[sock]

    def release(self, conn: Connection) -> None:
        """Called before the socket is closed: a socket in the table is never closed under `_kill`."""
        with self._cond:
            self._conns.pop(conn.sock, None)
            self._reserved -= conn.reserved
            conn.reserved = 0
            self._cond.notify_all()

    def waiting(self, conn: Connection, *, idle: bool = False) -> None:
        """From now on `conn` waits on its client: for its next request (idle) or the rest of one."""
        now = time.monotonic()
        with self._cond:
            conn.since, conn.idle, conn.busy = now, idle, False
            limit = self.limits.idle_timeout_s if idle else self.limits.request_deadline_s
            conn.deadline = now + limit

    def set_busy(self, conn: Connection) -> None:
        with self._cond:
            if conn.closed_for is not None:  # closed as its body completed: do no work for it
                raise ConnectionAbortedError(f"connection closed ({conn.closed_for})")
            conn.busy = True

    def reserve(self, conn: Connection, size: int) -> bool:
        """Take `size` bytes of the body budget, closing the oldest slow senders if that makes room;
        False at once when only bodies being answered hold it."""
        budget = self._budget
        end = time.monotonic() + _EVICTION_WAIT_S
        with self._cond:
            while self._reserved + size > budget:
                leaving = sum(c.reserved for c in self._conns.values() if c.closed_for)
                if self._reserved - leaving + size > budget:
                    holders = [
                        c
                        for c in self._conns.values()
                        if c.reserved and not c.busy and c.closed_for is None and c is not conn
                    ]
                    if holders:
                        self._kill(min(holders, key=lambda c: c.since), "evicted")
                        continue
                    if not leaving:
                        return False
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._reserved += size
            conn.reserved += size
            return True

    def unreserve(self, conn: Connection) -> None:
        with self._cond:
            self._reserved -= conn.reserved
            conn.reserved = 0
            self._cond.notify_all()

    def expire(self) -> None:
        """Close every connection past its deadline (idle ones silently: that is keep-alive's end)."""
        now = time.monotonic()
        with self._cond:
            for conn in list(self._conns.values()):
                if not conn.busy and conn.closed_for is None and conn.deadline <= now:
                    self._kill(conn, "idle" if conn.idle else "deadline")

    def _evict_oldest(self) -> bool:
        waiting = [c for c in self._conns.values() if not c.busy and c.closed_for is None]
        if not waiting:
            return False
        # An idle keep-alive connection first: closing it costs its client only a reconnect.
        self._kill(min(waiting, key=lambda c: (not c.idle, c.since)), "evicted")
        return True

    def _kill(self, conn: Connection, reason: str) -> None:
        conn.closed_for = reason
        if not (conn.idle and reason in ("idle", "evicted")):  # the end of keep-alive is no refusal
            self.reject(reason)
        with contextlib.suppress(OSError):
            # The plain socket's shutdown (not SSLSocket's, which drops its TLS state under the
            # connection's thread): the thread's blocked read sees end of file and returns.
            socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

    def reject(self, reason: str) -> None:
        log.debug("http connection refused", reason=reason)
        try:
            self._on_reject(reason)
        except Exception:  # a failing metric must not take the server down
            log.warning("counting a refused connection failed", exc_info=True)
