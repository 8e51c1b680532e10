"""The `flexmig controller` process: every background loop under a LoopRunner, one health endpoint.

Loops (each a driver/looprunner.py LoopRunner, so any exception, urllib3's MaxRetryError and
ReadTimeoutError included, is retried with backoff and never ends the loop):
- one reflector per watched resource (controller/kube/watchcache.py);
- the allocation loop (controller/allocation/loop.py), in the calling thread;
- leader election (controller/kube/leader.py), when enabled;
- the in-process webhook's maintenance (certificate, caBundle, template GC), when enabled, and its
  shim template sync (controller/webhook/templatesync.py);
- the metrics port's accept loop (controller/runtime/health.py), which serves /healthz: 503 naming any loop
  that is dead or stuck.

Leadership: the `Writer` is built with the elector's `is_leader`, so every write checks leadership
right before it is sent (controller/kube/writer.py raises `NotLeader`); the allocation loop also checks it
once per step, and the webhook's maintenance before its leader-only writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from controller.allocation.loop import Controller
from controller.allocation.moves import Moves, MoveSettings
from controller.allocation.nominate import HOLD_S
from controller.allocation.preempt import Preemption
from controller.allocation.writepool import DEFAULT_WRITE_CONCURRENCY
from controller.kube.leader import LeaderElector
from controller.kube.roomstore import RoomStore
from controller.kube.watchcache import STUCK_AFTER_S, WatchCache
from controller.kube.writer import Writer
from controller.runtime.health import HealthServer
from controller.runtime.metrics import ControllerMetrics
from driver.looprunner import LoopGroup, LoopRunner
from driver.policy.placer import BURST_PLAN_BUDGET_S, Policy

log = structlog.get_logger(__name__)


class Webhook(Protocol):
    """What the process needs of controller/webhook/service.py's WebhookService."""

    stop_event: threading.Event
    serving: threading.Event

    def tick(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ProcessOptions:
    identity: str
    lease_namespace: str = "kube-system"
    leader_elect: bool = True
    metrics_port: int | None = None  # None: no metrics/health port; 0: any free port
    metrics_address: str = "0.0.0.0"
    policy: Policy | None = None
    burst_budget_s: float = BURST_PLAN_BUDGET_S  # 0: no burst plans (driver/policy/burstplan.py)
    write_concurrency: int = DEFAULT_WRITE_CONCURRENCY  # pods written at once (allocation/writepool.py)
    preemption: bool = True  # evict lower-priority pods for a pod that fits nowhere (docs/preemption.md)
    preemption_hold_s: float = HOLD_S
    moves: MoveSettings = field(
        default_factory=MoveSettings
    )  # moving movable pods to make room (docs/moves.md): off
    webhook_tick_s: float = 10.0
    reflector_stuck_after_s: float = STUCK_AFTER_S
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0


class ControllerProcess:
    def __init__(
        self,
        api: Any,
        options: ProcessOptions,
        *,
        webhook: Callable[[Callable[[], bool], ControllerMetrics], Webhook] | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.metrics = metrics or ControllerMetrics()
        self.loops = LoopGroup()
        self.stop_event = threading.Event()
        self.health: HealthServer | None = None
        self._health_started = False
        if options.metrics_port is not None:  # bound now: a port in use is an error at start
            self.health = HealthServer(
                self.metrics.registry,
                options.metrics_address,
                options.metrics_port,
                self.loops,
                on_error=self._count("metrics-http"),
            )
        self.elector: LeaderElector | None = None
        if options.leader_elect:
            self.elector = LeaderElector(
                api,
                options.lease_namespace,
                options.identity,
                lease_s=options.lease_s,
                renew_deadline_s=options.renew_deadline_s,
                retry_s=options.retry_s,
                on_error=self._count("leader-election"),
            )
            self.loops.add(self.elector.runner)
        elector = self.elector
        self.writer = Writer(
            api,
            is_leader=self.leading,
            write_budget=(lambda: None) if elector is None else elector.write_budget,
        )
        self.cache = WatchCache.for_api(
            api,
            stuck_after_s=options.reflector_stuck_after_s,
            on_error=lambda name, _exc: self.metrics.loop_errors.labels(f"reflector-{name}").inc(),
        )
        for runner in self.cache.runners:
            self.loops.add(runner)
        self.controller = Controller(
            self.cache,
            self.writer,
            policy=options.policy,
            burst_budget_s=options.burst_budget_s,
            write_concurrency=options.write_concurrency,
            metrics=self.metrics,
            is_leader=self.leading,
            room_store=RoomStore(self.writer, options.lease_namespace),
            preemption=Preemption(
                self.metrics.registry,
                enabled=options.preemption,
                hold_s=options.preemption_hold_s,
                moves=Moves(options.moves, self.metrics.registry),
            ),
        )
        self.webhook: Webhook | None = None
        self.webhook_runner: LoopRunner | None = None
        self.webhook_loops: list[LoopRunner] = []
        if webhook is not None:
            self.webhook = webhook(self.leading, self.metrics)
            self.webhook_runner = self.loops.add(self._webhook_loop(self.webhook))
            # Its own loops (the shim template sync), under the same /healthz; they stop with it.
            self.webhook_loops = [self.loops.add(r) for r in getattr(self.webhook, "loops", ())]

    def _count(self, loop: str) -> Callable[[Exception], None]:
        return lambda _exc: self.metrics.loop_errors.labels(loop).inc()

    def leading(self) -> bool:
        value = self.elector is None or self.elector.is_leader()
        self.metrics.set_leader(value)
        return value

    def _webhook_loop(self, webhook: Webhook) -> LoopRunner:
        """The webhook's maintenance tick: every second until it serves, then every `webhook_tick_s`."""
        last = [float("-inf")]

        def body() -> None:
            now = time.monotonic()
            if webhook.serving.is_set() and now - last[0] < self.options.webhook_tick_s:
                return
            last[0] = now
            webhook.tick()

        return LoopRunner(
            "webhook-maintenance",
            body,
            interval_s=1.0,
            stop=webhook.stop_event,
            stuck_after_s=120.0,
            on_error=self._count("webhook-maintenance"),
        )

    @property
    def metrics_port(self) -> int | None:
        return None if self.health is None else self.health.port

    def start_health(self) -> None:
        """Serve /metrics and /healthz from now on (once; run() calls it too), so that the start-up
        preflight's flexmig_preflight_ok is served while it waits (flexmig/commands/controller.py)."""
        if self.health is not None and not self._health_started:
            self._health_started = True
            self.health.start()
            log.info("metrics and health listening", port=self.health.port)

    def run(self) -> None:
        """Run until `stop_event` is set; the allocation loop runs in the calling thread."""
        self.start_health()
        if self.elector is not None:
            self.elector.start()
        if self.webhook_runner is not None:
            self.webhook_runner.start()
        for runner in self.webhook_loops:
            runner.start()
        try:
            self.controller.run(self.stop_event.is_set, runner=self.loops.add)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self.stop_event.set()
        if self.elector is not None:
            # Lead no more, then wait for the writes in flight: a Lease released while one can still
            # land would let the next leader decide without seeing it (controller/allocation/catchup.py).
            # First, so that a rolling update's standby takes over while the rest shuts down.
            self.elector.resign(release=False)
            drained = self.writer.drain()
            self.elector.resign(release=drained)
            if not drained:
                log.warning("writes still in flight at shutdown; the lease is left to expire")
            self.elector.stop()
            self.elector.join(timeout=5)
        self.cache.stop()
        if self.webhook is not None:
            self.webhook.stop()
        if self.webhook_runner is not None:
            self.webhook_runner.join(5)
        for runner in self.webhook_loops:
            runner.join(5)
        if self.health is not None:
            self.health.stop()


__all__ = ["ControllerProcess", "ProcessOptions", "Webhook"]
