"""The shim's ResourceClaimTemplates: made to exist for pods that exist and name one (by the leader,
controller/webhook/templatesync.py, never by an admission review), and deleted once no pod in their
namespace names them.

Why deleting never strands a pod: every use stamps the template's `gpu.flexmig.dev/last-used`
annotation (at most once per `touch_s`, the stamp is cached), and the collector deletes only
templates whose last use (or creation) is older than `grace_s` and that no pending or running pod of
their namespace names. The delete carries the resourceVersion the collector judged, so a stamp
written meanwhile makes it fail (409). A pod created between the collector's pod list and its delete
is caught by a second pod list after the delete: a template such a pod names is created again at
once (the claim controller creates the pod's claim when the template appears).

Memory: the stamp cache is bounded per namespace and in namespaces (least recently used go first);
forgetting a stamp only costs one more PATCH.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from controller.kube.names import namespaced_path, segment
from controller.kube.rest import MERGE_PATCH, request
from controller.shim import TemplateSpec, is_shim_template, template_names_used_by
from controller.shim.templates import LABEL_SHIM_TEMPLATE, shape_from_name, template_for

log = structlog.get_logger(__name__)

LAST_USED_ANNOTATION = f"{DRIVER_NAME}/last-used"
DEFAULT_GRACE_S = 600.0
DEFAULT_TOUCH_S = 60.0
API_TIMEOUT_S = 4.0
"""Per request: a hung API call must not hold the template sync (or the collector) for long."""
MAX_NAMESPACES = 1024
MAX_PER_NAMESPACE = 32
"""Bounds of the stamp cache: 32 shapes per namespace is more than real workloads use."""


def templates_path(namespace: str | None = None, name: str = "") -> str:
    base = "/apis/resource.k8s.io/v1"
    if namespace:
        return namespaced_path(base, namespace, "resourceclaimtemplates", name)
    return f"{base}/resourceclaimtemplates"


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_stamp(s: Any) -> float | None:
    if not isinstance(s, str) or not s:
        return None
    try:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last_used(template: Mapping[str, Any]) -> float | None:
    """When the template was last used or created (epoch seconds), whichever is later."""
    meta = template.get("metadata") or {}
    times = [
        t
        for t in (
            _parse_stamp((meta.get("annotations") or {}).get(LAST_USED_ANNOTATION)),
            _parse_stamp(meta.get("creationTimestamp")),
        )
        if t is not None
    ]
    return max(times) if times else None


class TemplateError(RuntimeError):
    """A template could not be made to exist (the message names it and the API's answer)."""


class TemplateEnsurer:
    """Called by the leader's template sync (and the collector); thread-safe."""

    def __init__(
        self,
        api: Any,
        *,
        touch_s: float = DEFAULT_TOUCH_S,
        clock: Callable[[], float] = time.time,
        max_namespaces: int = MAX_NAMESPACES,
        max_per_namespace: int = MAX_PER_NAMESPACE,
    ) -> None:
        self.api = api
        self.touch_s = touch_s
        self.clock = clock
        self.max_namespaces = max_namespaces
        self.max_per_namespace = max_per_namespace
        # namespace -> template name -> when stamped; both levels least recently used first
        self._touched: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def ensure(self, specs: Sequence[TemplateSpec]) -> None:
        for spec in specs:
            now = self.clock()
            with self._lock:
                names = self._touched.get(spec.namespace)
                stamped = float("-inf") if names is None else names.get(spec.name, float("-inf"))
            if now - stamped < self.touch_s:
                continue
            try:
                self._ensure_one(spec, now)
            except ApiException as exc:
                raise TemplateError(
                    f"ResourceClaimTemplate {spec.namespace}/{spec.name} could not be created: "
                    f"{exc.status} {_message(exc)}"
                ) from exc
            self._remember(spec.namespace, spec.name, now)

    def _remember(self, namespace: str, name: str, now: float) -> None:
        with self._lock:
            names = self._touched.setdefault(namespace, OrderedDict())
            self._touched.move_to_end(namespace)
            names[name] = now
            names.move_to_end(name)
            while len(names) > self.max_per_namespace:
                names.popitem(last=False)
            while len(self._touched) > self.max_namespaces:
                self._touched.popitem(last=False)

    def cached(self) -> int:
        """Stamps kept (for tests and a bound check)."""
        with self._lock:
            return sum(len(names) for names in self._touched.values())

    def _ensure_one(self, spec: TemplateSpec, now: float) -> None:
        body: dict[str, Any] = json.loads(json.dumps(spec.body))
        meta = body.setdefault("metadata", {})
        meta.setdefault("annotations", {})[LAST_USED_ANNOTATION] = _stamp(now)
        for attempt in range(3):  # create; or stamp the existing one; it may vanish in between (the GC)
            try:
                if attempt == 0 and (owners := self._owners(body)):
                    meta["ownerReferences"] = owners
                request(self.api, "POST", templates_path(spec.namespace), body, timeout_s=API_TIMEOUT_S)
                log.info("shim template created", template=f"{spec.namespace}/{spec.name}")
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            stamp = {"metadata": {"annotations": {LAST_USED_ANNOTATION: _stamp(now)}}}
            try:
                request(
                    self.api,
                    "PATCH",
                    templates_path(spec.namespace, spec.name),
                    stamp,
                    content_type=MERGE_PATCH,
                    timeout_s=API_TIMEOUT_S,
                )
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            return
        raise ApiException(status=409, reason="created and deleted concurrently three times")

    def _owners(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The DeviceClasses the template's requests name, as its owners: when `helm uninstall`
        deletes the chart's classes, the garbage collector deletes the templates the webhook made in
        user namespaces (a cluster-scoped owner may own namespaced objects). Read fresh per creation,
        not cached: a stale uid would have the new template collected at once."""
        owners = []
        for name in class_names(body):
            try:
                cls = request(self.api, "GET", f"{CLASSES_PATH}/{segment(name)}", timeout_s=API_TIMEOUT_S)
            except ApiException as exc:
                if exc.status == 404:  # no such class: the claim will fail on it anyway, say nothing
                    continue
                raise
            uid = (cls.get("metadata") or {}).get("uid")
            if uid:
                owners.append(
                    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "name": name, "uid": uid}
                )
        return owners

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            names = self._touched.get(namespace)
            if names is not None:
                names.pop(name, None)
                if not names:
                    del self._touched[namespace]


CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def class_names(template: Mapping[str, Any]) -> list[str]:
    """DeviceClass names a ResourceClaimTemplate's requests use (exactly and firstAvailable)."""
    devices = ((template.get("spec") or {}).get("spec") or {}).get("devices") or {}
    names: set[str] = set()
    for req in devices.get("requests") or ():
        for sub in (req.get("exactly") or {}, *(req.get("firstAvailable") or ())):
            if sub.get("deviceClassName"):
                names.add(sub["deviceClassName"])
    return sorted(names)


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def _terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def unused_templates(
    templates: Iterable[Mapping[str, Any]],
    pods_in: Callable[[str], Iterable[Mapping[str, Any]]],
    now: float,
    grace_s: float,
) -> list[Mapping[str, Any]]:
    """Shim templates no running or pending pod of their namespace names, unused for `grace_s`."""
    stale: dict[str, list[Mapping[str, Any]]] = {}
    for t in templates:
        used = last_used(t)
        if is_shim_template(t) and used is not None and now - used > grace_s:
            stale.setdefault(t["metadata"]["namespace"], []).append(t)
    out: list[Mapping[str, Any]] = []
    for namespace, candidates in sorted(stale.items()):
        named: set[str] = set()
        for pod in pods_in(namespace):  # only namespaces with candidates are listed
            if not _terminal(pod):
                named |= template_names_used_by(pod)
        out += [t for t in candidates if t["metadata"]["name"] not in named]
    return out


class TemplateCollector:
    """Run by the leader only. With an `ensurer`, a template deleted while a new pod came to name it
    is created again at once (see the module's docstring)."""

    def __init__(
        self,
        api: Any,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.time,
        ensurer: TemplateEnsurer | None = None,
    ) -> None:
        self.api = api
        self.grace_s = grace_s
        self.clock = clock
        self.ensurer = ensurer

    def _pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = request(self.api, "GET", namespaced_path("/api/v1", namespace, "pods"))[
            "items"
        ]
        return items

    def _recreate_if_named(self, namespace: str, names: set[str]) -> None:
        if self.ensurer is None:
            return
        for name in names:
            self.ensurer.forget(namespace, name)
        named: set[str] = set()
        for pod in self._pods(namespace):
            if not _terminal(pod):
                named |= template_names_used_by(pod) & names
        for name in sorted(named):
            shape = shape_from_name(name)
            if shape is not None:
                log.info(
                    "shim template named by a new pod; creating it again", template=f"{namespace}/{name}"
                )
                self.ensurer.ensure([template_for(namespace, shape)])

    def collect(self) -> list[str]:
        """Delete what is unused; the "namespace/name"s deleted."""
        listed = request(self.api, "GET", templates_path(), query=[("labelSelector", LABEL_SHIM_TEMPLATE)])
        deleted: list[str] = []
        by_namespace: dict[str, set[str]] = {}
        for t in unused_templates(listed.get("items") or [], self._pods, self.clock(), self.grace_s):
            meta = t["metadata"]
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
            }
            try:
                request(self.api, "DELETE", templates_path(meta["namespace"], meta["name"]), options)
            except ApiException as exc:
                if exc.status in (404, 409):  # gone already, or used since we looked
                    continue
                raise
            deleted.append(f"{meta['namespace']}/{meta['name']}")
            by_namespace.setdefault(meta["namespace"], set()).add(meta["name"])
        if deleted:
            log.info("unused shim templates deleted", templates=deleted)
        for namespace, names in sorted(by_namespace.items()):
            self._recreate_if_named(namespace, names)
        return deleted
