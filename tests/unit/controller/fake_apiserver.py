"""An in-memory API server behind the controller's real `Writer` (its `send` hook), with what matters for
concurrency: one resourceVersion counter, 409 on a stale resourceVersion, an allocation that cannot be
changed once set (only cleared), finalizers that hold a deleted claim, and a watch stream the test
delivers to the controller's event queue when and in whatever order it likes.

Unit tests cannot reach the real control plane's timing; this lets them make the watch late, reorder it
or replay it (as a slow or reconnecting watch does), and inspect what the "server" stores afterwards.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from ctl_helpers import CLASSES, node_slices
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.allocation.loop import Controller
from controller.kube.roomstore import RoomStore
from controller.kube.store import Event, object_key
from controller.kube.watchcache import RESOURCES, WatchCache
from controller.kube.writer import Writer
from controller.runtime.metrics import ControllerMetrics
from controller.state.audit import Violation, audit_allocations

Obj = dict[str, Any]
ROOM_NAMESPACE = "flexmig"  # where the controller keeps its room state (controller/kube/roomstore.py)

_PATH = re.compile(
    r"^/(?:api/v1|apis/resource\.k8s\.io/v1)/namespaces/(?P<ns>[^/]+)/(?P<res>pods|resourceclaims|events|configmaps)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)


def _merge(target: Obj, patch: Mapping[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class FakeApiServer:
    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[str, dict[str, Obj]] = {r: {} for r in RESOURCES}
        self.objects["configmaps"] = {}  # the controller's own (not watched): its room state
        self.watch: list[Event] = []  # every change, in order; the test delivers them
        self.events: list[Obj] = []  # core/v1 Events posted
        self.fail: list[tuple[str, str, int]] = []  # (method, path suffix, status): fail the next match
        # (method, path suffix, error): APPLY the next match, then raise `error` instead of answering,
        # as when the response is lost on the way back (timeout, connection cut, 504 from a proxy).
        self.lose: list[tuple[str, str, BaseException]] = []
        self.down = False  # every request is refused as by an API server that is not listening
        self.requests: list[tuple[str, str]] = []

    # --- what the test does to the cluster ----------------------------------------------------------

    def _bump(self, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    def put_object(self, resource: str, obj: Obj) -> Obj:
        """Create or overwrite (someone else's write); recorded on the watch."""
        body = self._bump(copy.deepcopy(obj))
        key = object_key(body)
        kind = "MODIFIED" if key in self.objects[resource] else "ADDED"
        self.objects[resource][key] = body
        self.watch.append(Event(resource, kind, obj=copy.deepcopy(body)))
        return body

    def delete_object(self, resource: str, key: str) -> None:
        obj = self.objects[resource][key]
        if obj["metadata"].get("finalizers"):
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self.objects[resource][key] = self._bump(obj)
            self.watch.append(Event(resource, "MODIFIED", obj=copy.deepcopy(obj)))
            return
        del self.objects[resource][key]
        self.watch.append(Event(resource, "DELETED", obj=self._bump(copy.deepcopy(obj))))
        if resource == "pods":
            self._drop_reservations(obj)

    def _drop_reservations(self, pod: Obj) -> None:
        """What kube-controller-manager's resourceclaim controller does when a pod is gone: remove it
        from `status.reservedFor` of the claims in its namespace."""
        meta = pod["metadata"]
        for claim in list(self.objects["resourceclaims"].values()):
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            if claim["metadata"].get("namespace") != meta.get("namespace") or not any(
                r.get("uid") == meta.get("uid") for r in reserved
            ):
                continue
            changed = copy.deepcopy(claim)
            changed["status"]["reservedFor"] = [r for r in reserved if r.get("uid") != meta.get("uid")]
            self.put_object("resourceclaims", changed)

    def _reap_reservations(self, key: str) -> None:
        """What the resourceclaim controller does after a claim changed: a reservation for a pod that
        no longer exists (deleted before the reservation was written) is removed."""
        claim = self.objects["resourceclaims"][key]
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        ns = claim["metadata"].get("namespace")
        live = {
            p["metadata"].get("uid")
            for p in self.objects["pods"].values()
            if p["metadata"].get("namespace") == ns
        }
        kept = [r for r in reserved if r.get("resource") != "pods" or r.get("uid") in live]
        if len(kept) != len(reserved):
            changed = copy.deepcopy(claim)
            changed["status"]["reservedFor"] = kept
            self.put_object("resourceclaims", changed)

    def lists(self) -> list[Event]:
        """A REPLACE per resource (what a fresh list returns)."""
        return [
            Event(
                r,
                "REPLACE",
                items=tuple(copy.deepcopy(list(self.objects[r].values()))),
                resource_version=str(self.rv),
            )
            for r in RESOURCES
        ]

    def list_fn(self, resource: str) -> Callable[..., Any]:
        """The LIST a reflector (or a new leader's catch-up) sends: every object, at the current version."""

        def list_now(**_kw: Any) -> Any:
            self.requests.append(("LIST", resource))
            items = [copy.deepcopy(o) for o in self.objects[resource].values()]
            body = {"metadata": {"resourceVersion": str(self.rv)}, "items": items}
            return SimpleNamespace(data=json.dumps(body).encode())

        return list_now

    def audit(self) -> list[Violation]:
        return audit_allocations(
            self.objects["resourceclaims"].values(), self.objects["resourceslices"].values()
        )

    def allocations(self) -> dict[str, list[tuple[str, str]]]:
        out = {}
        for key, claim in self.objects["resourceclaims"].items():
            alloc = (claim.get("status") or {}).get("allocation")
            if alloc:
                out[key] = [(r["pool"], r["device"]) for r in alloc["devices"]["results"]]
        return out

    # --- what the controller's Writer sends ---------------------------------------------------------

    def _config_map(self, method: str, ns: str, name: str | None, body: Any) -> Obj:
        """GET, POST (409 when it exists) and PUT (404 when missing, 409 on an old resourceVersion)."""
        maps = self.objects["configmaps"]
        if method == "POST":
            key = f"{ns}/{body['metadata']['name']}"
            if key in maps:
                raise ApiException(status=409, reason="AlreadyExists")
        else:
            key = f"{ns}/{name}"
            if key not in maps:
                raise ApiException(status=404, reason="NotFound")
            if method == "GET":
                return copy.deepcopy(maps[key])
            if method != "PUT":
                raise ApiException(status=405, reason=f"{method} configmaps not supported here")
            if (body.get("metadata") or {}).get("resourceVersion") != maps[key]["metadata"][
                "resourceVersion"
            ]:
                raise ApiException(status=409, reason="Conflict")
        maps[key] = self._bump(copy.deepcopy(body))
        return copy.deepcopy(maps[key])

    def send(self, api: Any, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        if self.down:
            raise ConnectionRefusedError(f"{method} {path}: connection refused")
        for i, (m, suffix, error) in enumerate(self.lose):
            if m == method and path.endswith(suffix):
                del self.lose[i]
                self._send(api, method, path, body, **kw)
                raise error
        return self._send(api, method, path, body, **kw)

    def _send(self, _api: Any, method: str, path: str, body: Any = None, **_kw: Any) -> Obj:
        self.requests.append((method, path))
        for i, (m, suffix, status) in enumerate(self.fail):
            if m == method and path.endswith(suffix):
                del self.fail[i]
                raise ApiException(status=status, reason="injected")
        match = _PATH.match(path)
        if match is None:
            raise ApiException(status=404, reason=f"no such path {path}")
        ns, res, name, sub = match["ns"], match["res"], match["name"], match["sub"]
        if res == "events":
            self.events.append(copy.deepcopy(body))
            return dict(body)
        if res == "configmaps":
            return self._config_map(method, ns, name, body)
        key = f"{ns}/{name}"
        stored = self.objects[res].get(key)
        if stored is None:
            raise ApiException(status=404, reason="NotFound")
        if method == "GET":
            return copy.deepcopy(stored)
        sent_rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if sent_rv is not None and sent_rv != stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        new = copy.deepcopy(stored)
        if res == "resourceclaims" and method == "PUT" and sub == "status":
            before = (stored.get("status") or {}).get("allocation")
            after = (body.get("status") or {}).get("allocation")
            if before and after and before != after:
                raise ApiException(status=422, reason="Invalid: status.allocation is immutable once set")
            new["status"] = copy.deepcopy(body.get("status") or {})
        elif res == "resourceclaims" and method == "PUT":
            if body.get("spec") != stored.get("spec"):
                raise ApiException(status=422, reason="Invalid: spec is immutable")
            new["metadata"] = copy.deepcopy(body["metadata"])
        elif res == "pods" and method == "PATCH" and sub == "status":
            conditions = {c["type"]: c for c in (new.setdefault("status", {}).get("conditions") or [])}
            for c in (body.get("status") or {}).get("conditions") or []:
                conditions[c["type"]] = copy.deepcopy(c)
            new["status"]["conditions"] = list(conditions.values())
        elif res == "pods" and method == "PATCH":
            _merge(new, {k: v for k, v in body.items() if k != "metadata"})
            _merge(new["metadata"], {k: v for k, v in body["metadata"].items() if k != "resourceVersion"})
        else:
            raise ApiException(status=405, reason=f"{method} {path} not supported here")
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del self.objects[res][key]
            self.watch.append(Event(res, "DELETED", obj=self._bump(new)))
            return copy.deepcopy(new)
        self.objects[res][key] = self._bump(new)
        self.watch.append(Event(res, "MODIFIED", obj=copy.deepcopy(new)))
        answer = copy.deepcopy(new)
        if res == "resourceclaims" and sub == "status":
            self._reap_reservations(key)
        return answer


class Harness:
    """A leading controller whose writes go to a FakeApiServer, and whose watch the test drives."""

    def __init__(
        self, nodes: Mapping[str, tuple[str, int]], metrics: ControllerMetrics | None = None
    ) -> None:
        self.api = FakeApiServer()
        for node, (model, n) in nodes.items():
            self.api.put_object("nodes", {"metadata": {"name": node}, "spec": {}})
            for s in node_slices(node, model, n):
                self.api.put_object("resourceslices", s)
        for c in CLASSES.values():
            self.api.put_object("deviceclasses", c)
        self.api.watch.clear()
        self.writer = Writer(None, send=self.api.send)
        self.ctl = Controller(
            WatchCache({r: self.api.list_fn(r) for r in RESOURCES}),
            self.writer,
            metrics=metrics,
            room_store=RoomStore(self.writer, ROOM_NAMESPACE),
        )
        self.delivered = 0
        self.ctl.apply(self.api.lists())
        # Leading from the start on what it just listed; a test of a handover calls `catch_up.lost()`.
        self.ctl.catch_up.finished()
        self.ctl.room.restore_once(self.ctl.preemption, self.ctl.ledger)  # an empty store: no promises

    def add_claim(self, claim: Obj) -> Obj:
        return self.api.put_object("resourceclaims", claim)

    def add_pod(
        self, name: str, claims: Iterable[str], ns: str = "ns", metadata: Mapping[str, Any] | None = None
    ) -> Obj:
        """A gated pod referencing `claims`; `metadata` adds fields (annotations, creationTimestamp)."""
        names = list(claims)
        return self.api.put_object(
            "pods",
            {
                "metadata": {"name": name, "namespace": ns, "uid": f"pod-{name}", **(metadata or {})},
                "spec": {
                    "schedulingGates": [{"name": ALLOCATION_GATE}],
                    "resourceClaims": [{"name": c, "resourceClaimName": c} for c in names],
                    "containers": [{"name": "main", "resources": {"claims": [{"name": c} for c in names]}}],
                },
            },
        )

    def pending_watch(self) -> list[Event]:
        return self.api.watch[self.delivered :]

    def deliver(self, n: int | None = None) -> None:
        """Put the next `n` (default: all) undelivered watch events on the controller's queue."""
        todo = self.pending_watch() if n is None else self.pending_watch()[:n]
        for event in todo:
            self.ctl.cache.events.put(event)
        self.delivered += len(todo)

    def cycle(self) -> None:
        """One iteration of Controller.run: take what is queued, apply it, step."""
        self.ctl.apply(self.ctl.cache.next_batch(timeout_s=0.0))
        self.ctl.step()

    def gated(self, name: str, ns: str = "ns") -> bool:
        pod = self.api.objects["pods"][f"{ns}/{name}"]
        return any(g.get("name") == ALLOCATION_GATE for g in pod["spec"].get("schedulingGates") or [])
