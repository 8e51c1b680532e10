"""Shim ResourceClaimTemplates for pods that exist: the leader watches unscheduled pods and creates
every shim template such a pod names that is missing. One job; no pod is kept in memory.

Why here and not in the admission review: a review is unauthenticated input (anyone who reaches the
webhook port can send one, naming any namespace and a pod that will never exist), so it must not
create objects. A pod, once stored, was created by someone the API server authorized to create pods in
its namespace, and the template it names follows from its name alone (`shape_from_name`: same name,
same body), so creating it on the pod's behalf gives nobody anything they could not write themselves.

Timing: the pod is stored first, its template a moment later. kube-controller-manager's resourceclaim
controller queues a pod again when a template it names appears (and retries with backoff before
that), so the pod's claim is created as soon as the template is; the pod waits for its claim, gated,
as it would anyway. What this adds to a pod's start is one watch event and one POST.

Pods are watched cluster-wide with the field selector `spec.nodeName=` (unscheduled, not finished):
only those can still need a claim created. A pod whose claims all exist (its
`status.resourceClaimStatuses`) needs nothing. Every `relist_s` the watch starts over with a list,
which retries anything a refused create left undone; a new leader lists first, since pods created while
another replica led may still wait.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.kube.names import is_dns1123_label
from controller.kube.rest import request
from controller.shim import TemplateSpec
from controller.shim.templates import shape_from_name, template_for
from controller.webhook.templates import TemplateEnsurer, TemplateError
from driver.looprunner import LoopRunner

log = structlog.get_logger(__name__)

PODS_PATH = "/api/v1/pods"
UNSCHEDULED = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
WATCH_TIMEOUT_S = 60
RELIST_S = 300.0
IDLE_S = 1.0
"""How often a follower checks whether it leads now."""

Pod = Mapping[str, Any]
ListFn = Callable[[], tuple[list[dict[str, Any]], str]]
"""-> (unscheduled pods, the list's resourceVersion)"""
WatchFn = Callable[[str], Iterable[Mapping[str, Any]]]
"""resourceVersion -> watch events ({"type", "object"}) until the server ends the watch"""


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def templates_needed(pod: Pod) -> list[TemplateSpec]:
    """The shim templates `pod` names for claims not created yet (none for a finished or deleted pod)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    namespace = meta.get("namespace")
    if not is_dns1123_label(namespace) or meta.get("deletionTimestamp"):
        return []
    if status.get("phase") in ("Succeeded", "Failed"):
        return []
    created = {
        s.get("name")
        for s in status.get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping) and s.get("resourceClaimName")
    }
    out: dict[str, TemplateSpec] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping) or entry.get("name") in created:
            continue
        shape = shape_from_name(entry.get("resourceClaimTemplateName"))
        if shape is not None:
            spec = template_for(str(namespace), shape)
            out.setdefault(spec.name, spec)
    return list(out.values())


class TemplateSync:
    def __init__(
        self,
        api: Any,
        ensurer: TemplateEnsurer,
        *,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        list_fn: ListFn | None = None,
        watch_fn: WatchFn | None = None,
        relist_s: float = RELIST_S,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.api = api
        self.ensurer = ensurer
        self.is_leader = is_leader
        self.list_fn = list_fn or self._list
        self.watch_fn = watch_fn or self._watch
        self.relist_s = relist_s
        self.clock = clock
        self._rv = ""
        self._listed_at = float("-inf")
        self.runner = LoopRunner(
            "shim-template-sync",
            self.once,
            interval_s=IDLE_S,
            stop=stop,
            stuck_after_s=WATCH_TIMEOUT_S + 90.0,
            on_error=on_error,
        )

    def once(self) -> None:
        """One list (when due) and one watch until it ends; nothing at all while not leading."""
        if not self.is_leader():
            self._rv = ""
            return
        if not self._rv or self.clock() - self._listed_at >= self.relist_s:
            pods, rv = self.list_fn()
            self._listed_at = self.clock()
            for pod in pods:
                if not self.handle(pod):
                    return
            self._rv = rv
        try:
            for event in self.watch_fn(self._rv):
                self.runner.beat()
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise RuntimeError(f"pod watch error: {obj.get('message')}")
                if kind in ("ADDED", "MODIFIED") and not self.handle(obj):
                    return
                # Advanced only once the event is handled: a failure replays it from here.
                self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
        except _Expired:
            self._rv = ""
        except ApiException as exc:
            if exc.status != 410:
                raise
            self._rv = ""

    def handle(self, pod: Pod) -> bool:
        """Create what `pod` needs; False (and a list next time) once this replica no longer leads."""
        specs = templates_needed(pod)
        if not specs:
            return True
        if not self.is_leader():
            self._rv = ""
            return False
        try:
            self.ensurer.ensure(specs)
        except TemplateError as exc:
            status = getattr(exc.__cause__, "status", None)
            if status is None or status == 429 or status >= 500:
                raise  # the API server is struggling: back off, and replay the event
            # Refused for good (403, 422): logged; the next relist tries again.
            meta = pod.get("metadata") or {}
            log.warning(
                "shim template not created", pod=f"{meta.get('namespace')}/{meta.get('name')}", error=str(exc)
            )
        return True

    # --- the API ------------------------------------------------------------------------------------

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        listed = request(self.api, "GET", PODS_PATH, query=[("fieldSelector", UNSCHEDULED)])
        return list(listed.get("items") or ()), str(
            (listed.get("metadata") or {}).get("resourceVersion") or ""
        )

    def _watch(self, rv: str) -> Iterator[Mapping[str, Any]]:
        from kubernetes import client as k8s
        from kubernetes.watch.watch import iter_resp_lines

        resp: Any = k8s.CoreV1Api(self.api).list_pod_for_all_namespaces(
            field_selector=UNSCHEDULED,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(10, WATCH_TIMEOUT_S + 30),
        )
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if line:
                    yield json.loads(line)
        finally:
            resp.close()
            resp.release_conn()
