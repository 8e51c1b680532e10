"""Waiting until one of our own writes comes back on the watch.

Why: in controller mode the controller writes a claim's allocation, then removes the pod's scheduling
gate. kube-scheduler sees the pod through its pod watch and the claim through its claim watch; when the
pod event is handled first, its DRA plugin finds the claim unallocated, allocates it itself, and fails
in PreBind ("got allocated elsewhere in the meantime"): the pod goes to the scheduler's backoff queue
and starts seconds later (benchmarks/RESULTS.md, "End to end"). Removing the gate only once the
controller's own claim watch has delivered the allocation makes that order the usual one: both watches
are fed by the same API server watch cache, and the gate write and its event come after.

It narrows the race and cannot close it (another client's watch can lag ours); kube-scheduler still
handles the loss correctly, only later. A wait that times out releases the pod anyway.

Thread-safety: the reflector thread calls `seen`; write workers (or the controller thread) call
`wait`. The event can arrive before the writer starts waiting (the write's answer and the watch event
race too), so the newest version of the last `RECENT` keys seen is kept: a bounded map, one dict
update per watch event.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

RECENT = 4096  # keys whose newest watched version is remembered; bursts larger than this just wait


@dataclass(slots=True)
class _Waiter:
    version: int
    done: threading.Event = field(default_factory=threading.Event)


class WatchEcho:
    """Per object key, the waiters for a resourceVersion (an etcd revision) to show on the watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, list[_Waiter]] = {}
        self._recent: OrderedDict[str, int] = OrderedDict()

    def seen(self, key: str, version: int | None) -> None:
        """The watch (or a list) delivered `key` at `version`."""
        if version is None:
            return
        with self._lock:
            if version > self._recent.get(key, -1):
                self._recent[key] = version
            self._recent.move_to_end(key)
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)
            waiters = self._waiting.get(key)
            if not waiters:
                return
            keep = []
            for w in waiters:
                if w.version <= version:
                    w.done.set()
                else:
                    keep.append(w)
            if keep:
                self._waiting[key] = keep
            else:
                del self._waiting[key]

    def wait(self, versions: dict[str, int], timeout_s: float) -> bool:
        """Block until every key has shown at least its version, or `timeout_s` passed; whether all did."""
        if not versions or timeout_s <= 0:
            return not versions
        registered: list[tuple[str, _Waiter]] = []
        with self._lock:
            for key, version in versions.items():
                if self._recent.get(key, -1) >= version:
                    continue
                w = _Waiter(version)
                self._waiting.setdefault(key, []).append(w)
                registered.append((key, w))
        deadline = time.monotonic() + timeout_s
        ok = all(w.done.wait(max(0.0, deadline - time.monotonic())) for _, w in registered)
        if not ok:
            with self._lock:
                for key, w in registered:
                    left = [x for x in self._waiting.get(key, ()) if x is not w]
                    if left:
                        self._waiting[key] = left
                    else:
                        self._waiting.pop(key, None)
        return ok

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(ws) for ws in self._waiting.values())


__all__ = ["WatchEcho"]
