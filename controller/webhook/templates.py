"""The shim's ResourceClaimTemplates: made to exist before a pod naming one is admitted, and deleted
once no pod in their namespace names them.

Why deleting never races an admission in flight: every use stamps the template's
`gpu.flexmig.dev/last-used` annotation (at most once per `touch_s` per replica, the stamp is cached),
and the collector deletes only templates whose last use (or creation) is older than `grace_s`, which
is far longer than `touch_s` plus an admission (the webhook timeout) plus the time until the new pod
shows in a pod list. The delete carries the resourceVersion the collector judged, so a stamp written
meanwhile makes it fail (409) instead of deleting a template that was just used. Clocks of the
replicas must agree to within `grace_s - touch_s` (minutes), which NTP gives.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from controller.kube.rest import MERGE_PATCH, request
from controller.shim import TemplateSpec, is_shim_template, template_names_used_by
from controller.shim.templates import LABEL_SHIM_TEMPLATE

log = structlog.get_logger(__name__)

LAST_USED_ANNOTATION = f"{DRIVER_NAME}/last-used"
DEFAULT_GRACE_S = 600.0
DEFAULT_TOUCH_S = 60.0
API_TIMEOUT_S = 4.0
"""Per write while an admission waits (see flexmigclaims.API_TIMEOUT_S)."""


def templates_path(namespace: str | None = None, name: str = "") -> str:
    base = "/apis/resource.k8s.io/v1"
    path = (
        f"{base}/namespaces/{namespace}/resourceclaimtemplates"
        if namespace
        else f"{base}/resourceclaimtemplates"
    )
    return f"{path}/{name}" if name else path


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
    """Called by the webhook, on any replica, from many threads."""

    def __init__(
        self, api: Any, *, touch_s: float = DEFAULT_TOUCH_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.api = api
        self.touch_s = touch_s
        self.clock = clock
        self._touched: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def ensure(self, specs: Sequence[TemplateSpec]) -> None:
        for spec in specs:
            key = (spec.namespace, spec.name)
            now = self.clock()
            with self._lock:
                fresh = now - self._touched.get(key, float("-inf")) < self.touch_s
            if fresh:
                continue
            try:
                self._ensure_one(spec, now)
            except ApiException as exc:
                raise TemplateError(
                    f"ResourceClaimTemplate {spec.namespace}/{spec.name} could not be created: "
                    f"{exc.status} {_message(exc)}"
                ) from exc
            with self._lock:
                self._touched[key] = now

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
                cls = request(self.api, "GET", f"{CLASSES_PATH}/{name}", timeout_s=API_TIMEOUT_S)
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
            self._touched.pop((namespace, name), None)


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
    """Run by the leader only."""

    def __init__(
        self, api: Any, *, grace_s: float = DEFAULT_GRACE_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.api = api
        self.grace_s = grace_s
        self.clock = clock

    def _pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = request(self.api, "GET", f"/api/v1/namespaces/{namespace}/pods")[
            "items"
        ]
        return items

    def collect(self) -> list[str]:
        """Delete what is unused; the "namespace/name"s deleted."""
        listed = request(self.api, "GET", templates_path(), query=[("labelSelector", LABEL_SHIM_TEMPLATE)])
        deleted: list[str] = []
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
        if deleted:
            log.info("unused shim templates deleted", templates=deleted)
        return deleted
