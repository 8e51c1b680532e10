"""The controller's versioned object stores: one per resource, fed by the watch cache's events.

A `Store` never goes back to an older resourceVersion of an object: an event or list item older than
what is stored (the controller's own newer write, *assumed* as in kube-scheduler's assume cache, or a
version already seen) is ignored, and a relist neither regresses a newer version nor deletes an object
it predates. resourceVersions are compared as integers (etcd revisions); one that is not an integer is
always accepted. controller/kube/watchcache.py explains why (the watch delivers our own earlier writes
after the newer result we already stored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger(__name__)

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    resource: str
    kind: str  # ADDED, MODIFIED, DELETED, REPLACE
    obj: Obj | None = None
    items: tuple[Obj, ...] = ()
    resource_version: str = ""  # REPLACE: the list's resourceVersion


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def resource_version(obj: Mapping[str, Any] | None) -> int | None:
    """An object's resourceVersion as an integer; None if absent or not an integer."""
    raw = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except ValueError:
        return None


Change = tuple[str, Obj | None, Obj | None]


class Store:
    """Objects of one resource by namespace/name (cluster-scoped: by name).

    No object ever goes back to an older resourceVersion: an event or list item older than what is
    stored (the controller's own newer write, assumed, or a version already seen) is ignored."""

    def __init__(self, strip: Callable[[Mapping[str, Any]], Obj] | None = None) -> None:
        self.objects: dict[str, Obj] = {}
        self.synced = False
        self.stale_ignored = 0
        self.strip = strip
        self.listed_at: int | None = None  # resourceVersion of the newest list applied

    def assume(self, obj: Obj) -> list[Change]:
        """Our own write's result: stored now; older versions the watch still delivers are ignored.

        Stripped like the reflector's objects, but kept even if not relevant (a pod whose gate we just
        removed): the watch's next event for it then removes it, and the controller sees that."""
        if self.strip is not None:
            obj = self.strip(obj)
        key = object_key(obj)
        old = self.objects.get(key)
        if self._stale(key, old, obj):
            return []  # an even newer version is already here
        self.objects[key] = obj
        return [(key, old, obj)]

    def _stale(self, key: str, stored: Obj | None, obj: Obj) -> bool:
        """Whether `obj` is older than the stored version (and so must not replace it)."""
        have, got = resource_version(stored), resource_version(obj)
        if have is None or got is None or got >= have:
            return False
        self.stale_ignored += 1
        log.debug("stale watch event ignored", key=key, event_rv=got, stored_rv=have)
        return True

    def apply(self, event: Event) -> list[Change]:
        """Apply one event; returns (key, old, new) per changed object (new None = deleted)."""
        if event.kind == "REPLACE":
            return self._replace(event)
        assert event.obj is not None
        key = object_key(event.obj)
        old = self.objects.get(key)
        if event.kind == "DELETED":
            if old is None or self._stale(key, old, event.obj):
                return []  # a late deletion of an older incarnation a fresh list already replaced
            self.objects.pop(key, None)
            return [(key, old, None)]
        if old is None and self._before_list(event.obj):
            return []  # the last list, newer, did not show it: deleted since, must not come back
        if self._stale(key, old, event.obj):
            return []
        self.objects[key] = event.obj
        return [(key, old, event.obj)]

    def _before_list(self, obj: Obj) -> bool:
        """Whether `obj` is a version from before the newest list applied (a watch running behind a
        fresh list, controller/allocation/catchup.py, still delivers those)."""
        got = resource_version(obj)
        if got is None or self.listed_at is None or got > self.listed_at:
            return False
        self.stale_ignored += 1
        return True

    def _replace(self, event: Event) -> list[Change]:
        fresh = {object_key(o): o for o in event.items}
        list_rv = resource_version({"metadata": {"resourceVersion": event.resource_version}})
        if list_rv is not None:
            self.listed_at = max(list_rv, self.listed_at or 0)
        changes: list[Change] = []
        for k, old in self.objects.items():
            if k in fresh:
                continue
            have = resource_version(old)
            if have is not None and list_rv is not None and list_rv < have:
                fresh[k] = old  # listed before this version (our write): the list says nothing of it
                continue
            changes.append((k, old, None))
        for k, new in list(fresh.items()):
            prev = self.objects.get(k)
            if new is prev:
                continue
            if prev is not None and self._stale(k, prev, new):
                fresh[k] = prev  # a relist must not regress a newer version (our own write) either
                continue
            if prev is None or (prev.get("metadata") or {}).get("resourceVersion") != (
                new.get("metadata") or {}
            ).get("resourceVersion"):
                changes.append((k, prev, new))
        self.objects = fresh
        self.synced = True
        return changes
