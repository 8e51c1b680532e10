"""Periodic reconcile: what the startup reconcile does once, repeated while the plugin runs.

Each pass (every `--reconcile-interval`, default 60 s):

1. A `PrepareStarted` entry that no kubelet request is working on is stale (a rollback after a failed
   prepare failed too): it is rolled back again, by the ids recorded at creation.
2. A `PrepareCompleted` entry whose claim is gone from the API server, or was replaced (other UID), is
   unprepared: the instances flexmig created for it, its CDI spec, its entry. kubelet's later unprepare
   of that claim finds nothing and succeeds. When the API server cannot answer (any error: it may be
   restarting), the claim is kept: never destroy on uncertainty.
3. Idle GIs (kubeletplugin/prepare/idle.py) whose grace period is over are destroyed, so an idle GI
   lives at most `--idle-grace-period` plus one interval.
4. Every GPU instance no checkpoint entry accounts for was created out of band. flexmig never touches
   it; the devices it overlaps are withdrawn from the published ResourceSlices (so no pod is allocated
   a device that cannot be prepared), logged and counted; when it disappears they are published again.

Races with kubelet's calls: every change is made under the locks of the GPUs involved (the same locks
prepare and unprepare take), after re-reading the entry under them, and claims a request is working on
are skipped. Listing a GPU's instances happens under its lock too, so an instance whose creation is in
progress (its id not yet in the checkpoint) is never taken for a foreign one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from driver.nvml.types import GpuInfo
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.kubeapi import ClaimApi, ClaimNotFound
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.preparer import Preparer
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.publish.withdraw import ForeignInstance, overlapped_devices

log = structlog.get_logger(__name__)

DEFAULT_RECONCILE_INTERVAL_S = 60.0


@dataclass
class PassReport:
    rolled_back: list[str] = field(default_factory=list)  # stale PrepareStarted entries
    released: list[str] = field(default_factory=list)  # completed claims gone from the API server
    kept_uncertain: list[str] = field(default_factory=list)  # API server could not say
    skipped_in_flight: list[str] = field(default_factory=list)
    destroyed_instances: int = 0
    foreign: list[ForeignInstance] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class PeriodicReconciler:
    def __init__(
        self,
        *,
        preparer: Preparer,
        store: CheckpointStore,
        ops: NvmlOps,
        api: ClaimApi,
        gpus: Sequence[GpuInfo],
        inventory: Inventory,
        metrics: NodeMetrics,
        on_withdrawn_change: Callable[[], None],
    ) -> None:
        self._preparer = preparer
        self._store = store
        self._ops = ops
        self._api = api
        self._gpus = list(gpus)
        self._inventory = inventory
        self._metrics = metrics
        self._on_change = on_withdrawn_change
        self._lock = threading.Lock()
        self._foreign: frozenset[ForeignInstance] = frozenset()
        self._withdrawn: frozenset[str] = frozenset()
        # Called per claim and per GPU: the loop running the passes sets it to its heartbeat, so a
        # long pass (many claims, a slow API server) is not taken for a stuck one.
        self.beat: Callable[[], None] = lambda: None

    def withdrawn(self) -> frozenset[str]:
        """Device names to leave out of the ResourceSlices now."""
        with self._lock:
            return self._withdrawn

    def run_once(self) -> PassReport:
        report = PassReport()
        for entry in list(self._store.load().claims.values()):
            self.beat()
            self._claim(entry, report)
        try:
            report.destroyed_instances += self._preparer.idle.sweep()
        except Exception as exc:  # the claims and foreign-instance steps still run
            report.errors.append(f"idle instances: {type(exc).__name__}: {exc}")
        self._find_foreign(report)
        if report.rolled_back or report.released or report.errors:
            log.info(
                "periodic reconcile",
                rolled_back=report.rolled_back,
                released=report.released,
                destroyed_instances=report.destroyed_instances,
                kept_uncertain=report.kept_uncertain,
                errors=report.errors,
            )
        if report.rolled_back or report.released or report.destroyed_instances:
            self._preparer.update_checkpoint_metrics()
        return report

    # -- claims ---------------------------------------------------------------------------------------

    def _claim(self, entry: ClaimCheckpoint, report: PassReport) -> None:
        if self._preparer.locks.in_flight(entry.uid):
            report.skipped_in_flight.append(entry.uid)
            return
        if entry.state is ClaimState.PREPARE_COMPLETED and not self._owner_gone(entry, report):
            return
        with self._preparer.locks.gpus([d.gpu_index for d in entry.devices]):
            current = self._store.get_claim(entry.uid)
            # Re-checked under the locks: a request may have started, finished or replaced it since.
            if current is None or current != entry or self._preparer.locks.in_flight(entry.uid):
                report.skipped_in_flight.append(entry.uid)
                return
            stale = current.state is ClaimState.PREPARE_STARTED
            try:
                n = self._preparer.rollback(current)
            except Exception as exc:  # one claim's failure (e.g. IN_USE) never stops the pass
                report.errors.append(f"claim {entry.uid}: {type(exc).__name__}: {exc}")
                log.error("periodic reconcile cannot clean up a claim", uid=entry.uid, error=str(exc))
                return
        report.destroyed_instances += n
        (report.rolled_back if stale else report.released).append(entry.uid)
        if n:
            self._metrics.orphans_found.labels(action="destroyed").inc(n)
        log.info(
            "stale interrupted prepare rolled back"
            if stale
            else "claim gone from the API server; unprepared",
            claim=f"{entry.namespace}/{entry.name}",
            uid=entry.uid,
            destroyed_instances=n,
        )

    def _owner_gone(self, entry: ClaimCheckpoint, report: PassReport) -> bool:
        try:
            view = self._api.get_claim(entry.namespace, entry.name)
        except ClaimNotFound:
            return True
        except Exception as exc:  # the API server may be down or restarting: keep, retry next pass
            report.kept_uncertain.append(entry.uid)
            log.debug("cannot check a prepared claim; keeping it", uid=entry.uid, error=str(exc))
            return False
        return view.uid != entry.uid

    # -- instances flexmig did not create ------------------------------------------------------------

    def _find_foreign(self, report: PassReport) -> None:
        found: set[ForeignInstance] = set()
        for gpu in self._gpus:
            if not gpu.mig_capable:
                continue
            self.beat()
            with self._preparer.locks.gpus([gpu.index]):
                try:
                    instances = self._ops.gpu_instances_or_none(gpu.index)
                except Exception as exc:
                    report.errors.append(f"GPU {gpu.index}: {type(exc).__name__}: {exc}")
                    # Unknown this pass: keep what was known, rather than republishing blindly.
                    found.update(f for f in self._foreign if f.gpu_index == gpu.index)
                    continue
                owned = {
                    d.gi_id
                    for c in self._store.load().claims.values()
                    for d in c.devices
                    # An admin record watches its holder's instance: it makes nothing "owned".
                    if d.gpu_index == gpu.index and d.gi_id is not None and not d.admin
                } | self._preparer.idle.owned_gi_ids(gpu.index)
            found.update(ForeignInstance.of(gpu.index, gi) for gi in instances if gi.gi_id not in owned)
        report.foreign = sorted(found)
        with self._lock:
            before = self._foreign
            if found == before:
                return
            withdrawn = overlapped_devices(self._inventory, found)
            for inst in sorted(found - before):
                self._metrics.orphans_found.labels(action="withdrawn").inc()
                log.warning(
                    "GPU instance created out of band (not by flexmig); leaving it untouched and"
                    " withdrawing the devices it overlaps from the published ResourceSlices",
                    instance=str(inst),
                )
            for inst in sorted(before - found):
                log.info("out-of-band GPU instance gone; publishing its devices again", instance=str(inst))
            self._metrics.foreign_instances.set(len(found))
            self._metrics.withdrawn_devices.set(len(withdrawn))
            log.info("published capacity changed by out-of-band instances", withdrawn=sorted(withdrawn))
            # Last, and under the lock `withdrawn()` takes: the publisher may sync at any moment (it
            # re-checks every 0.5 s for 30 s after a registration), and slices that already lack the
            # devices must never be visible before the metrics and log lines that explain why.
            self._foreign = frozenset(found)
            self._withdrawn = withdrawn
        self._on_change()
