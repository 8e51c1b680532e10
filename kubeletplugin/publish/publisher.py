"""Keeps this node's ResourceSlices on the API server equal to what `build_node_slices` says.

A background loop (driver.looprunner: any exception is retried with backoff, and a dead or stuck loop
shows in /healthz) does the work, so the registration callback (which runs in kubelet's gRPC call)
only sets a flag. A sync lists the node's slices (`spec.nodeName=<node>,spec.driver=gpu.flexmig.dev`),
and when their content differs from the desired one, or any is missing (kubelet wipes a node's slices
at its start and after a driver disconnects), writes all slices at a new pool generation and deletes
the extras. Content is compared through a hash annotation we set ourselves, so server-side defaulting
of fields can never make an unchanged pool look changed and bump the generation on every resync.
A periodic resync (the drift check) repairs anything else.

After every (re-)registration the publisher does not stop at one sync: kubelet's wipe of the node's
slices and our republish race (they ran 53 ms apart after a kubelet restart), and if the wipe lands
second the node would have no slices until the drift check. So for `verify_s` after a registration
the slices are checked every `verify_poll_s` and written again if they vanished or changed. Such a
check is one LIST compared by name and resourceVersion with what the last sync left; only a difference
(or a local change asking for a sync) builds and hashes the desired slices again.

Slices are read and written as raw JSON, never through the client's typed models: a node's slice holds
hundreds of devices, and decoding it into models and back cost a plugin about 70 ms of CPU per sync
(the verification window alone made that several CPU seconds per node after every start; see
benchmarks/RESULTS.md, "End to end").
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from driver.looprunner import LoopRunner
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.kube.kubeapi import REQUEST_TIMEOUT, raw_json
from kubeletplugin.publish.slices import NodeSlices

log = structlog.get_logger(__name__)

HASH_ANNOTATION = f"{DRIVER_NAME}/content-hash"
DEFAULT_RESYNC_S = 60.0
DEFAULT_VERIFY_S = 30.0  # kubelet cancels a pending wipe when a driver re-registers within 30 s
DEFAULT_VERIFY_POLL_S = 0.5
_BACKOFF_START_S = 0.5
_BACKOFF_MAX_S = 8.0  # a recovered API server sees every node again within ~12 s

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
        verify_s: float = DEFAULT_VERIFY_S,
        verify_poll_s: float = DEFAULT_VERIFY_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resource = k8s.ResourceV1Api(api_client)
        self._node = node_name
        self._build = build
        self._metrics = metrics
        self._verify_s = verify_s
        self._verify_poll_s = verify_poll_s
        self._clock = clock
        self._wake = threading.Event()
        self._synced = threading.Condition()
        self._syncs = 0
        self._generation = 0
        self._verify_until = 0.0  # guarded by _synced
        self._left: dict[str, str] = {}  # slice name -> resourceVersion, as the last sync left them
        self.runner = LoopRunner(
            "slice-publisher",
            self._iteration,
            interval_s=resync_s,
            wake=self._wake,
            backoff_start_s=_BACKOFF_START_S,
            backoff_max_s=_BACKOFF_MAX_S,
            on_error=lambda exc: metrics.loop_errors.labels(loop="slice-publisher").inc(),
        )

    def start(self) -> None:
        self._wake.set()
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
        self.runner.join(10)

    def request(self) -> None:
        """Ask for a sync soon (safe from any thread, returns at once)."""
        self._wake.set()

    def registered(self) -> None:
        """kubelet (re-)registered us: sync now and keep checking for `verify_s` (returns at once)."""
        with self._synced:
            self._verify_until = self._clock() + self._verify_s
        self._wake.set()

    def wait_synced(self, after: int, timeout_s: float) -> bool:
        """Wait until more than `after` successful syncs happened."""
        with self._synced:
            return self._synced.wait_for(lambda: self._syncs > after, timeout=timeout_s)

    @property
    def syncs(self) -> int:
        with self._synced:
            return self._syncs

    def _iteration(self) -> None:
        """One sync; inside a verification window, keep checking until it closes."""
        self.sync()
        while True:
            with self._synced:
                left = self._verify_until - self._clock()
            if left <= 0 or self.runner.stop_event.wait(min(self._verify_poll_s, left)):
                return
            self.runner.beat()
            if self._wake.is_set():  # a local change asked for a sync: do it now, not after the window
                self._wake.clear()
                self.sync()
            elif self._verify():
                log.warning("node's ResourceSlices vanished or changed right after registration; republished")

    def _existing(self) -> dict[str, dict[str, Any]]:
        selector = f"spec.nodeName={self._node},spec.driver={DRIVER_NAME}"
        listed = raw_json(
            self._resource.list_resource_slice(
                field_selector=selector, _request_timeout=REQUEST_TIMEOUT, _preload_content=False
            )
        )
        out: dict[str, dict[str, Any]] = {}
        for item in listed.get("items") or []:
            out[str(item["metadata"]["name"])] = item
        return out

    def _verify(self) -> bool:
        """A check inside the verification window: a full sync only when the slices on the server are
        not the ones the last sync left; True when something was written."""
        existing = self._existing()
        versions = {name: str(s["metadata"].get("resourceVersion")) for name, s in existing.items()}
        if self._left and versions == self._left:
            return False
        return self.sync(existing)

    def sync(self, existing: dict[str, dict[str, Any]] | None = None) -> bool:
        """One reconcile pass (from `existing`, just listed, or a new list); True when something was
        written."""
        if existing is None:
            existing = self._existing()
        left = {name: str(s["metadata"].get("resourceVersion")) for name, s in existing.items()}
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
                # Until this write's answer is read, the last sync's record is no longer true.
                self._left = {}
                if current is None:
                    written = raw_json(
                        self._resource.create_resource_slice(
                            body=body, _request_timeout=REQUEST_TIMEOUT, _preload_content=False
                        )
                    )
                else:
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    written = raw_json(
                        self._resource.replace_resource_slice(
                            name=published.name,
                            body=body,
                            _request_timeout=REQUEST_TIMEOUT,
                            _preload_content=False,
                        )
                    )
                left[published.name] = str(written["metadata"].get("resourceVersion"))
            for name in sorted(set(existing) - set(desired.names)):
                try:
                    self._resource.delete_resource_slice(name=name, _request_timeout=REQUEST_TIMEOUT)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                left.pop(name, None)
            log.info(
                "published ResourceSlices",
                generation=self._generation,
                slices=list(desired.names),
                gpus=[(g.gpu_index, g.whole, g.mig_devices, g.reason) for g in desired.gpus],
            )
        self._metrics.published_devices.set(
            sum(len(s.body["spec"].get("devices") or []) for s in desired.slices)
        )
        self._left = left
        with self._synced:
            self._syncs += 1
            self._synced.notify_all()
        return not unchanged
