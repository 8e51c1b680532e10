"""Keeps this node's ResourceSlices on the API server equal to what `build_node_slices` says.

A background thread does the work, so the registration callback (which runs in kubelet's gRPC call)
only sets a flag. A sync lists the node's slices (`spec.nodeName=<node>,spec.driver=gpu.flexmig.dev`),
and when their content differs from the desired one, or any is missing (kubelet wipes a node's slices
at its start and after a driver disconnects), writes all slices at a new pool generation and deletes
the extras. Content is compared through a hash annotation we set ourselves, so server-side defaulting
of fields can never make an unchanged pool look changed and bump the generation on every resync.
API errors are retried with exponential backoff; a periodic resync repairs anything else.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from kubeletplugin.kubeapi import api_error_text
from kubeletplugin.metrics import NodeMetrics
from kubeletplugin.slices import NodeSlices

log = structlog.get_logger(__name__)

HASH_ANNOTATION = f"{DRIVER_NAME}/content-hash"
DEFAULT_RESYNC_S = 60.0
_BACKOFF_START_S = 0.5
_BACKOFF_MAX_S = 30.0

# Desired slices at a given generation.
SliceBuilder = Callable[[int], NodeSlices]


def content_hash(slices: NodeSlices) -> str:
    """Hash of everything but the generation: the pool's content."""
    parts = []
    for s in slices.slices:
        spec = dict(s.body["spec"])
        spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
        parts.append({"name": s.name, "metadata": s.body["metadata"], "spec": spec})
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class SlicePublisher:
    def __init__(
        self,
        api_client: k8s.ApiClient,
        node_name: str,
        build: SliceBuilder,
        metrics: NodeMetrics,
        *,
        resync_s: float = DEFAULT_RESYNC_S,
    ) -> None:
        self._api_client = api_client
        self._resource = k8s.ResourceV1Api(api_client)
        self._node = node_name
        self._build = build
        self._metrics = metrics
        self._resync_s = resync_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._synced = threading.Condition()
        self._syncs = 0
        self._generation = 0
        self._thread = threading.Thread(target=self._run, name="flexmig-slices", daemon=True)

    def start(self) -> None:
        self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def request(self) -> None:
        """Ask for a sync soon (safe from any thread, returns at once)."""
        self._wake.set()

    def wait_synced(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` successful syncs happened."""
        with self._synced:
            return self._synced.wait_for(lambda: self._syncs > after, timeout=timeout_s)

    @property
    def syncs(self) -> int:
        with self._synced:
            return self._syncs

    def _run(self) -> None:
        backoff = _BACKOFF_START_S
        while not self._stop.is_set():
            self._wake.wait(self._resync_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
                backoff = _BACKOFF_START_S
            except (ApiException, OSError, ValueError) as exc:
                detail = api_error_text(exc) if isinstance(exc, ApiException) else str(exc)
                log.warning("publishing ResourceSlices failed; retrying", error=detail, retry_in_s=backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                self._wake.set()

    def _existing(self) -> dict[str, dict[str, Any]]:
        selector = f"spec.nodeName={self._node},spec.driver={DRIVER_NAME}"
        listed = self._resource.list_resource_slice(field_selector=selector)
        out: dict[str, dict[str, Any]] = {}
        for item in listed.items or []:
            data = self._api_client.sanitize_for_serialization(item)  # type: ignore[no-untyped-call]
            out[data["metadata"]["name"]] = data
        return out

    def sync(self) -> bool:
        """One reconcile pass; True when something was written."""
        existing = self._existing()
        gens = [
            int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in existing.values()
        ]
        self._generation = max([self._generation, *gens])
        desired = self._build(self._generation)
        digest = content_hash(desired)
        unchanged = set(existing) == set(desired.names) and all(
            ((s.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION) == digest
            for s in existing.values()
        )
        if not unchanged:
            self._generation += 1
            desired = self._build(self._generation)
            for published in desired.slices:
                body = json.loads(json.dumps(published.body))
                body["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
                current = existing.get(published.name)
                if current is None:
                    self._resource.create_resource_slice(body=body)
                else:
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    self._resource.replace_resource_slice(name=published.name, body=body)
            for name in sorted(set(existing) - set(desired.names)):
                try:
                    self._resource.delete_resource_slice(name=name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            log.info(
                "published ResourceSlices",
                generation=self._generation,
                slices=list(desired.names),
                gpus=[(g.gpu_index, g.whole, g.mig_devices, g.reason) for g in desired.gpus],
            )
        self._metrics.published_devices.set(
            sum(len(s.body["spec"].get("devices") or []) for s in desired.slices)
        )
        with self._synced:
            self._syncs += 1
            self._synced.notify_all()
        return not unchanged
