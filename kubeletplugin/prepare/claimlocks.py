"""Who may touch a GPU's instances right now: per-GPU locks, per-claim locks, and the claims kubelet is
working on.

Prepare, unprepare and the periodic reconcile all change instances and the checkpoint; they take the
locks of the GPUs involved (always in ascending index order, so two holders never deadlock). A kubelet
request (prepare or unprepare) also holds its claim's lock for the whole call (`working_on`), taken
before any GPU lock: prepare lets go of the GPU locks once its instances exist and are recorded, and
the claim lock keeps an unprepare or a retried prepare of the same claim out of the rest (CDI spec,
`PrepareCompleted`). The reconcile takes no claim lock: it leaves alone any claim a kubelet request is
working on (or waiting to work on), since a `PrepareStarted` entry of a live request is not stale.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator


class ClaimLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._gpu: dict[int, threading.Lock] = {}
        self._in_flight: dict[str, int] = {}  # claim uid -> running calls
        self._claim: dict[str, tuple[threading.Lock, list[int]]] = {}  # uid -> (lock, [holders+waiters])

    @contextlib.contextmanager
    def gpus(self, indexes: Iterable[int]) -> Iterator[None]:
        """Hold the locks of `indexes`, taken in ascending order."""
        with self._guard:
            locks = [self._gpu.setdefault(i, threading.Lock()) for i in sorted(set(indexes))]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    @contextlib.contextmanager
    def _claim_lock(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._claim.setdefault(uid, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._guard:
                users[0] -= 1
                if users[0] == 0:
                    del self._claim[uid]  # locks of finished claims do not pile up

    @contextlib.contextmanager
    def working_on(self, uid: str) -> Iterator[None]:
        """Mark claim `uid` as being prepared or unprepared by a request, and hold its lock (one request
        per claim at a time), for the duration. The mark comes first, so it covers the wait too."""
        with self._guard:
            self._in_flight[uid] = self._in_flight.get(uid, 0) + 1
        try:
            with self._claim_lock(uid):
                yield
        finally:
            with self._guard:
                left = self._in_flight[uid] - 1
                if left:
                    self._in_flight[uid] = left
                else:
                    del self._in_flight[uid]

    def in_flight(self, uid: str) -> bool:
        with self._guard:
            return uid in self._in_flight
