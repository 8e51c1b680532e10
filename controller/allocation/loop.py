"""The allocation loop (mode `controller`): gated pods -> allocated claims -> gate removed.

One thread owns all state: it applies watch events to the stores and the ledger, then places the
gated pods that became dirty (new, or capacity changed since they last failed) and deallocates claims
whose pods are gone. Only the leader writes; a standby keeps its cache warm.

Per pod (controller/allocation/allocate.py): decide all its claims at once, assume the devices in the ledger,
write every claim, then release the pod; all or nothing, never allocated twice. The writes of up to
`write_concurrency` pods overlap (controller/allocation/writepool.py); all are applied before a step ends.

Order (issue 12, queue-aware decisions): the pods dirty in one step (a burst, a Job's pods, every
waiting pod once capacity frees) are decided largest first: most requested memory, then most devices,
then oldest (driver/policy/placer.py `Placer.batch_order`; sizes from controller/allocation/podsize.py,
kept on the `Pending` record). Small pods decided first scatter over GPUs a larger one then finds no
room on; decided after it, they fill what it leaves. Each pod is still decided by the per-pod policy
on the state the pods before it leave (they are assumed in the ledger as they are written), so the
all-or-nothing and never-twice guarantees do not depend on the order. Pods whose size cannot be read
yet go after the sized ones, oldest first. When capacity frees, the largest waiting pod that fits
gets it first, and the smaller ones take what is left in the same step.

Ageing: a pod pending longer than `age_first_after_s` (default driver/policy/batch.py
`AGE_FIRST_AFTER_S`, 120 s) is decided before every younger pod, oldest first, so that a steady
supply of larger pods cannot take every freed GPU from it; the gauge
`flexmig_controller_oldest_pending_pod_seconds` shows the longest wait. Waits count from when this
process first saw the pod gated (`Pending.first_seen`): a restarted controller starts them again.

Exact plans: before deciding them, the step plans its burst together with the integer program of
driver/policy/burstplan.py (controller/allocation/burststep.py `BurstPlanning`, on the
cluster as the step finds it and the nodes the burst's pods may use): the one-device MIG pods whose
selectors ask for memory only, when they all have the same node constraints (a Job's pods), at most
`MAX_BURST_PODS` of them. Each of those pods then takes the first planned slot of its size that is
still free and that its own table allows; every other pod, and any planned pod whose slot is gone, is
decided by the policy. Largest first alone opened 1.058x the optimum GPU count on the H100-80GB
bursts of benchmarks/packing, the plan the optimum (tests/unit/controller/test_ctl_burstplan.py: a
burst only the plan fits). Pods with different constraints get no plan: a plan for one group does not
see what the others need, and following it placed less than pod by pod in some such steps. The plan
lives for the step only; a group whose plan ran out of budget waits `RESYNC_S` before the next try.

There is no gather window (holding new pods a few hundred ms so that a burst arriving over that time
is ordered together): it would add its length to every pod's allocation latency and need the loop
to wake up for it, for a gain only when pods become ready in the same fraction of a second. A step
already takes every event queued since the last one (controller/kube/watchcache.py
`WatchCache.next_batch`), and the pods that become ready while a step writes are ordered together in
the next.

Every object the controller writes goes into its cache as *assumed* (controller/kube/watchcache.py): the
watch's older versions of it (our own earlier writes) are ignored, and the ledger keeps an allocation
assumed until the watch shows it. One object the controller cannot process is skipped with a metric and
an Event (controller/allocation/skips.py); it never stops the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from controller.allocation.allocate import Pending, PodAllocation, StaleCache, allocated_devices
from controller.allocation.burststep import BurstPlanning
from controller.allocation.catchup import LeaderCatchUp
from controller.allocation.deallocate import ClaimChecks, has_finalizer
from controller.allocation.doublehold import DoubleHoldReporter
from controller.allocation.intake import EventIntake
from controller.allocation.lifetime import ClaimEnds
from controller.allocation.preempt import Preemption
from controller.allocation.roomsync import RoomSync
from controller.allocation.skips import SkipReporter
from controller.allocation.uncertain import UncertainClaims
from controller.allocation.writepool import PodWrites, WritePool, WritesStopped
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.claims.podclaims import LiveRefs
from controller.kube.roomstore import RoomStore
from controller.kube.watchcache import WatchCache
from controller.kube.writer import CONDITION_TYPE, NotLeader, Writer
from controller.runtime.metrics import ControllerMetrics, InstanceRows, Snapshot
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.looprunner import LoopRunner
from driver.policy.placer import AGE_FIRST_AFTER_S, BURST_PLAN_BUDGET_S, Placer, Policy

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
RESYNC_S = 30.0
STUCK_AFTER_S = 300.0  # one step beats per pod and claim; this long without one is a hung write


def _transient(exc: Exception) -> bool:
    """An error of the API or the network (retried), not of the object being processed."""
    return isinstance(exc, ApiException | OSError | HTTPError)


class Controller(EventIntake, PodAllocation, ClaimChecks):
    def __init__(
        self,
        cache: WatchCache,
        writer: Writer | None,
        *,
        policy: Policy | None = None,
        metrics: ControllerMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        age_first_after_s: float = AGE_FIRST_AFTER_S,
        burst_budget_s: float = BURST_PLAN_BUDGET_S,
        catch_up: bool = True,
        preemption: Preemption | None = None,
        write_concurrency: int = 1,
        room_store: RoomStore | None = None,
    ) -> None:
        self.cache = cache
        self.age_first_after_s = age_first_after_s
        self.writer = writer
        self.placer = Placer(policy, burst_budget_s)
        self.metrics = metrics or ControllerMetrics()
        self.is_leader = is_leader
        if writer is not None:  # leadership is checked before every write, not once per step
            writer_leads = writer.is_leader
            writer.is_leader = lambda: writer_leads() and is_leader()
        self.cel = CelEnvironment()
        self.ledger = Ledger(Inventory(()))
        self.index = CandidateIndex(self.ledger.inventory, self.cel)
        self.pending: dict[str, Pending] = {}
        self.dirty: set[str] = set()
        self.claims_to_check: set[str] = set()
        self.bursts = BurstPlanning(retry_after_s=RESYNC_S)
        self.pods_by_uid: dict[str, Obj] = {}
        self.live_refs = LiveRefs()
        # Lifetime hints of decided and running pods, by the claims they reference, so the ledger
        # knows the ends of allocations whichever of pod, claim and our own writes is seen first.
        self.claim_ends = ClaimEnds()
        self.hint_warned: dict[str, str] = {}
        self.skips = SkipReporter(self.metrics)
        self.uncertain = UncertainClaims(on_add=self.metrics.unknown_writes.inc)
        # Off only where no API server stands behind the cache (unit tests that feed events by hand).
        self.catch_up = LeaderCatchUp(cache, self.metrics, enabled=catch_up)
        self.double_holds = DoubleHoldReporter(self.metrics)
        self.preemption = preemption or Preemption(self.metrics.registry)
        # Its nominations and moves outlive this leadership (controller/allocation/roomsync.py).
        self.room = RoomSync(room_store, lambda stage: self.metrics.reconcile_errors.labels(stage).inc())
        self.preemption.persist = lambda: self.room.save(self.preemption)
        self.runner: LoopRunner | None = None
        self.writes = WritePool(write_concurrency)  # pods whose writes may be in flight at once
        self._slices_dirty = False
        self._instance_rows = InstanceRows()
        self._last_resync = 0.0

    # --- main loop ----------------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool], runner: Callable[[LoopRunner], LoopRunner] | None = None) -> None:
        """Apply events and step until `stop()`, in the calling thread. Any exception is retried with
        backoff (driver/looprunner.py); `runner` may register the loop with a health check."""
        self.cache.start()

        def once() -> None:
            if stop():
                loop.stop()
                return
            self.apply(self.cache.next_batch(timeout_s=1.0))
            self.step()

        loop = LoopRunner(
            "allocation",
            once,
            stuck_after_s=STUCK_AFTER_S,
            on_error=lambda _exc: self.metrics.loop_errors.labels("allocation").inc(),
        )
        self.runner = runner(loop) if runner is not None else loop
        self.runner.run()
        self.writes.close()
        self.cache.stop()

    def _beat(self) -> None:
        if self.runner is not None:
            self.runner.beat()

    def step(self) -> None:
        """Work on what is dirty (only when synced and leading); publish metrics."""
        if not self.cache.synced:
            return
        now = time.monotonic()
        if now - self._last_resync > RESYNC_S:
            self._last_resync = now
            self.dirty |= set(self.pending)
            self.claims_to_check |= {k for k, c in self.cache["resourceclaims"].items() if has_finalizer(c)}
        leading = self._leading()
        if not leading:
            self.catch_up.lost()
            self.room.lost()
        elif self.writer is not None and not self.catch_up.done:
            # A new leader's cache may not show the previous leader's last writes yet: deciding on it
            # could give their devices again. A fresh list first (it raises: the loop backs off).
            self.apply(self.catch_up.fresh_lists())
            self.catch_up.finished()
        self.double_holds.report(self.ledger, self.writer if leading else None, self.cache["resourceclaims"])
        if (
            leading
            and self.writer is not None
            and self.uncertain
            and self.uncertain.settle(self.writer, self.cache.stores["resourceclaims"], self.ledger)
        ):
            self.dirty |= set(self.pending)
        self.metrics.unsettled_writes.set(len(self.uncertain))
        if leading and self.writer is not None:
            self.room.restore_once(self.preemption, self.ledger)  # the last leader's promises, first
            self.preemption.start_step(self.ledger, self.cache["pods"], self.writer)  # holds first
            self.dirty |= self.preemption.budget.due() & self.pending.keys()  # searches put off
            order = self._decision_order()
            planned = self.bursts.plan(
                self.placer,
                self.metrics,
                self.ledger.cluster,
                order,
                [self._pod_size(k) for k in order],
                lambda key: self._node_filter(self.cache["pods"][key], []),
            )
            try:
                for key in order:
                    if not self.writes.make_room(self._applied):
                        break
                    self.dirty.discard(key)
                    self.placer.follow_plan(key in planned)
                    if not self._guard("allocate", self._process_pod, key):
                        self.dirty.add(key)
                        break
            finally:
                self.writes.drain(self._applied)  # every result applied before anything else runs
                self.placer.end_burst()
            for key in sorted(self.claims_to_check):
                self.claims_to_check.discard(key)
                if not self._guard("deallocate", self._check_claim, key):
                    self.claims_to_check.add(key)
                    break
            self.room.save(self.preemption)
        try:
            self._publish()
        except Exception as exc:  # metrics only: never worth stopping allocation for
            self.metrics.reconcile_errors.labels("publish").inc()
            log.exception("publishing metrics failed", error=str(exc))

    def _decision_order(self) -> list[str]:
        """The dirty pods, in the order this step decides them (see the module docstring): those
        pending `age_first_after_s` or longer first, oldest first; then largest first, then oldest;
        pods whose size is not known yet after the others, oldest first."""
        now = time.monotonic()
        by_age = sorted(
            self.dirty, key=lambda k: (self.pending[k].first_seen if k in self.pending else now, k)
        )
        sizes = [self._pod_size(k) for k in by_age]
        waited = [now - self.pending[k].first_seen if k in self.pending else 0.0 for k in by_age]
        return [by_age[i] for i in self.placer.batch_order(sizes, waited, self.age_first_after_s)]

    def _guard(self, stage: str, fn: Callable[[str], None], key: str) -> bool:
        """Run one reconcile; False when leadership was lost (stop writing at once)."""
        self._beat()
        try:
            fn(key)
        except NotLeader as exc:
            log.info("leadership lost mid-step; not writing", stage=stage, key=key, error=str(exc))
            return False
        except StaleCache as exc:  # the claim was read again; nothing more on this stale view
            log.info("cache found stale by a conflict; step ends", stage=stage, key=key, error=str(exc))
            return False
        except WritesStopped:  # another pod's result ended the step (logged as it was applied)
            return False
        except Exception as exc:  # one bad object must not stop the loop; it is retried on resync
            self.metrics.reconcile_errors.labels(stage).inc()
            log.exception("reconcile failed", stage=stage, key=key, error=str(exc))
            if not _transient(exc):  # the object itself is the problem: tell its owner
                resource = "pods" if stage == "allocate" else "resourceclaims"
                self._skip(resource, key, self.cache[resource].get(key), exc)
        return True

    def _applied(self, result: PodWrites) -> bool:
        """One pod's write results, applied as if its writes had run here; False ends the step."""
        if self._guard("allocate", lambda _key: self._apply_writes(result), result.key):
            return True
        self.dirty.add(result.key)
        return False

    def _publish(self) -> None:
        gated: dict[str, int] = {}
        for p in self.pending.values():
            gated[p.reason or "Pending"] = gated.get(p.reason or "Pending", 0) + 1
        pools = {name: pool.node for name, pool in self.ledger.inventory.pools.items()}
        self.metrics.publish(
            Snapshot(
                gpus=tuple(self.ledger.cluster.gpus()),
                instances=self._instance_rows.rows(self.cache["resourceclaims"], pools),
                gated=gated,
                shared=tuple(self.ledger.shared_states().values()),
                oldest_pending_since=min((p.first_seen for p in self.pending.values()), default=None),
            )
        )


__all__ = ["CONDITION_TYPE", "Controller", "Pending", "allocated_devices"]
