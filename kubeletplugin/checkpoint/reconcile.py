"""Startup reconcile: make the checkpoint and the GPUs agree before kubelet can call us.

1. Every `PrepareStarted` claim is rolled back (its instances, found by recorded id or, for an
   id a crash kept from being recorded, by the ownership intent's placement; its CDI spec, its entry);
   kubelet retries the prepare from scratch. This is the only place that looks by placement.
2. Every `PrepareCompleted` claim is looked up in the API. If the claim is gone or was replaced (UID
   changed), nothing owns its instances any more: they are destroyed. If it exists, its instances are
   adopted as they are (missing ones are logged: the unprepare kubelet will send treats them as gone).
   When the API cannot answer, the claim is kept: never destroy on uncertainty. Every claim kept has
   its CDI spec rewritten from the checkpoint and fsynced: prepare renames the spec into place
   without an fsync, so this is what makes a kept claim's spec durable.
3. Every GI on the node that no remaining checkpoint record accounts for was not created by this
   plugin (or was created by us for a claim we already cleaned up and then re-created by someone
   else): it is logged and counted (`flexmig_node_orphan_instances_total{action="reported"}`), never
   destroyed (the periodic reconcile, kubeletplugin/checkpoint/periodic.py, withdraws the devices it overlaps).
4. Every idle GI record (kubeletplugin/prepare/idle.py) is kept while NVML shows that GI (any CI in
   it is destroyed) and dropped otherwise; a kept idle GI is ours, never reported in step 3.
5. Hopper+ GPUs left in MIG mode without any instance are switched back off (not on hami-core
   nodes: flexmig never changes MIG mode there, and their shared-GPU claims own no NVML object, so
   steps 1-2 only remove their CDI spec, cache dir and checkpoint entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from driver.nvml.types import GpuInfo, NvmlError
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.kubeapi import ClaimApi, ClaimNotFound
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.migmode import MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.preparer import Preparer
from kubeletplugin.prepare.steps import find_gi

log = structlog.get_logger(__name__)


@dataclass
class ReconcileReport:
    rolled_back: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)  # completed claims whose owner is gone
    adopted: list[str] = field(default_factory=list)
    destroyed_instances: int = 0
    foreign_instances: list[tuple[int, int]] = field(default_factory=list)  # (gpu, gi id)
    errors: list[str] = field(default_factory=list)


def reconcile(
    *,
    preparer: Preparer,
    store: CheckpointStore,
    ops: NvmlOps,
    api: ClaimApi,
    gpus: list[GpuInfo],
    migmode: MigModeManager,
    status: StatusWriter,
    metrics: NodeMetrics,
    manage_mig_mode: bool = True,
) -> ReconcileReport:
    report = ReconcileReport()
    checkpoint = store.load()
    for entry in list(checkpoint.claims.values()):
        if entry.state is ClaimState.PREPARE_STARTED:
            # A crash between NVML's create and the checkpoint write leaves the intent without an id:
            # only here (nothing else runs yet) is the instance at the intended placement taken as ours.
            _destroy(
                preparer,
                metrics,
                entry,
                "interrupted prepare rolled back",
                report,
                report.rolled_back,
                by_placement=True,
            )
            continue
        try:
            view = api.get_claim(entry.namespace, entry.name)
            owner_gone = view.uid != entry.uid
        except ClaimNotFound:
            view, owner_gone = None, True
        except Exception as exc:  # any failure (urllib3 errors too) is uncertainty: keep the claim
            log.warning("cannot check a prepared claim's owner; keeping it", uid=entry.uid, error=str(exc))
            report.adopted.append(entry.uid)
            _rewrite_spec(preparer, entry, report)
            continue
        if owner_gone:
            _destroy(preparer, metrics, entry, "claim gone; destroyed its instances", report, report.released)
            continue
        report.adopted.append(entry.uid)
        _rewrite_spec(preparer, entry, report)
        for rec in entry.devices:
            if rec.is_mig and find_gi(ops, rec) is None:
                log.warning(
                    "prepared MIG instance is missing on the GPU",
                    uid=entry.uid,
                    device=rec.device_name,
                    gi=rec.gi_id,
                )
        if view is not None:
            for pod in view.reserved_for:
                try:
                    status.refresh_pod(view.namespace, pod.name, write_annotation=False)
                except Exception as exc:  # metrics only: never fails the reconcile
                    log.warning("cannot read a pod for its metrics", pod=pod.name, error=str(exc))

    preparer.idle.check_at_start(report.errors)
    final = store.load()
    owned = {
        (d.gpu_index, d.gi_id)
        for c in final.claims.values()
        for d in c.devices
        if d.gi_id is not None and not d.admin  # an admin record watches an instance, owns none
    } | {(i.gpu_index, i.gi_id) for i in final.idle.values()}
    for gpu in gpus:
        try:
            instances = ops.gpu_instances_or_none(gpu.index)
        except NvmlError as exc:
            report.errors.append(f"GPU {gpu.index}: {exc}")
            continue
        for gi in instances:
            if (gpu.index, gi.gi_id) in owned:
                continue
            report.foreign_instances.append((gpu.index, gi.gi_id))
            metrics.orphans_found.labels(action="reported").inc()
            log.warning(
                "GPU instance not created by flexmig (or not owned by any claim); leaving it untouched",
                gpu=gpu.index,
                gi=gi.gi_id,
                profile_id=gi.profile_id,
                placement=str(gi.placement),
            )
        if manage_mig_mode:
            migmode.release(gpu.index)
    preparer.update_checkpoint_metrics()
    log.info(
        "startup reconcile done",
        rolled_back=report.rolled_back,
        released=report.released,
        adopted=len(report.adopted),
        destroyed_instances=report.destroyed_instances,
        foreign_instances=report.foreign_instances,
        errors=report.errors,
    )
    return report


def _destroy(
    preparer: Preparer,
    metrics: NodeMetrics,
    entry: ClaimCheckpoint,
    what: str,
    report: ReconcileReport,
    into: list[str],
    *,
    by_placement: bool = False,
) -> None:
    try:
        n = preparer.rollback(entry, by_placement=by_placement)
    except (NvmlError, OSError) as exc:
        report.errors.append(f"claim {entry.uid}: {exc}")
        log.error(
            "cannot clean up a claim at startup; kept for the next attempt", uid=entry.uid, error=str(exc)
        )
        return
    into.append(entry.uid)
    report.destroyed_instances += n
    if n:
        # Instances this plugin created that no claim owns any more.
        metrics.orphans_found.labels(action="destroyed").inc(n)
    log.info(what, uid=entry.uid, destroyed_instances=n)


def _rewrite_spec(preparer: Preparer, entry: ClaimCheckpoint, report: ReconcileReport) -> None:
    try:
        preparer.rewrite_spec(entry)
    except Exception as exc:  # the claim stays adopted; its spec stays what prepare left
        report.errors.append(f"claim {entry.uid}: CDI spec: {exc}")
        log.error("cannot rewrite a prepared claim's CDI spec", uid=entry.uid, error=str(exc))
