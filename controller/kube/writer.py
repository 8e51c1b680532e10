"""Every write the controller makes, as raw JSON with optimistic concurrency.

Each write carries the resourceVersion the decision was made on, so the API server answers 409 if the
object changed meanwhile (another replica, kube-scheduler, a user); callers re-read and decide again
instead of overwriting. Merge patches that include `metadata.resourceVersion` get the same guarantee.

Leadership is checked before EVERY write (`NotLeader`), not once per step: a step can outlast the
renew deadline, and a replica that lost its lease must not write one more object.

Checked once before sending is not enough: a write may still land long after the check. So each write
carries a deadline, `write_budget()` (controller/kube/leader.py: the time left before any other replica
can take the Lease over, less a safety margin), both as the client's timeout and as the API server's own
`timeout` parameter (the server abandons the request when it passes). A write that cannot finish in
time is not sent. `drain()` waits for the writes in flight, so that a replica giving its Lease up on
shutdown does so only once none of its writes can still land.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.kube.outcome import NotSent
from controller.kube.rest import MERGE_PATCH, claim_path, config_map_path, pod_path, request
from controller.runtime import crashpoints

FINALIZER = "gpu.flexmig.dev/allocation-protection"
"""On claims the controller allocated: it, not the resourceclaim controller, deallocates them."""

ALLOCATED_FOR_ANNOTATION = "gpu.flexmig.dev/allocated-for-pod"
"""On claims the controller allocated: the UID of the pod they were allocated for."""

CONDITION_TYPE = "gpu.flexmig.dev/Allocated"
"""Pod condition naming why the controller cannot place the pod (status False) or that it did."""

Obj = dict[str, Any]


WRITE_TIMEOUT_S = 10.0
"""The longest any write may take, leader or not (the transport's default was 30 s)."""
MIN_WRITE_BUDGET_S = 0.5
"""Less time than this left before the Lease could pass to another replica: the write is not sent."""


class NotLeader(NotSent):
    """This replica does not (or no longer) hold the lease, or too little of it is left: not sent."""


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Send = Callable[..., dict[str, Any]]
"""`request(api_client, method, path, body, content_type=...)` (controller/kube/rest.py) or a stand-in."""


class Writer:
    def __init__(
        self,
        api_client: Any,
        component: str = "flexmig-controller",
        *,
        is_leader: Callable[[], bool] = lambda: True,
        send: Send = request,
        write_budget: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.api = api_client
        self.component = component
        self.is_leader = is_leader
        self.write_budget = write_budget
        self._send = send
        self._in_flight = 0
        self._idle = threading.Condition()

    def _write(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Obj:
        if not self.is_leader():
            raise NotLeader(f"not the leader: {method} {path} not sent")
        budget = self.write_budget()
        timeout_s = WRITE_TIMEOUT_S if budget is None else min(WRITE_TIMEOUT_S, budget)
        if timeout_s < MIN_WRITE_BUDGET_S:
            raise NotLeader(f"{timeout_s:.2f}s of leadership left: {method} {path} not sent")
        with self._idle:
            self._in_flight += 1
        try:
            return self._send(
                self.api,
                method,
                path,
                body,
                content_type=content_type,
                timeout_s=timeout_s,
                # The server's own deadline, a little shorter: it gives up before we stop waiting.
                query=[("timeout", f"{max(1, int(timeout_s * 1000) - 200)}ms")],
            )
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def drain(self, timeout_s: float = WRITE_TIMEOUT_S) -> bool:
        """Wait until no write is in flight (True), or `timeout_s` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    # --- claims -------------------------------------------------------------------------------------

    def read_claim(self, namespace: str, name: str) -> Obj:
        return self._send(self.api, "GET", claim_path(namespace, name), timeout_s=WRITE_TIMEOUT_S)

    def protect_claim(self, claim: Mapping[str, Any], pod_uid: str) -> Obj:
        """Add our finalizer and the pod annotation (409 if the claim changed since `claim`).

        A full update, not a patch: kube-apiserver 1.37 rejects any patch of a claim whose spec carries
        opaque config ("spec: field is immutable"), while an update with the same spec passes.
        """
        body: Obj = json.loads(json.dumps(claim))
        meta = body["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []):
            meta.setdefault("finalizers", []).append(FINALIZER)
        meta.setdefault("annotations", {})[ALLOCATED_FOR_ANNOTATION] = pod_uid
        return self._write("PUT", claim_path(meta["namespace"], meta["name"]), body)

    def write_allocation(
        self,
        claim: Mapping[str, Any],
        allocation: Mapping[str, Any] | None,
        reserve_for: Mapping[str, Any] | None = None,
    ) -> Obj:
        """Replace status.allocation (None clears it, with the device statuses and reservations that
        depend on it). `reserve_for`: a pod to add to status.reservedFor in the same write.

        Reserving for the pod whose gate we then remove is what kube-scheduler's PreBind would do
        next: done here, the scheduler has nothing left to write for the claim (no claim update, no
        nominatedNodeName patch before PreBind), which halves its API requests for the pod and the
        time they wait in its client's rate limiter (benchmarks/RESULTS.md, "End to end")."""
        if allocation is not None:
            crashpoints.reach("before-allocation-write")
        body = json.loads(json.dumps(claim))
        status = body.setdefault("status", {})
        if allocation is None:
            status.pop("allocation", None)
            status.pop("devices", None)
            status.pop("reservedFor", None)  # the API allows no reservation without an allocation
        else:
            status["allocation"] = dict(allocation)
            if reserve_for is not None:
                pod_meta = reserve_for["metadata"]
                reserved = status.setdefault("reservedFor", [])
                if all(r.get("uid") != pod_meta["uid"] for r in reserved):
                    reserved.append({"resource": "pods", "name": pod_meta["name"], "uid": pod_meta["uid"]})
        meta = claim["metadata"]
        return self._write("PUT", claim_path(meta["namespace"], meta["name"], "status"), body)

    def unprotect_claim(self, claim: Mapping[str, Any]) -> Obj | None:
        """Remove our finalizer and annotation (None if the claim is gone as a result)."""
        body: Obj = json.loads(json.dumps(claim))
        meta = body["metadata"]
        meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        (meta.get("annotations") or {}).pop(ALLOCATED_FOR_ANNOTATION, None)
        try:
            return self._write("PUT", claim_path(meta["namespace"], meta["name"]), body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- pods ---------------------------------------------------------------------------------------

    def read_pod(self, namespace: str, name: str) -> Obj:
        return self._send(self.api, "GET", pod_path(namespace, name), timeout_s=WRITE_TIMEOUT_S)

    def release_pod(self, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> Obj:
        """Write the mirror annotation and remove our scheduling gate (409 if the pod changed)."""
        crashpoints.reach("before-gate-removal")
        meta = pod["metadata"]
        gates = [
            g
            for g in (pod.get("spec") or {}).get("schedulingGates") or []
            if g.get("name") != ALLOCATION_GATE
        ]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": dict(annotations)},
            "spec": {"schedulingGates": gates},
        }
        return self._write("PATCH", pod_path(meta["namespace"], meta["name"]), body, MERGE_PATCH)

    def evict_pod(self, pod: Mapping[str, Any]) -> Obj:
        """Evict through the Eviction API (policy/v1): PodDisruptionBudgets are checked by the server
        (429 when one forbids it), and the pod is deleted with its own grace period. The uid
        precondition keeps a pod recreated under the same name from being evicted in its place."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "deleteOptions": {"preconditions": {"uid": meta["uid"]}},
        }
        return self._write("POST", pod_path(meta["namespace"], meta["name"], "eviction"), body)

    # --- the controller's own ConfigMaps (controller/kube/roomstore.py) -------------------------------

    def read_config_map(self, namespace: str, name: str) -> Obj:
        return self._send(self.api, "GET", config_map_path(namespace, name), timeout_s=WRITE_TIMEOUT_S)

    def create_config_map(self, namespace: str, body: Mapping[str, Any]) -> Obj:
        return self._write("POST", config_map_path(namespace), dict(body))

    def replace_config_map(self, namespace: str, name: str, body: Mapping[str, Any]) -> Obj:
        """A full update carrying `metadata.resourceVersion`: 409 when the map changed since."""
        return self._write("PUT", config_map_path(namespace, name), dict(body))

    def set_condition(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        condition = {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": _now(),
        }
        # Strategic merge: pod conditions merge by type, so other conditions are left alone.
        self._write(
            "PATCH",
            pod_path(meta["namespace"], meta["name"], "status"),
            {"status": {"conditions": [condition]}},
            "application/strategic-merge-patch+json",
        )

    def event(self, obj: Mapping[str, Any], kind: str, event_type: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        now = _now()
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta.get("namespace") or "default",
            },
            "involvedObject": {
                "apiVersion": "v1" if kind == "Pod" else "resource.k8s.io/v1",
                "kind": kind,
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
        }
        self._write("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body)
