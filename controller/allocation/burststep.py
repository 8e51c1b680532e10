"""One controller step's burst plan: which pending pods are planned together, and when not to retry.

The step (controller/allocation/loop.py `Controller.step`) asks `BurstPlanning.plan` before deciding
its pods: the placer picks the burst (driver/policy/placer.py `Placer.burst_group`: the one-device MIG
pods asking for memory only, all with the same node constraints) and plans it on the nodes those pods
may use (`Placer.plan_burst`, driver/policy/burstplan.py). The keys of the pods the plan placed come
back: only those follow it. Advice only: a plan that fails is no plan, and every pod is decided by
the policy alone. Its time is `flexmig_controller_burst_plan_seconds` (the step's pods wait for it,
up to the budget). A group whose plan ran out of budget (or placed nothing) is not planned again for
`retry_after_s`: it would cost the budget every step for nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence

import structlog

from controller.runtime.metrics import ControllerMetrics
from driver.policy.cluster import ClusterState
from driver.policy.placer import Placer, PodSize

log = structlog.get_logger(__name__)

_MAX_REMEMBERED = 1024  # skipped groups remembered; past this, the expired ones are dropped


class BurstPlanning:
    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self._skipped: dict[Hashable, float] = {}  # plan key -> when to try again

    def plan(
        self,
        placer: Placer,
        metrics: ControllerMetrics,
        cluster: ClusterState,
        order: Sequence[str],
        sizes: Sequence[PodSize | None],
        node_filter: Callable[[str], Callable[[str], bool]],
    ) -> set[str]:
        """Plan the burst among `order` (pod keys, with their `sizes`); `node_filter(key)` is where
        that pod may run. Returns the keys of the pods the plan placed (empty: no plan)."""
        group = placer.burst_group(sizes)
        if not group:
            return set()  # nothing to plan together: no time spent, nothing observed
        first = sizes[group[0]]
        plan_key = None if first is None else first.plan_key
        now = time.monotonic()
        if self._skipped.get(plan_key, 0.0) > now:
            return set()
        began = time.perf_counter()
        try:
            burst = [s for s in (sizes[i] for i in group) if s is not None]
            planned = placer.plan_burst(cluster, burst, node_filter(order[group[0]]))
        except Exception as exc:  # never worth failing a step for
            placer.end_burst()
            metrics.burst_plan_latency.labels("failed").observe(time.perf_counter() - began)
            log.exception("burst plan failed; deciding pod by pod", error=str(exc))
            return set()
        took = time.perf_counter() - began
        metrics.burst_plan_latency.labels("planned" if planned else "skipped").observe(took)
        log.debug("burst planned", pods=len(group), planned=planned, seconds=round(took, 4))
        if not planned:
            if len(self._skipped) >= _MAX_REMEMBERED:
                self._skipped = {k: t for k, t in self._skipped.items() if t > now}
            self._skipped[plan_key] = now + self.retry_after_s
            return set()
        return {order[i] for i in group}


__all__ = ["BurstPlanning"]
