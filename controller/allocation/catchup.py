"""A new leader's first decision is made on the server's current state, not on its cache's.

A standby's cache follows the watch, which may run seconds behind the leader's writes. Deciding on it
right after a handover can give the devices of the previous leader's last allocations again (a rolling
update hands over on every replica). So on becoming leader, before anything is decided, the claims and
pods are listed afresh (a LIST without resourceVersion is a consistent read from etcd) and applied.
Every write of the previous leader has landed by then: a leader's writes end before its Lease can pass
(controller/kube/writer.py, write deadlines) and it gives the Lease up only once they have
(controller/runtime/process.py).
"""

from __future__ import annotations

import structlog

from controller.kube.store import Event
from controller.kube.watchcache import WatchCache
from controller.runtime.metrics import ControllerMetrics

log = structlog.get_logger(__name__)

CATCH_UP = ("resourceclaims", "pods")
"""What a decision reads that another leader writes (slices, classes and nodes it never writes)."""


class LeaderCatchUp:
    def __init__(self, cache: WatchCache, metrics: ControllerMetrics, *, enabled: bool = True) -> None:
        self.cache = cache
        self.metrics = metrics
        self.enabled = enabled
        self.done = not enabled

    def lost(self) -> None:
        """Not leading (any more): the next time this replica leads, it catches up again."""
        self.done = not self.enabled

    def fresh_lists(self) -> list[Event]:
        events = self.cache.fresh_lists(CATCH_UP)
        self.metrics.catch_ups.inc()
        log.info("caught up with the server before the first decision as leader", resources=CATCH_UP)
        return events

    def finished(self) -> None:
        self.done = True


__all__ = ["CATCH_UP", "LeaderCatchUp"]
