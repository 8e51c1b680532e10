"""Writes a prepared claim's realised identity to the API and keeps `hami_mig_device_info` current.

- claim `status.devices[]` (this driver's entries replaced, other drivers' kept), retried on conflicts;
- the HAMi mirror annotation on every pod of this node that reserves the claim, recomputed from the
  checkpoint so that a pod with several claims gets one consistent array whatever order they were
  prepared in (a per-pod lock keeps compute+write of concurrent claims of one pod in order);
- the `hami_mig_device_info` series of those pods.

Any API failure propagates: the preparer turns it into the claim's error, kubelet retries, and the
retry (idempotent) writes again.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import structlog
from kubernetes.client.exceptions import ApiException

from api.constants import ANNOTATION_MIG_ALLOCATIONS, DRIVER_NAME
from driver.migannotation import encode_mig_allocations
from kubeletplugin.agent.metrics import NodeMetrics, RealizedInstance
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.claimstatus import (
    ContainerDevice,
    annotation_records,
    device_status_entries,
    pod_mig_devices,
)
from kubeletplugin.kube.kubeapi import ClaimApi, ClaimView

log = structlog.get_logger(__name__)

_CONFLICT_RETRIES = 5


class StatusWriter:
    def __init__(self, api: ClaimApi, store: CheckpointStore, metrics: NodeMetrics, node_name: str) -> None:
        self._api = api
        self._store = store
        self._metrics = metrics
        self._node = node_name
        self._lock = threading.Lock()
        self._pod_locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._usage: dict[tuple[str, str], list[ContainerDevice]] = {}

    def _pod_lock(self, namespace: str, name: str) -> threading.Lock:
        with self._lock:
            return self._pod_locks[(namespace, name)]

    def write(self, view: ClaimView, entry: ClaimCheckpoint) -> None:
        self._write_device_status(view, entry)
        for pod in view.reserved_for:
            self.refresh_pod(view.namespace, pod.name, write_annotation=True)

    def _write_device_status(self, view: ClaimView, entry: ClaimCheckpoint) -> None:
        devices = device_status_entries(DRIVER_NAME, entry.devices)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self._api.set_device_status(view, devices)
                return
            except ApiException as exc:
                # The status carries a resourceVersion precondition; someone else (the allocator)
                # updating the claim in between is normal and simply means read and try again.
                if exc.status != 409 or attempt == _CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))

    def refresh_pod(self, namespace: str, pod_name: str, *, write_annotation: bool) -> None:
        """Recompute the pod's MIG devices from the checkpoint; write the mirror if it changed."""
        with self._pod_lock(namespace, pod_name):
            pod = self._api.get_pod(namespace, pod_name)
            if pod is None or (pod.get("spec") or {}).get("nodeName") != self._node:
                return  # gone, or not on this node: its MIG devices are not ours to mirror
            completed = {
                c.name: c
                for c in self._store.load().claims.values()
                if c.namespace == namespace and c.state is ClaimState.PREPARE_COMPLETED
            }
            devices = pod_mig_devices(pod, completed)
            if write_annotation:
                value = encode_mig_allocations(annotation_records(devices)) if devices else None
                current = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                    ANNOTATION_MIG_ALLOCATIONS
                )
                if value != current:
                    self._api.set_pod_annotation(namespace, pod_name, ANNOTATION_MIG_ALLOCATIONS, value)
            self._set_usage((namespace, pod_name), devices)

    def forget_claim(self, claim_uid: str) -> None:
        """The claim was unprepared: its instances no longer exist, so their info series go."""
        with self._lock:
            for key, devices in list(self._usage.items()):
                kept = [d for d in devices if d.claim_uid != claim_uid]
                if kept:
                    self._usage[key] = kept
                else:
                    del self._usage[key]
            self._publish_locked()

    def _set_usage(self, pod: tuple[str, str], devices: list[ContainerDevice]) -> None:
        with self._lock:
            if devices:
                self._usage[pod] = devices
            else:
                self._usage.pop(pod, None)
            self._publish_locked()

    def _publish_locked(self) -> None:
        self._metrics.set_realized_instances(
            RealizedInstance(
                namespace=ns,
                pod=pod,
                container=d.container_name,
                vdevice_index=d.device_index,
                device_uuid=d.device.gpu_uuid,
                mig_uuid=d.device.mig_uuid or "",
                profile=d.device.profile or "",
                gpu_instance_id=d.device.gi_id if d.device.gi_id is not None else -1,
                compute_instance_id=d.device.ci_id if d.device.ci_id is not None else -1,
            )
            for (ns, pod), devices in sorted(self._usage.items())
            for d in devices
        )
