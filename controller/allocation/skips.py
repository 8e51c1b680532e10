"""Objects the controller cannot process: skipped, not fatal.

A malformed object (a claim whose spec has the wrong type, a pod with garbage in a field the controller
reads) must not crash-loop the process and stop every other pod's allocation. Its change is skipped:
logged, counted in `flexmig_controller_skipped_objects_total{kind,reason}`, and reported once per
resourceVersion as a Warning Event on the object (when this replica leads and can write), so its owner
sees why nothing happens. The next version of the object is tried again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from controller.kube.writer import Writer
from controller.runtime.metrics import ControllerMetrics

log = structlog.get_logger(__name__)

KINDS = {"pods": "Pod", "resourceclaims": "ResourceClaim", "resourceslices": "ResourceSlice"}
_EVENT_KINDS = ("Pod", "ResourceClaim")  # Writer.event knows these objects' API versions
_MAX_REPORTED = 10_000


class SkipReporter:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics
        self._reported: set[tuple[str, str, str]] = set()  # (resource, key, resourceVersion)
        self.skipped = 0

    def skip(
        self,
        resource: str,
        key: str,
        obj: Mapping[str, Any] | None,
        exc: Exception,
        writer: Writer | None,
        *,
        leading: bool,
    ) -> None:
        kind = KINDS.get(resource, resource)
        reason = type(exc).__name__
        self.skipped += 1
        self.metrics.skipped.labels(kind, reason).inc()
        meta = (obj or {}).get("metadata") if isinstance(obj, Mapping) else None
        rv = str((meta or {}).get("resourceVersion", "")) if isinstance(meta, Mapping) else ""
        log.error("skipping an object the controller cannot process", kind=kind, key=key, error=repr(exc))
        if writer is None or not leading or kind not in _EVENT_KINDS or not isinstance(meta, Mapping):
            return
        if not isinstance(meta.get("name"), str) or (resource, key, rv) in self._reported:
            return
        if len(self._reported) > _MAX_REPORTED:
            self._reported.clear()
        self._reported.add((resource, key, rv))
        try:
            writer.event(
                obj or {},
                kind,
                "Warning",
                "FlexmigSkipped",
                f"flexmig's controller cannot process this {kind} and ignores it until it changes: "
                f"{reason}: {exc}",
            )
        except Exception as event_exc:  # the skip stands; the event is only a courtesy
            log.warning("could not report a skipped object", key=key, error=str(event_exc))
