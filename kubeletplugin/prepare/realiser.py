"""What a claim makes on this node, and how it is undone: the `ClaimRealiser` behind the preparer.

`realise` takes a claim whose PrepareStarted entry is in the checkpoint and makes its devices real:
MIG mode per GPU (kubeletplugin/prepare/migmode.py), a GI and a full CI per MIG device with their ids
recorded as NVML returns them (kubeletplugin/prepare/steps.py), a check that each HAMi-core shared GPU
is there as published, and the CDI devices and HAMi-core edits the claim's spec needs. An adminAccess
device is only exposed: the MIG instance its holder made (found by placement), or the GPU as it is. `rollback` undoes
an entry, started or completed: instances by their recorded ids, the CDI spec, the HAMi-core state,
the checkpoint entry, and the MIG-mode hold of each GPU it touched.

The caller holds the locks of the entry's GPUs; kubeletplugin/prepare/preparer.py decides when each
runs (and writes the spec and PrepareCompleted after a realise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import structlog

from driver import cdi
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.checkpoint.model import ClaimCheckpoint, PreparedDeviceRecord
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.migmode import MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.overlap import SharedLimits
from kubeletplugin.prepare.steps import (
    RealisedClaim,
    check_shared_gpu,
    destroy_mig,
    existing_mig,
    realise_mig,
)
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.shared.hamicore import HamiCoreSupport
from kubeletplugin.shared.prepare import shared_cdi_devices

log = structlog.get_logger(__name__)


class ClaimError(Exception):
    """A claim cannot be prepared/unprepared; the message is what kubelet shows in the pod's events."""


class ClaimRealiser:
    def __init__(
        self,
        *,
        ops: NvmlOps,
        migmode: MigModeManager,
        inventory: Inventory,
        store: CheckpointStore,
        status: StatusWriter,
        cdi_dir: Path,
        crash: Crashpoints,
        hami_core: HamiCoreSupport | None,
        shared_split_count: int | None,
    ) -> None:
        self._ops = ops
        self._migmode = migmode
        self._inventory = inventory
        self._store = store
        self._status = status
        self._cdi_dir = cdi_dir
        self._crash = crash
        self._hami_core = hami_core
        self._split_count = shared_split_count

    def realise(self, started: ClaimCheckpoint) -> RealisedClaim:
        # An admin record never switches MIG mode: it watches the GPU as it is.
        owned = [d for d in started.devices if not d.admin]
        for index in sorted({d.gpu_index for d in owned if d.is_mig}):
            self._migmode.ensure_for_mig(index)
        for index in sorted({d.gpu_index for d in owned if not d.is_mig and not d.is_shared}):
            self._migmode.ensure_for_whole(index)
        for rec in started.devices:
            if rec.is_shared:
                check_shared_gpu(self._ops, rec)
        shared, spec_edits = self._shared_edits(started)
        devices: list[PreparedDeviceRecord] = []
        cdi_devices: list[cdi.PreparedDevice] = []
        for rec in started.devices:
            if rec.is_mig and rec.admin:
                mig = existing_mig(self._ops, rec)
                rec = dataclasses.replace(rec, gi_id=mig.gi_id, ci_id=mig.ci_id, mig_uuid=mig.mig_uuid)
            elif rec.is_mig:
                mig = realise_mig(
                    self._ops, rec, self._crash, self._id_recorder(started.uid, rec.device_name)
                )
                rec = dataclasses.replace(rec, gi_id=mig.gi_id, ci_id=mig.ci_id, mig_uuid=mig.mig_uuid)
            cdi_devices.append(self._cdi_device(rec, shared))
            devices.append(
                dataclasses.replace(
                    rec, cdi_device_ids=(cdi.qualified_device_id(started.uid, rec.device_name),)
                )
            )
        return RealisedClaim(started, tuple(devices), tuple(cdi_devices), spec_edits)

    def spec_of(
        self, completed: ClaimCheckpoint
    ) -> tuple[tuple[cdi.PreparedDevice, ...], dict[str, object] | None]:
        """The CDI devices and spec edits of a completed entry, from its records alone (no NVML): what
        the startup reconcile rewrites the claim's spec from."""
        shared, spec_edits = self._shared_edits(completed)
        return tuple(self._cdi_device(rec, shared) for rec in completed.devices), spec_edits

    def _cdi_device(
        self, rec: PreparedDeviceRecord, shared: dict[str, cdi.PreparedShared]
    ) -> cdi.PreparedDevice:
        minor = self._inventory_minor(rec)
        if rec.is_shared:
            return shared[rec.device_name]
        if rec.is_mig:
            if rec.gi_id is None or rec.ci_id is None or rec.mig_uuid is None:
                raise ClaimError(f"device {rec.device_name} has no realised MIG instance recorded")
            return cdi.PreparedMig(rec.device_name, rec.gpu_uuid, minor, rec.gi_id, rec.ci_id, rec.mig_uuid)
        return cdi.PreparedGpu(rec.device_name, rec.gpu_uuid, minor)

    def _id_recorder(self, uid: str, device_name: str) -> Callable[..., object]:
        def record(**ids: int) -> object:
            # Not waited for: in the store's state at once (a rollback in this process destroys by
            # these ids), on disk with the next durable write. A crash before that leaves the durable
            # PrepareStarted intent without ids, which the startup reconcile rolls back by placement
            # (docs/kubelet-plugin.md, "Crash model").
            return self._store.update_device(uid, device_name, wait=False, **ids)

        return record

    def shared_limits(self, records: list[PreparedDeviceRecord]) -> dict[int, SharedLimits]:
        """Per shared GPU of `records`: how many shares and how much memory it has to give."""
        limits: dict[int, SharedLimits] = {}
        for rec in records:
            nd = self._inventory.get(rec.device_name)
            if rec.is_shared and nd is not None:
                limits[rec.gpu_index] = SharedLimits(self._split_count, nd.gpu.memory_total_mib)
        return limits

    def _shared_edits(
        self, started: ClaimCheckpoint
    ) -> tuple[dict[str, cdi.PreparedShared], dict[str, object] | None]:
        records = [d for d in started.devices if d.is_shared]
        if not records:
            return {}, None
        if self._hami_core is None:
            raise ClaimError("shared GPUs are only prepared on hami-core nodes")
        minors = {r.device_name: self._inventory_minor(r) for r in records}
        devices, limits = shared_cdi_devices(records, minors)
        return devices, self._hami_core.claim_edits(started.uid, limits)

    def _inventory_minor(self, rec: PreparedDeviceRecord) -> int:
        nd = self._inventory.get(rec.device_name)
        if nd is None:  # only for entries adopted from an older checkpoint
            raise ClaimError(f"device {rec.device_name} is no longer published by this node")
        return nd.gpu.minor_number

    def rollback(self, entry: ClaimCheckpoint, *, by_placement: bool = False) -> int:
        """Undo a PrepareStarted entry (or destroy a completed one): instances, CDI spec, entry.

        Returns how many GPU instances were destroyed. Raises NvmlError (e.g. IN_USE) with the entry
        left in place, so a later attempt finishes it. Callers hold the locks of the entry's GPUs (or
        run before the servers start). Instances are found by the ids recorded at creation;
        `by_placement` is only for the startup reconcile of a prepare a crash interrupted (destroy_mig).
        """
        touched = sorted({d.gpu_index for d in entry.devices if d.is_mig and not d.admin})
        destroyed = 0
        for rec in entry.devices:
            if rec.is_mig and destroy_mig(self._ops, rec, self._crash, by_placement=by_placement):
                destroyed += 1
                log.info(
                    "destroyed MIG instance",
                    uid=entry.uid,
                    device=rec.device_name,
                    gi=rec.gi_id,
                    ci=rec.ci_id,
                )
        self._crash.reach("before-checkpoint-remove")
        cdi.remove_spec(self._cdi_dir, entry.uid)
        if self._hami_core is not None and any(d.is_shared for d in entry.devices):
            self._hami_core.release(entry.uid)
        self._store.remove_claim(entry.uid)
        self._status.forget_claim(entry.uid)
        for index in touched:
            self._migmode.release(index)
        return destroyed
