"""Who may touch a GPU's instances right now: per-GPU locks, and the claims kubelet is working on.

Prepare, unprepare and the periodic reconcile all change instances and the checkpoint; they take the
locks of the GPUs involved (always in ascending index order, so two holders never deadlock). The
reconcile also leaves alone any claim a kubelet request is working on, since a `PrepareStarted` entry
of a live request is not stale.
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
    def working_on(self, uid: str) -> Iterator[None]:
        """Mark claim `uid` as being prepared or unprepared by a request for the duration."""
        with self._guard:
            self._in_flight[uid] = self._in_flight.get(uid, 0) + 1
        try:
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
