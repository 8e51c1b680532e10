"""TEST CODE: the pod side of the kubelet stand-in (kubelet_standin.py); it is not a kubelet.

`PodWorker` keeps the pods bound to one node (fed by the stand-in's watch) and works on them from one
thread, as kubelet's pod workers would: resolve a pod's claims (the claim name, or for a template the
generated claim in `status.resourceClaimStatuses`), wait until each is allocated and reserved for the
pod, `NodePrepareResources` for the claims with results of our driver, then mark the pod Running and
Ready through pods/status. A failure sets the pod condition `e2e.flexmig.dev/ResourcesPrepared=False`,
posts a Warning event (kubelet's reason `FailedPrepareDynamicResources`) and is retried with
exponential backoff. A pod with a deletionTimestamp gets `NodeUnprepareResources`, then is deleted with
grace period 0 and a uid precondition, as kubelet does once the containers are gone; a pod that
vanished without that (force-deleted) is unprepared too. No container ever runs.

`parallel` > 1 works on up to that many pods at once, as kubelet's per-pod workers do (one pod is never
worked on by two threads): what the end-to-end benchmark uses, where one thread per node would make
the node's prepares wait for each other's API round trips. The tests keep 1 (a deterministic order).

Not modelled: a claim shared by several pods on the node (kubelet unprepares it only when the last of
them goes; here every pod unprepares its own claims).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from controller.claims.podclaims import ClaimsPending, claim_names
from controller.kube.rest import claim_path, pod_path, request

from .plugin_harness import Kubelet

Obj = dict[str, Any]
PREPARED_CONDITION = "e2e.flexmig.dev/ResourcesPrepared"
FAILED_PREPARE = "FailedPrepareDynamicResources"
FAILED_UNPREPARE = "FailedUnprepareDynamicResources"
STRATEGIC = "application/strategic-merge-patch+json"
WAIT_POLL_S = 0.25  # a claim not allocated yet is not a failure: poll, no backoff, no event
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 8.0
READY_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    PREPARED_CONDITION,
)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class Action:
    """What the stand-in did, in order: prepare, running, unprepare, deleted, failed."""

    kind: str
    pod: str  # namespace/name
    claims: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    running: bool
    prepared: tuple[str, ...]
    last_error: str
    waiting_for: str


class _Wait(Exception):
    """Not ready yet (claim unallocated, plugin unregistered): poll again, it is not an error."""


class _Failed(Exception):
    """The plugin refused (prepare/unprepare error): report on the pod and back off."""


@dataclass(slots=True)
class _PodState:
    key: str  # namespace/name
    pod: Obj | None  # None: gone from the API
    prepared: tuple[ClaimRef, ...] = ()
    running: bool = False
    deleting: bool = False
    dirty: bool = True
    retry_at: float | None = None
    backoff: float = BACKOFF_START_S
    last_error: str = ""
    waiting_for: str = ""


@dataclass
class PodWorker:
    """The pods of one node. `plugin()` gives the registered plugin's client, or None."""

    api_client: Any  # authenticated as system:node:<node>
    node: str
    plugin: Callable[[], Kubelet | None]
    driver: str = DRIVER_NAME
    actions: list[Action] = field(default_factory=list)
    parallel: int = 1  # pods worked on at once

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pods: dict[str, _PodState] = {}

    def wake(self) -> None:
        self._wake.set()

    def view(self, namespace: str, name: str) -> PodView | None:
        with self._lock:
            for st in self._pods.values():
                if st.key == f"{namespace}/{name}":
                    return PodView(
                        st.running, tuple(r.name for r in st.prepared), st.last_error, st.waiting_for
                    )
        return None

    # --- fed by the watch -------------------------------------------------------------------------

    def replace(self, items: list[Obj]) -> None:
        """A relist: everything bound to the node now; what is missing was deleted unseen."""
        fresh = {p["metadata"]["uid"]: p for p in items}
        with self._lock:
            missed = [u for u in self._pods if u not in fresh]
        for uid in missed:
            self.update(uid, None)
        for uid, pod in fresh.items():
            self.update(uid, pod)

    def update(self, uid: str, pod: Obj | None) -> None:
        with self._lock:
            st = self._pods.get(uid)
            if st is None:
                if pod is None:
                    return
                meta = pod["metadata"]
                st = self._pods[uid] = _PodState(f"{meta['namespace']}/{meta['name']}", pod)
            st.pod = pod
            st.dirty = True
        self._wake.set()

    # --- the worker thread ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        pool = ThreadPoolExecutor(self.parallel, f"pods-{self.node}") if self.parallel > 1 else None
        in_flight: set[str] = set()  # guarded by _lock
        try:
            while not stop.is_set():
                now = time.monotonic()
                with self._lock:
                    due = [
                        u
                        for u, s in self._pods.items()
                        if u not in in_flight and (s.dirty or (s.retry_at is not None and s.retry_at <= now))
                    ]
                    for u in due:
                        self._pods[u].dirty = False
                        self._pods[u].retry_at = None
                    if pool is not None:
                        in_flight.update(due)
                    retries = [s.retry_at for s in self._pods.values() if s.retry_at is not None]
                for u in due:
                    if stop.is_set():
                        return
                    if pool is None:
                        self._sync_guarded(u)
                    else:
                        pool.submit(self._sync_in_pool, u, in_flight)
                if not due:
                    self._wake.wait(min([1.0, *(max(0.01, r - now) for r in retries)]))
                    self._wake.clear()
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _sync_in_pool(self, uid: str, in_flight: set[str]) -> None:
        try:
            self._sync_guarded(uid)
        finally:
            with self._lock:
                in_flight.discard(uid)
            self._wake.set()  # it may have become dirty meanwhile

    def _sync_guarded(self, uid: str) -> None:
        try:
            self._sync(uid)
        except Exception as exc:  # like kubelet's pod workers: never stop, retry the pod later
            with self._lock:
                st = self._pods.get(uid)
            if st is not None:
                st.last_error = f"{type(exc).__name__}: {exc}"
                self._retry(st, BACKOFF_MAX_S)

    def _retry(self, st: _PodState, delay: float) -> None:
        with self._lock:
            st.retry_at = time.monotonic() + delay

    def _sync(self, uid: str) -> None:
        with self._lock:
            st = self._pods.get(uid)
            pod = None if st is None else st.pod
        if st is None:
            return
        terminating = pod is None or bool(pod["metadata"].get("deletionTimestamp"))
        try:
            if pod is None:
                self._unprepare(st)
                with self._lock:
                    if st.pod is None:  # not re-created meanwhile
                        self._pods.pop(uid, None)
            elif terminating:
                self._terminate(st, pod)
            elif not st.running and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self._start(st, pod)
        except _Wait as wait:
            st.waiting_for = str(wait)
            self._retry(st, WAIT_POLL_S)
        except Exception as exc:
            st.last_error = str(exc) if isinstance(exc, _Failed) else f"{type(exc).__name__}: {exc}"
            self.actions.append(Action("failed", st.key, detail=st.last_error))
            if pod is not None:
                self._report(pod, FAILED_UNPREPARE if terminating else FAILED_PREPARE, st.last_error)
            self._retry(st, st.backoff)
            st.backoff = min(st.backoff * 2, BACKOFF_MAX_S)

    def _plugin(self) -> Kubelet:
        kubelet = self.plugin()
        if kubelet is None:
            raise _Wait(f"the {self.driver} plugin has not registered on {self.node}")
        return kubelet

    def _start(self, st: _PodState, pod: Obj) -> None:
        meta = pod["metadata"]
        ns = meta["namespace"]
        try:
            names = claim_names(pod)
        except ClaimsPending as exc:
            raise _Wait(str(exc)) from exc
        refs: list[ClaimRef] = []
        for cname in names.values():
            try:
                claim = request(self.api_client, "GET", claim_path(ns, cname))
            except ApiException as exc:
                # 403 too: the Node authorizer learns of the pod -> claim edge a moment after the pod.
                if exc.status in (403, 404):
                    raise _Wait(f"claim {ns}/{cname}: HTTP {exc.status}") from exc
                raise
            status = claim.get("status") or {}
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
            if not status.get("allocation"):
                raise _Wait(f"claim {ns}/{cname} is not allocated")
            if meta["uid"] not in {r.get("uid") for r in status.get("reservedFor") or ()}:
                raise _Wait(f"claim {ns}/{cname} is not reserved for the pod")
            if any(r.get("driver") == self.driver for r in results or ()):
                refs.append(ClaimRef(ns, cname, claim["metadata"]["uid"]))
        if refs:
            kubelet = self._plugin()
            st.prepared = tuple(refs)  # even a partial prepare is unprepared when the pod goes
            resp = kubelet.prepare([r.as_dict() for r in refs])
            problems = [f"{r.name}: {resp[r.uid].error}" for r in refs if r.uid in resp and resp[r.uid].error]
            problems += [f"{r.name}: no answer" for r in refs if r.uid not in resp]
            if problems:
                raise _Failed("NodePrepareResources failed: " + "; ".join(problems))
            self.actions.append(Action("prepare", st.key, tuple(r.name for r in refs)))
        self._mark_running(pod)
        st.running, st.last_error, st.waiting_for, st.backoff = True, "", "", BACKOFF_START_S
        self.actions.append(Action("running", st.key))

    def _unprepare(self, st: _PodState) -> None:
        if not st.prepared:
            return
        errors = self._plugin().unprepare([r.as_dict() for r in st.prepared])
        problems = [
            f"{r.name}: {errors.get(r.uid, 'no answer')}" for r in st.prepared if errors.get(r.uid, "x")
        ]
        if problems:
            raise _Failed("NodeUnprepareResources failed: " + "; ".join(problems))
        self.actions.append(Action("unprepare", st.key, tuple(r.name for r in st.prepared)))
        st.prepared = ()

    def _terminate(self, st: _PodState, pod: Obj) -> None:
        self._unprepare(st)
        if st.deleting:
            return
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        body["preconditions"] = {"uid": meta["uid"]}
        try:
            request(self.api_client, "DELETE", pod_path(meta["namespace"], meta["name"]), body)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of the same name
                raise
        st.deleting = True
        self.actions.append(Action("deleted", st.key))

    # --- writes -----------------------------------------------------------------------------------

    def _mark_running(self, pod: Obj) -> None:
        now = _now()
        spec, meta = pod["spec"], pod["metadata"]

        def status(c: Obj, init: bool) -> Obj:
            state = {
                "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            }
            return {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "containerID": f"e2e://{meta['uid'][:8]}-{c['name']}",
                "ready": not init,
                "started": not init,
                "restartCount": 0,
                "state": state if init else {"running": {"startedAt": now}},
            }

        conditions = [{"type": t, "status": "True", "lastTransitionTime": now} for t in READY_CONDITIONS]
        body: Obj = {
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": (pod.get("status") or {}).get("startTime") or now,
                "conditions": conditions,
                "containerStatuses": [status(c, False) for c in spec["containers"]],
            }
        }
        if spec.get("initContainers"):
            body["status"]["initContainerStatuses"] = [status(c, True) for c in spec["initContainers"]]
        request(
            self.api_client,
            "PATCH",
            pod_path(meta["namespace"], meta["name"], "status"),
            body,
            content_type=STRATEGIC,
        )

    def _report(self, pod: Obj, reason: str, message: str) -> None:
        """The failure on the pod: a condition (prepare only) and a Warning event; best effort."""
        meta = pod["metadata"]
        now = _now()
        # Any error, not only ApiException: with the API server down the client raises urllib3's
        # MaxRetryError, which escaped here and ended the pod worker thread for good.
        with contextlib.suppress(Exception):
            if reason == FAILED_PREPARE:
                cond = {
                    "type": PREPARED_CONDITION,
                    "status": "False",
                    "reason": reason,
                    "message": message[:1000],
                    "lastTransitionTime": now,
                }
                request(
                    self.api_client,
                    "PATCH",
                    pod_path(meta["namespace"], meta["name"], "status"),
                    {"status": {"conditions": [cond]}},
                    content_type=STRATEGIC,
                )
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                    "namespace": meta["namespace"],
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message[:1000],
                "type": "Warning",
                "source": {"component": "kubelet", "host": self.node},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            request(self.api_client, "POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)
