"""The NVML side of prepare and unprepare for one device, and the ownership rules behind it.

Ownership is what makes crash recovery safe. A device record in the checkpoint with `created_gi=True`
means "flexmig issued (or is about to issue) the create of a GI at exactly this profile and placement".
The preparer only sets it after checking, under the GPU's lock, that nothing occupied that placement,
and it is durable before the create, so after a crash anywhere between that write and the durable
write that carries the GI id, a GI found at exactly that placement and profile is ours and may be
destroyed. `gi_id` is recorded as soon as NVML returns it (in the store's state at once, on disk with
the next durable write) and then wins over the placement search. Instances that were there before us are never touched: their placement was not
free, so the prepare failed before claiming them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from driver import cdi
from driver.nvml.types import GpuInstance, NvmlError, NvmlErrorCode
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.checkpoint.model import ClaimCheckpoint, PreparedDeviceRecord
from kubeletplugin.prepare.nvmlops import GONE_CODES, NvmlOps


class PlacementBusy(Exception):
    """The allocated placement is occupied by an instance this claim does not own."""


class SharedGpuUnavailable(Exception):
    """A HAMi-core shared GPU is not there as published (gone, replaced, or in MIG mode)."""


def check_shared_gpu(ops: NvmlOps, rec: PreparedDeviceRecord) -> None:
    """A shared GPU must be the published one (same UUID at that index) and have MIG off.

    Read-only on purpose: flexmig never changes MIG state for a HAMi-core share (the GPU may be in MIG
    mode for a reason an administrator owns), it only refuses with a message saying what to do.
    """
    gpu = ops.gpu_info(rec.gpu_index)
    if gpu.uuid != rec.gpu_uuid:
        raise SharedGpuUnavailable(
            f"GPU {rec.gpu_index} is now {gpu.uuid}, not the published {rec.gpu_uuid}; restart the plugin"
            " after hardware changes"
        )
    if gpu.mig_capable and ops.mig_mode(rec.gpu_index).current:
        raise SharedGpuUnavailable(
            f"GPU {rec.gpu_index} ({gpu.uuid}) is in MIG mode; a HAMi-core share needs the whole GPU and"
            f" flexmig does not change MIG mode on hami-core nodes: disable MIG (nvidia-smi -i"
            f" {rec.gpu_index} -mig 0, plus a GPU reset where the GPU needs one)"
        )


@dataclass(frozen=True, slots=True)
class RealisedClaim:
    """A claim whose instances exist and are recorded (PrepareStarted); CDI spec and completion next."""

    started: ClaimCheckpoint  # the PrepareStarted entry as first written (the store has the ids too)
    devices: tuple[PreparedDeviceRecord, ...]  # as they will be completed (with CDI ids)
    cdi_devices: tuple[cdi.PreparedDevice, ...]
    spec_edits: dict[str, object] | None


@dataclass(frozen=True, slots=True)
class RealisedMig:
    gi_id: int
    ci_id: int
    mig_uuid: str


def find_gi(ops: NvmlOps, rec: PreparedDeviceRecord, *, by_placement: bool = True) -> GpuInstance | None:
    """The GI that realises `rec`: by recorded id (checked against the placement), else by placement.

    Without a recorded id, `by_placement=False` finds nothing: what sits at the placement may be
    another actor's instance (a create that failed created nothing of ours).
    """
    if rec.gi_id is None and not by_placement:
        return None
    for gi in ops.gpu_instances_or_none(rec.gpu_index):
        same_place = (
            gi.profile_id == rec.gi_profile_id
            and gi.placement.start == rec.placement_start
            and gi.placement.size == rec.placement_size
        )
        if rec.gi_id is not None:
            if gi.gi_id == rec.gi_id and same_place:
                return gi
        elif same_place:
            return gi
    return None


def check_placement_free(ops: NvmlOps, rec: PreparedDeviceRecord, owners: dict[tuple[int, int], str]) -> None:
    """Raise PlacementBusy when any GI overlaps the record's placement.

    `owners` maps (gpu index, gi id) to the claim that owns it per the checkpoint, for a clearer error:
    a GI of another claim means the allocation was handed out twice.
    """
    assert rec.placement_start is not None and rec.placement_size is not None
    end = rec.placement_start + rec.placement_size
    for gi in ops.gpu_instances_or_none(rec.gpu_index):
        if gi.placement.start < end and rec.placement_start < gi.placement.end:
            owner = owners.get((rec.gpu_index, gi.gi_id))
            who = f"claim {owner}" if owner else "an instance flexmig did not create (left untouched)"
            raise PlacementBusy(
                f"placement {rec.placement_start}:{rec.placement_size} of GPU {rec.gpu_index} overlaps GI"
                f" {gi.gi_id} (placement {gi.placement}) held by {who}"
            )


# Called with the ids NVML just returned (gi_id, then ci_id), before anything else happens: the
# preparer records them in the checkpoint store's state, so a rollback destroys exactly what was
# created, by id (a crash before they reach the disk is the startup reconcile's, by placement).
RecordIds = Callable[..., object]


def realise_mig(
    ops: NvmlOps, rec: PreparedDeviceRecord, crash: Crashpoints, record: RecordIds | None = None
) -> RealisedMig:
    """Create the GI at exactly the allocated placement and one full-size CI in it.

    `record(gi_id=...)` and `record(ci_id=...)` run as soon as NVML returned each id.
    """
    assert rec.gi_profile_id is not None and rec.placement_start is not None
    if rec.gi_id is not None:
        return _realise_adopted(ops, rec, crash, record)
    gi = ops.create_gpu_instance(rec.gpu_index, rec.gi_profile_id, rec.placement_start)
    if gi.placement.start != rec.placement_start or gi.placement.size != rec.placement_size:
        # NVML placed it elsewhere: not what was allocated, so it must not be used. It is ours (NVML
        # just returned it to us), destroyed by its id before anything could record it.
        ops.destroy_gpu_instance(rec.gpu_index, gi.gi_id)
        raise NvmlError(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            NvmlErrorCode.INVALID_STATE,
            f"GI {gi.gi_id} created at {gi.placement}, allocated {rec.placement_start}:{rec.placement_size}",
        )
    if record is not None:
        record(gi_id=gi.gi_id)
    crash.reach("after-gi-create")
    ci = ops.create_compute_instance(rec.gpu_index, gi.gi_id)
    if record is not None:
        record(ci_id=ci.ci_id)
    crash.reach("after-ci-create")
    return RealisedMig(gi.gi_id, ci.ci_id, ops.mig_uuid(rec.gpu_index, gi.gi_id, ci.ci_id))


def _realise_adopted(
    ops: NvmlOps, rec: PreparedDeviceRecord, crash: Crashpoints, record: RecordIds | None
) -> RealisedMig:
    """A fresh CI in the idle GI the claim adopted (kubeletplugin/prepare/idle.py): the GI id is in the
    durable intent already, so only the CI id is recorded. An idle GI has no CI (unprepare destroyed
    it before recording the GI idle, and the startup reconcile clears any a crash left), so the new
    CI is the only one: no process of the previous claim can reach it."""
    gi = find_gi(ops, rec, by_placement=False)
    if gi is None:
        # Destroyed out of band while idle: fail, and the retry (the idle record gone with this
        # entry's rollback) creates a fresh GI.
        raise NvmlError(
            "adopt idle GPU instance",
            NvmlErrorCode.NOT_FOUND,
            f"idle GI {rec.gi_id} at placement {rec.placement_start}:{rec.placement_size} of GPU"
            f" {rec.gpu_index} is gone",
        )
    ci = ops.create_compute_instance(rec.gpu_index, gi.gi_id)
    if record is not None:
        record(ci_id=ci.ci_id)
    crash.reach("after-ci-create")
    return RealisedMig(gi.gi_id, ci.ci_id, ops.mig_uuid(rec.gpu_index, gi.gi_id, ci.ci_id))


def existing_mig(ops: NvmlOps, rec: PreparedDeviceRecord) -> RealisedMig:
    """The instance another claim made at an adminAccess record's placement (nothing is created).

    Without one the prepare fails and kubelet retries: the holder's pod may not be prepared yet."""
    gi = find_gi(ops, rec, by_placement=True)
    cis = ops.compute_instances(rec.gpu_index, gi.gi_id) if gi is not None else []
    if gi is None or not cis:
        raise NvmlError(
            "adminAccess",
            NvmlErrorCode.NOT_FOUND,
            f"no MIG instance at placement {rec.placement_start}:{rec.placement_size} of GPU "
            f"{rec.gpu_index} for adminAccess device {rec.device_name}: adminAccess exposes the instance "
            "the claim holding the device made and never creates one (retried until it exists)",
        )
    return RealisedMig(gi.gi_id, cis[0].ci_id, ops.mig_uuid(rec.gpu_index, gi.gi_id, cis[0].ci_id))


def destroy_mig(
    ops: NvmlOps, rec: PreparedDeviceRecord, crash: Crashpoints, *, by_placement: bool = False
) -> bool:
    """Destroy what flexmig created for `rec`: its CIs, then its GI. True when anything was destroyed.

    The GI is found by the id recorded when NVML created it. Only the startup reconcile of a prepare
    interrupted by a crash passes `by_placement=True`: a crash between NVML's return and the
    checkpoint write leaves the intent without an id, and at start no other prepare runs.

    Gone (NOT_FOUND, or NOT_SUPPORTED because MIG is off) counts as destroyed. IN_USE and every other
    error propagates as NvmlError, so the caller returns it and kubelet retries. A record that only
    adopted an instance (created_gi False) destroys nothing.
    """
    if not rec.created_gi:
        return False
    gi = find_gi(ops, rec, by_placement=by_placement)
    if gi is None:
        return False
    if rec.ci_id is not None:
        # The usual case: one CI we recorded. Destroying it by id saves enumerating every CI
        # profile of the GI (a dozen NVML calls); anything else found in our GI is handled below.
        destroy_ci(ops, rec.gpu_index, gi.gi_id, rec.ci_id)
    else:
        destroy_all_cis(ops, rec.gpu_index, gi.gi_id)
    crash.reach("mid-destroy")
    try:
        ops.destroy_gpu_instance(rec.gpu_index, gi.gi_id)
    except NvmlError as exc:
        if exc.code in GONE_CODES:
            return True
        if exc.code is not NvmlErrorCode.IN_USE or rec.ci_id is None:
            raise
        # A CI we did not record (created inside our GI by someone else) keeps the GI busy; the GI
        # is ours, so everything in it goes. A process still running keeps it IN_USE, as it should.
        destroy_all_cis(ops, rec.gpu_index, gi.gi_id)
        try:
            ops.destroy_gpu_instance(rec.gpu_index, gi.gi_id)
        except NvmlError as again:
            if again.code not in GONE_CODES:
                raise
    return True


def destroy_ci(ops: NvmlOps, index: int, gi_id: int, ci_id: int) -> None:
    try:
        ops.destroy_compute_instance(index, gi_id, ci_id)
    except NvmlError as exc:
        if exc.code not in GONE_CODES:
            raise


def destroy_all_cis(ops: NvmlOps, index: int, gi_id: int) -> None:
    try:
        cis = ops.compute_instances(index, gi_id)
    except NvmlError as exc:
        if exc.code not in GONE_CODES:
            raise
        return
    for ci in cis:
        destroy_ci(ops, index, gi_id, ci.ci_id)
