"""Prepare and unprepare of claims on this node: the `ClaimPreparer` behind the DRA gRPC server.

Per claim, prepare is (docs/architecture.md, the prepare step of a pod's path):

  fetch the claim, check its UID, keep results of driver `gpu.flexmig.dev` in this node's pool
  -> look each device name up in the inventory (never choose a placement here)
  -> (the whole call holds the claim's lock: claimlocks.working_on) under the claim's GPUs' locks:
       PrepareCompleted in the checkpoint? return it (idempotent);
       a stale PrepareStarted? roll it back first;
       check every allocated placement is free, then put PrepareStarted (ownership intent, see
       kubeletplugin/prepare/steps.py) into the store's state, which fences the placements off
  -> without the GPU locks: wait until that entry is durable (a group commit shared with the other
     claims in flight; no GPU waits for another claim's fsync)
  -> under the GPU locks again: MIG mode -> GI + full CI per MIG device, their ids recorded in the
     store's state as NVML returns them (written with the next durable write: a crash before that is
     rolled back by the intent's placement at start)
  -> with the GPU locks released (other claims on those GPUs go ahead: the entry fences our
     placements off, and the instances are recorded as ours):
       CDI spec (atomic, not fsynced: see `_finish`) -> PrepareCompleted with the realised
       identities (one durable write, before kubelet is answered);
       a failure here takes the GPU locks again to roll back
  -> claim status.devices + the pods' HAMi mirror (outside the GPU locks; a failure is this claim's
     error and the retry re-attempts just the write).

MIG mode, the instances and their rollback are kubeletplugin/prepare/realiser.py's; this module holds
the claim's flow, locks, checkpoint states and what kubelet is told. A HAMi-core shared GPU
(`gpu-<i>-shared`, hami-core nodes) creates nothing through NVML and never touches MIG mode: see
kubeletplugin/shared/prepare.py.

Nothing is serialised node-wide: claims on different GPUs run in parallel (within one call and across
calls), each GPU admits one claim at a time and only for its NVML work, and the checkpoint writes of
all claims in flight share fsyncs (checkpoint's group commit). One claim's failure never fails
another. Unprepare destroys CI then GI (gone = success, IN_USE = the claim's error so kubelet
retries), removes the CDI spec and the checkpoint entry (durably, under the GPU locks: until it is
gone the entry keeps the placement from another claim); an unknown claim succeeds. With
`--idle-grace-period` its GIs may be kept idle instead (kubeletplugin/prepare/idle.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog
from kubernetes.client.exceptions import ApiException

from driver.nvml.types import NvmlError
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.agent.metrics import NodeMetrics, SharedGpuUsage
from kubeletplugin.checkpoint import mutations
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.checkpoint.store import CheckpointStore, Pending
from kubeletplugin.grpcserver import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin.kube.kubeapi import ClaimApi, ClaimNotFound, ClaimView, api_error_text
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.cdiwriter import ClaimSpecWriter
from kubeletplugin.prepare.claimlocks import ClaimLocks
from kubeletplugin.prepare.claimrecords import UnknownDevices, records_for
from kubeletplugin.prepare.idle import IdleInstances
from kubeletplugin.prepare.migmode import MigModeError, MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.overlap import DeviceOverlap, check_no_overlap
from kubeletplugin.prepare.realiser import ClaimError, ClaimRealiser
from kubeletplugin.prepare.steps import (
    PlacementBusy,
    RealisedClaim,
    SharedGpuUnavailable,
    check_placement_free,
)
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.settings.idlepolicy import IdlePolicy
from kubeletplugin.shared.hamicore import HamiCoreSupport
from kubeletplugin.shared.prepare import shared_usage

log = structlog.get_logger(__name__)

_MAX_PARALLEL_CLAIMS = 8


# What fails one claim's prepare with a message of its own (anything else is logged with a traceback).
_PREPARE_FAILURES: tuple[type[Exception], ...] = (ClaimError, DeviceOverlap, NvmlError, MigModeError)
_PREPARE_FAILURES += (PlacementBusy, SharedGpuUnavailable, ApiException, OSError, ValueError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"API server: {api_error_text(exc)}"
    return str(exc)


class Preparer:
    def __init__(
        self,
        *,
        node_name: str,
        ops: NvmlOps,
        migmode: MigModeManager,
        inventory: Inventory,
        store: CheckpointStore,
        api: ClaimApi,
        status: StatusWriter,
        metrics: NodeMetrics,
        cdi_dir: Path,
        mig_minors: Mapping[str, int] | None,
        crash: Crashpoints,
        hami_core: HamiCoreSupport | None = None,
        shared_split_count: int | None = None,
        specs: ClaimSpecWriter | None = None,
        idle: IdlePolicy | None = None,
    ) -> None:
        self._node = node_name
        self._ops = ops
        self._inventory = inventory
        self._store = store
        self._api = api
        self._status = status
        self._metrics = metrics
        self._specs = specs or ClaimSpecWriter(
            cdi_dir, mig_minors
        )  # host-aware one from kubeletplugin/agent/main.py
        self._crash = crash
        self._realiser = ClaimRealiser(
            ops=ops,
            migmode=migmode,
            inventory=inventory,
            store=store,
            status=status,
            cdi_dir=cdi_dir,
            crash=crash,
            hami_core=hami_core,
            shared_split_count=shared_split_count,
        )
        self.locks = ClaimLocks()
        self.idle = IdleInstances(
            policy=idle or IdlePolicy(),
            ops=ops,
            store=store,
            migmode=migmode,
            status=status,
            metrics=metrics,
            cdi_dir=cdi_dir,
            crash=crash,
            locks=self.locks,
        )
        self._metrics_lock = threading.Lock()
        self._published_counts: dict[str, int] | None = None
        self._published_usage: list[SharedGpuUsage] | None = None
        self._pool = ThreadPoolExecutor(max_workers=_MAX_PARALLEL_CLAIMS, thread_name_prefix="flexmig-claim")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def gpu_locks(self, indexes: Sequence[int]) -> contextlib.AbstractContextManager[None]:
        return self.locks.gpus(indexes)

    # -- ClaimPreparer --------------------------------------------------------------------------------

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        if len(claims) <= 1:
            return {c.uid: self._prepare_timed(c) for c in claims}
        futures = {c.uid: self._pool.submit(self._prepare_timed, c) for c in claims}
        return {uid: f.result() for uid, f in futures.items()}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        if len(claims) <= 1:
            return {c.uid: self._unprepare_timed(c) for c in claims}
        futures = {c.uid: self._pool.submit(self._unprepare_timed, c) for c in claims}
        return {uid: f.result() for uid, f in futures.items()}

    # -- prepare --------------------------------------------------------------------------------------

    def _prepare_timed(self, ref: ClaimRef) -> PrepareResult:
        start = time.monotonic()
        try:
            with self.locks.working_on(ref.uid):
                result = PrepareResult(devices=self._prepare_one(ref))
        except _PREPARE_FAILURES as exc:
            log.error(
                "prepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=_describe(exc)
            )
            result = PrepareResult(error=f"flexmig: prepare {ref.namespace}/{ref.name}: {_describe(exc)}")
        except Exception as exc:
            # Anything unexpected (e.g. a connection error below the API client) is still only this
            # claim's failure; the traceback goes to the log for whoever debugs it.
            log.exception("prepare failed unexpectedly", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
            result = PrepareResult(
                error=f"flexmig: prepare {ref.namespace}/{ref.name}: {type(exc).__name__}: {exc}"
            )
        self._metrics.prepare_seconds.labels(result="error" if result.error else "ok").observe(
            time.monotonic() - start
        )
        self.update_checkpoint_metrics()
        return result

    def _fetch(self, ref: ClaimRef) -> ClaimView:
        try:
            view = self._api.get_claim(ref.namespace, ref.name)
        except ClaimNotFound as exc:
            raise ClaimError(str(exc)) from exc
        if view.uid != ref.uid:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {view.uid}, not {ref.uid}")
        return view

    def _records_for(self, view: ClaimView) -> list[PreparedDeviceRecord]:
        try:
            return records_for(view, self._node, self._inventory)
        except UnknownDevices as exc:
            raise ClaimError(str(exc)) from None

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        view = self._fetch(ref)
        records = self._records_for(view)
        if not records:
            return []
        # A stale entry of this claim may name other GPUs (the claim was reallocated while an
        # unprepare failed): its GPUs are locked too, because it may have to be rolled back.
        previous = self._store.get_claim(ref.uid)
        stale_gpus = [d.gpu_index for d in previous.devices] if previous is not None else []
        gpus = [r.gpu_index for r in records]
        with self.gpu_locks(gpus + stale_gpus):
            reserved = self._reserve(ref, view, records)
        if isinstance(reserved, ClaimCheckpoint):
            entry = reserved
        else:
            started, intent = reserved
            # The intent is durable before any hardware change; its fsync is waited for without the
            # GPU locks, so the other claims of these GPUs create their instances meanwhile (the
            # entry, already in the store's state, fences our placements off). A failed write drops
            # the entry again and fails the claim, with nothing created.
            self._store.finish(intent)
            with self.gpu_locks(gpus):
                made = self._realise(started)
            entry = self._finish(made)
        self._status.write(view, entry)
        return [
            PreparedDevice(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            for d in entry.devices
        ]

    def _reserve(
        self, ref: ClaimRef, view: ClaimView, records: list[PreparedDeviceRecord]
    ) -> ClaimCheckpoint | tuple[ClaimCheckpoint, Pending[None]]:
        """Under the GPU locks: the completed entry when already prepared, else the PrepareStarted
        entry, put in the store's state (its durable write begun) after the placements were found
        free."""
        checkpoint = self._store.load()
        existing = checkpoint.claims.get(ref.uid)
        wanted = [(r.device_name, r.shares) for r in records]
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            if [(d.device_name, d.shares) for d in existing.devices] == wanted:
                return existing
            log.warning("claim was prepared for other devices; replacing them", uid=ref.uid, devices=wanted)
        if existing is not None:
            log.info("rolling back an earlier prepare of this claim before retrying it", uid=ref.uid)
            self.rollback(existing)
            checkpoint = self._store.load()
        check_no_overlap(ref.uid, records, checkpoint.claims.values(), self._realiser.shared_limits(records))
        # Idle GIs are never a conflict: one of exactly a record's shape is adopted, one in the way is
        # destroyed now (kubeletplugin/prepare/idle.py).
        plan = self.idle.plan(view.namespace, records)
        records = plan.records
        owners = {
            (d.gpu_index, d.gi_id): c.uid
            for c in checkpoint.claims.values()
            for d in c.devices
            if d.gi_id is not None and not d.admin
        }
        for rec in records:
            # An admin record needs the instance, not a free placement; an adopted one holds its GI.
            if rec.is_mig and not rec.admin and rec.gi_id is None:
                check_placement_free(self._ops, rec, owners)
        started = ClaimCheckpoint(
            ref.uid, view.namespace, view.name, ClaimState.PREPARE_STARTED, tuple(records)
        )
        return started, self._store.begin(mutations.put_claim_adopting(started, plan.adopted))

    def _realise(self, started: ClaimCheckpoint) -> RealisedClaim:
        """Under the GPU locks, with the intent durable: MIG mode, instances; rolled back on failure."""
        try:
            return self._realiser.realise(started)
        except BaseException:
            self._rollback_failed(started)
            raise

    def _rollback_failed(self, started: ClaimCheckpoint) -> None:
        """Undo a prepare that failed; the caller holds the GPU locks and re-raises the failure."""
        try:
            # The stored entry holds the ids NVML returned; never look for "ours" by placement.
            self.rollback(self._store.get_claim(started.uid) or started)
        except (NvmlError, OSError) as exc:
            log.error(
                "rollback after a failed prepare failed; retried on the next attempt",
                uid=started.uid,
                error=str(exc),
            )

    def _finish(self, made: RealisedClaim) -> ClaimCheckpoint:
        """CDI spec and PrepareCompleted, without the GPU locks (the claim's lock is held)."""
        started = made.started
        try:
            # Not fsynced: the rename makes it whole for every reader at once, and what an fsync adds
            # (surviving a power loss) the startup reconcile gives, rewriting the spec of every
            # prepared claim from the checkpoint before kubelet can call (a power loss also reboots
            # the node, and a new boot starts with an empty checkpoint): docs/kubelet-plugin.md.
            self._specs.write(started.uid, made.cdi_devices, made.spec_edits, durable=False)
            self._crash.reach("after-cdi-write")
            completed = dataclasses.replace(started, state=ClaimState.PREPARE_COMPLETED, devices=made.devices)
            self._crash.reach("before-checkpoint-commit")
            self._store.put_claim(completed)
            self._crash.reach("after-checkpoint-commit")
        except BaseException:
            with self.gpu_locks([d.gpu_index for d in started.devices]):
                self._rollback_failed(started)
            raise
        log.info(
            "claim prepared",
            claim=f"{started.namespace}/{started.name}",
            uid=started.uid,
            devices=[(d.device_name, d.mig_uuid) for d in made.devices],
        )
        return completed

    def rewrite_spec(self, completed: ClaimCheckpoint) -> None:
        """Write a prepared claim's CDI spec again, durably, from its checkpoint entry alone (the
        startup reconcile does this for every claim it keeps: prepare does not fsync the spec)."""
        devices, spec_edits = self._realiser.spec_of(completed)
        self._specs.write(completed.uid, devices, spec_edits, durable=True)

    # -- rollback / unprepare ---------------------------------------------------------------------------

    def rollback(self, entry: ClaimCheckpoint, *, by_placement: bool = False) -> int:
        """Undo an entry and return how many GPU instances were destroyed (`ClaimRealiser.rollback`).

        Callers hold the locks of the entry's GPUs (or run before the servers start).
        """
        return self._realiser.rollback(entry, by_placement=by_placement)

    def _unprepare_timed(self, ref: ClaimRef) -> str | None:
        start = time.monotonic()
        error: str | None = None
        try:
            with self.locks.working_on(ref.uid):
                self._unprepare_one(ref)
        except (ClaimError, NvmlError, OSError) as exc:
            log.error(
                "unprepare failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, error=_describe(exc)
            )
            error = f"flexmig: unprepare {ref.namespace}/{ref.name}: {_describe(exc)}"
        except Exception as exc:
            log.exception("unprepare failed unexpectedly", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
            error = f"flexmig: unprepare {ref.namespace}/{ref.name}: {type(exc).__name__}: {exc}"
        self._metrics.unprepare_seconds.labels(result="error" if error else "ok").observe(
            time.monotonic() - start
        )
        self.update_checkpoint_metrics()
        return error

    def _unprepare_one(self, ref: ClaimRef) -> None:
        entry = self._store.get_claim(ref.uid)
        if entry is None:
            return  # never prepared here, or already unprepared: success either way
        with self.gpu_locks([d.gpu_index for d in entry.devices]):
            entry = self._store.get_claim(ref.uid)
            if entry is None:
                return
            if not self.idle.keep(entry):  # kept idle (its CI destroyed), else destroyed whole
                self.rollback(entry)
        log.info("claim unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)

    def update_checkpoint_metrics(self) -> None:
        # Runs after every call; the gauges are replaced only when their values changed (replacing
        # them is most of the cost), and under a lock so an older state never overwrites a newer one.
        with self._metrics_lock:
            checkpoint = self._store.load()
            claims = list(checkpoint.claims.values())
            self._metrics.idle_instances.set(len(checkpoint.idle))
            by_state = collections.Counter(c.state for c in claims)
            counts = {s.value: by_state[s] for s in ClaimState}
            usage = shared_usage(claims)
            if counts != self._published_counts:
                self._metrics.set_checkpoint_counts(counts)
                self._published_counts = counts
            if usage != self._published_usage:
                self._metrics.set_shared_usage(usage)
                self._published_usage = usage
