"""Idle MIG instances: a GPU instance whose claim ended, kept for a grace period for the next claim of
the same shape (`--idle-grace-period`, off by default; docs/kubelet-plugin.md, "Idle instances").

Creating a GI is the slowest NVML step on real hardware (hundreds of ms to seconds, serialised per
GPU); a compute instance is much cheaper. So at unprepare, when allowed, only the CI is destroyed and
the GI stays, recorded `Idle` in the checkpoint. A claim allocated exactly onto it (GPU, GI profile,
placement, and the same namespace unless `--idle-reuse-across-namespaces`) adopts it and gets a fresh
CI; a claim whose placement merely overlaps it destroys it first. The allocator needs no knowledge of
idle instances for correctness: the node enforces that an idle instance never stands in the way.

Crash safety follows the rest of the node (docs/kubelet-plugin.md, "Crash model"):

- keep: processes checked, CI destroyed, CDI spec removed, then one durable change swaps the claim's
  entry for the idle records. A crash before that change leaves the completed claim whose CI is gone:
  the startup reconcile destroys its GI (claim gone) or kubelet's retried unprepare keeps it again.
- adopt: one durable change swaps the idle record for the claim's PrepareStarted (with the GI id);
  a crash afterwards is an ordinary interrupted prepare, rolled back by id.
- displace / expire: GI destroyed first, then the record removed. A crash in between leaves a record
  whose GI NVML no longer shows; the startup reconcile drops it. NVML reuses GI ids, but a GI with
  the same id, profile and placement can only be recreated by a claim whose durable intent was written
  after the removal (the removal is queued first), so a stale record never claims someone else's GI.

Callers hold the locks of the GPUs involved (prepare, unprepare), or this module takes them (sweep).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from driver import cdi
from driver.nvml.types import GpuInstance, NvmlError, NvmlErrorCode
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.checkpoint import mutations
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, IdleInstance, PreparedDeviceRecord
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.claimlocks import ClaimLocks
from kubeletplugin.prepare.migmode import MigModeManager
from kubeletplugin.prepare.nvmlops import GONE_CODES, NvmlOps
from kubeletplugin.prepare.steps import destroy_all_cis, destroy_ci, find_gi
from kubeletplugin.settings.idlepolicy import IdlePolicy

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class IdlePlan:
    records: list[PreparedDeviceRecord]  # the claim's records; an adopted one carries the idle GI id
    adopted: tuple[str, ...]  # idle keys to remove with the claim's PrepareStarted


def _same_shape(idle: IdleInstance, rec: PreparedDeviceRecord) -> bool:
    return (
        idle.gpu_index == rec.gpu_index
        and idle.gpu_uuid == rec.gpu_uuid
        and idle.gi_profile_id == rec.gi_profile_id
        and idle.placement_start == rec.placement_start
        and idle.placement_size == rec.placement_size
    )


def _in_way(idle: IdleInstance, rec: PreparedDeviceRecord) -> bool:
    if rec.admin or rec.gpu_index != idle.gpu_index:
        return False
    if not rec.is_mig:
        return True  # a whole GPU (or a share) needs every slice, and MIG mode off
    assert rec.placement_start is not None and rec.placement_size is not None
    return idle.overlaps(rec.placement_start, rec.placement_size)


class IdleInstances:
    def __init__(
        self,
        *,
        policy: IdlePolicy,
        ops: NvmlOps,
        store: CheckpointStore,
        migmode: MigModeManager,
        status: StatusWriter,
        metrics: NodeMetrics,
        cdi_dir: Path,
        crash: Crashpoints,
        locks: ClaimLocks,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._ops = ops
        self._store = store
        self._migmode = migmode
        self._status = status
        self._metrics = metrics
        self._cdi_dir = cdi_dir
        self._crash = crash
        self._locks = locks
        self.clock = clock  # wall clock: `released_at` must mean the same after a restart (tests set it)

    def _expired(self, idle: IdleInstance, now: float) -> bool:
        return now >= idle.released_at + self.policy.grace_s

    # -- prepare (GPU locks held) ---------------------------------------------------------------------

    def plan(self, namespace: str, records: Sequence[PreparedDeviceRecord]) -> IdlePlan:
        """Adopt an idle GI for each record of exactly its shape; destroy idle GIs in the way of the
        others (the claim then creates its own). Raises NvmlError when one cannot be destroyed."""
        gpus = {r.gpu_index for r in records if not r.admin}
        idle = [i for i in self._store.load().idle.values() if i.gpu_index in gpus]
        if not idle:
            return IdlePlan(list(records), ())
        now = self.clock()
        out: list[PreparedDeviceRecord] = []
        adopted: list[str] = []
        for rec in records:
            match = None
            if rec.is_mig and not rec.admin and self.policy.enabled:
                match = next(
                    (
                        i
                        for i in idle
                        if i.key not in adopted
                        and _same_shape(i, rec)
                        and not self._expired(i, now)
                        and (self.policy.across_namespaces or i.namespace == namespace)
                    ),
                    None,
                )
            if match is not None:
                adopted.append(match.key)
                rec = dataclasses.replace(rec, gi_id=match.gi_id, created_gi=True)
                self._metrics.idle_events.labels(event="reused").inc()
                log.info("reusing an idle GPU instance", device=rec.device_name, gi=match.gi_id)
            out.append(rec)
        in_way = [i for i in idle if i.key not in adopted and any(_in_way(i, r) for r in records)]
        for i in in_way:
            self._destroy(i)
            # Not waited for: queued before the claim's PrepareStarted, so durable no later than it
            # (a crash earlier leaves a record whose GI is gone, which the startup reconcile drops).
            self._store.update(mutations.remove_idle([i.key]), wait=False)
            self._metrics.idle_events.labels(event="displaced").inc()
            log.info("destroyed an idle GPU instance a new placement needs", gpu=i.gpu_index, gi=i.gi_id)
        return IdlePlan(out, tuple(adopted))

    # -- unprepare (GPU locks held) -------------------------------------------------------------------

    def keep(self, entry: ClaimCheckpoint) -> bool:
        """Keep the claim's GIs idle instead of destroying them; False: the caller destroys as usual.

        Only a completed claim whose every owned device is a MIG instance flexmig created, with no
        compute process left on it, is kept (a process would survive into the next tenant's GI)."""
        if not self.policy.enabled or entry.state is not ClaimState.PREPARE_COMPLETED:
            return False
        owned = [d for d in entry.devices if not d.admin]
        if not owned or not all(d.is_mig and d.created_gi and d.realised for d in owned):
            return False
        for d in owned:
            assert d.gi_id is not None and d.ci_id is not None
            try:
                present = find_gi(self._ops, d, by_placement=False) is not None
                busy = present and self._busy(d.gpu_index, d.gi_id, d.ci_id)
            except NvmlError:
                return False  # unreadable: the plain destroy decides what is there
            if busy or not present:
                if busy:
                    self._metrics.idle_events.labels(event="not_kept").inc()
                    log.info("a process still uses the MIG device; not kept idle", uid=entry.uid, gi=d.gi_id)
                return False
        for d in owned:
            assert d.gi_id is not None and d.ci_id is not None
            destroy_ci(self._ops, d.gpu_index, d.gi_id, d.ci_id)  # IN_USE: the claim's error, retried
        self._crash.reach("after-idle-ci-destroy")
        cdi.remove_spec(self._cdi_dir, entry.uid)
        now = self.clock()
        kept = [self._record(d, entry.namespace, now) for d in owned]
        self._store.update(mutations.keep_idle(entry.uid, kept))
        self._status.forget_claim(entry.uid)
        self._metrics.idle_events.labels(event="kept").inc(len(kept))
        log.info("claim unprepared; GPU instances kept idle", uid=entry.uid, gis=[i.key for i in kept])
        return True

    def _busy(self, index: int, gi_id: int, ci_id: int) -> bool:
        try:
            return self._ops.running_processes(index, gi_id, ci_id) > 0
        except NvmlError as exc:
            if exc.code not in GONE_CODES:
                raise
        # Our CI is gone already (a retried unprepare after a crash between its destroy and the idle
        # record): a process needs a CI, so the GI is free when none is left in it.
        return bool(self._ops.compute_instances(index, gi_id))

    @staticmethod
    def _record(d: PreparedDeviceRecord, namespace: str, now: float) -> IdleInstance:
        assert d.profile is not None and d.gi_profile_id is not None and d.gi_id is not None
        assert d.placement_start is not None and d.placement_size is not None and d.mig_uuid is not None
        return IdleInstance(
            gpu_index=d.gpu_index,
            gpu_uuid=d.gpu_uuid,
            profile=d.profile,
            gi_profile_id=d.gi_profile_id,
            placement_start=d.placement_start,
            placement_size=d.placement_size,
            gi_id=d.gi_id,
            mig_uuid=d.mig_uuid,
            released_at=now,
            namespace=namespace,
        )

    # -- expiry, restart --------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Destroy idle GIs whose grace period is over (all of them when the feature is off now).
        Returns how many; a GI that cannot be destroyed is logged and tried again next pass."""
        expired = 0
        for gpu in sorted({i.gpu_index for i in self._store.load().idle.values()}):
            with self._locks.gpus([gpu]):
                now = self.clock()
                due = [
                    i
                    for i in self._store.load().idle.values()  # re-read under the lock
                    if i.gpu_index == gpu and (not self.policy.enabled or self._expired(i, now))
                ]
                done = []
                for i in due:
                    try:
                        self._destroy(i)
                    except NvmlError as exc:
                        log.error("cannot destroy an expired idle GPU instance", gi=i.key, error=str(exc))
                        continue
                    done.append(i.key)
                if done:
                    self._store.update(mutations.remove_idle(done))
                    self._migmode.release(gpu)
                    self._metrics.idle_events.labels(event="expired").inc(len(done))
                    log.info("idle GPU instances expired", gpu=gpu, gis=done)
                    expired += len(done)
        return expired

    def check_at_start(self, errors: list[str]) -> None:
        """Startup reconcile: keep a record only while NVML shows its GI (id, profile, placement), and
        clear any CI in it (none unless something created one out of band)."""
        gone: list[str] = []
        for i in list(self._store.load().idle.values()):
            try:
                gi = self._find(i)
                if gi is not None:
                    destroy_all_cis(self._ops, i.gpu_index, i.gi_id)
            except NvmlError as exc:
                errors.append(f"idle GI {i.key}: {exc}")
                continue
            if gi is None:
                gone.append(i.key)
                self._metrics.idle_events.labels(event="lost").inc()
                log.warning("idle GPU instance no longer on the GPU; record dropped", gi=i.key)
        if gone:
            self._store.update(mutations.remove_idle(gone))

    def owned_gi_ids(self, gpu_index: int) -> set[int]:
        return {i.gi_id for i in self._store.load().idle.values() if i.gpu_index == gpu_index}

    # -- NVML ---------------------------------------------------------------------------------------------

    def _find(self, idle: IdleInstance) -> GpuInstance | None:
        return find_gi(self._ops, _as_record(idle), by_placement=False)

    def _destroy(self, idle: IdleInstance) -> None:
        """Destroy an idle GI (checked by id, profile and placement: NVML reuses ids); gone is fine."""
        if self._find(idle) is None:
            return
        try:
            self._ops.destroy_gpu_instance(idle.gpu_index, idle.gi_id)
        except NvmlError as exc:
            if exc.code in GONE_CODES:
                return
            if exc.code is not NvmlErrorCode.IN_USE:
                raise
            destroy_all_cis(self._ops, idle.gpu_index, idle.gi_id)  # a CI nobody should have made
            self._ops.destroy_gpu_instance(idle.gpu_index, idle.gi_id)


def _as_record(idle: IdleInstance) -> PreparedDeviceRecord:
    """The idle GI as a device record, so it is found exactly like a claim's (steps.find_gi)."""
    return PreparedDeviceRecord(
        request_names=(),
        pool="",
        device_name=f"idle-{idle.key}",
        gpu_index=idle.gpu_index,
        gpu_uuid=idle.gpu_uuid,
        profile=idle.profile,
        gi_profile_id=idle.gi_profile_id,
        placement_start=idle.placement_start,
        placement_size=idle.placement_size,
        gi_id=idle.gi_id,
        created_gi=True,
    )
