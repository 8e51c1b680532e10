"""List+watch reflectors feeding one event queue, and the stores the controller thread keeps from it.

Each resource gets a reflector thread: LIST (raw JSON, no model layer: thousands of slices deserialised
into pydantic models would cost seconds and hundreds of MB), then WATCH from the list's resourceVersion
with bookmarks, resuming from the last version seen after a dropped connection and relisting when the
server answers 410 Gone (the version was compacted). Each reflector runs in a LoopRunner
(driver/looprunner.py): failures back off exponentially with jitter, and a hung list or watch shows as
stuck in /healthz.

Reflectors never touch shared state: they put events on a queue, and the single controller thread
applies them (`WatchCache.apply`). A relist arrives as one REPLACE event, from which the store computes
deletions it missed, so the view converges to the server's even across 410s.

Objects the controller wrote itself are *assumed* (as in kube-scheduler's assume cache): the write's
result goes into the store at once, and the store never goes back to an older resourceVersion of any
object. The watch delivers the controller's own earlier writes after it (finalizer, then allocation:
the finalizer-only event arrives after the allocation is already stored); accepting it would make the
ledger free the devices and hand them to the next pod. A relist older than a stored version does not
regress it either, nor delete an object it predates (the stores: controller/kube/store.py).

A resource may have a `Projection` (pods do: controller/kube/podview.py): the reflector keeps only the
objects it calls relevant, stripped to the fields the controller reads, on the list and the watch path
alike, and turns a watch event for any other object into a DELETED (one that stops being relevant leaves
the store; one never stored is a no-op). The store strips our own writes' results the same way.
"""

from __future__ import annotations

import functools
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog
from kubernetes.watch.watch import iter_resp_lines

from controller.kube.echo import WatchEcho
from controller.kube.podview import PROJECTIONS, Projection
from controller.kube.store import Event, Store, object_key, resource_version
from driver.looprunner import LoopRunner

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
ListFn = Callable[..., Any]

WATCH_TIMEOUT_S = 300
LIST_PAGE = 500  # objects per LIST page, as client-go's reflectors ask
LIST_TIMEOUT = (10, 120)  # (connect, read) seconds: a hung LIST fails and is retried, never waits forever
# A watch beats on every line; the server ends it after WATCH_TIMEOUT_S and the client's read timeout
# (WATCH_TIMEOUT_S + 30) ends a silent one, so no beat for longer than this is a hung reflector.
STUCK_AFTER_S = WATCH_TIMEOUT_S + 90.0
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class Reflector:
    """LIST + WATCH one resource into `events`, in a `LoopRunner` (driver/looprunner.py): any exception
    (urllib3's MaxRetryError/ReadTimeoutError when the API server is down included) is retried with
    backoff, and a list or watch that hangs past `stuck_after_s` shows as stuck in /healthz."""

    def __init__(
        self,
        resource: str,
        list_fn: ListFn,
        events: queue.Queue[Event],
        stop: threading.Event,
        *,
        stuck_after_s: float = STUCK_AFTER_S,
        on_error: Callable[[Exception], None] | None = None,
        projection: Projection | None = None,
        echo: WatchEcho | None = None,
    ) -> None:
        self.resource = resource
        self.echo = echo
        self.list_fn = list_fn
        self.projection = projection
        self.events = events
        self.stop_event = stop
        self.resource_version = ""
        self.relists = 0
        self._need_list = True
        self.runner = LoopRunner(
            f"reflector-{resource}",
            self._once,
            stop=stop,
            stuck_after_s=stuck_after_s,
            backoff_start_s=BACKOFF_START_S,
            backoff_max_s=BACKOFF_MAX_S,
            on_error=on_error,
        )

    def start(self) -> None:
        self.runner.start()

    def run(self) -> None:
        """Run in the calling thread until the stop event is set."""
        self.runner.run()

    def join(self, timeout_s: float | None = None) -> None:
        self.runner.join(timeout_s)

    def _once(self) -> None:
        """One list (when needed) and one watch until it ends; a 410 asks for a relist, not a backoff."""
        try:
            if self._need_list:
                self._list()
                self._need_list = False
            self._watch()
        except GoneError:
            log.info("watch expired, relisting", resource=self.resource)
            self._need_list = True
        except Exception as exc:
            if getattr(exc, "status", None) == 410:
                self._need_list = True
                return
            raise  # the LoopRunner logs it and backs off

    def _list(self) -> None:
        event = self.fresh_list()
        self.resource_version = event.resource_version
        self.relists += 1
        if self.echo is not None:
            for item in event.items:
                self.echo.seen(object_key(item), resource_version(item))
        self.events.put(event)

    def fresh_list(self) -> Event:
        """A consistent LIST now (no resourceVersion: read from etcd), as a REPLACE event; the watch
        goes on from where it was (a new leader's catch-up, controller/allocation/catchup.py, calls this
        too). Read in pages of `LIST_PAGE` objects, each projected before the next is read, so that
        the memory a list costs is bounded by a page, not by the cluster; the server keeps every page
        of one list at the first page's resourceVersion."""
        items: list[Obj] = []
        version = ""
        token = ""
        while True:
            kwargs: dict[str, Any] = {"_preload_content": False, "_request_timeout": LIST_TIMEOUT}
            kwargs["limit"] = LIST_PAGE
            if token:
                kwargs["_continue"] = token
            body = json.loads(self.list_fn(**kwargs).data)
            raw: list[Obj] = body.pop("items", None) or []
            items.extend(raw if self.projection is None else self.projection.items(raw))
            meta = body.get("metadata") or {}
            version = version or str(meta["resourceVersion"])
            token = str(meta.get("continue") or "")
            if not token:
                return Event(self.resource, "REPLACE", items=tuple(items), resource_version=version)

    def _lines(self) -> Iterator[str]:
        resp = self.list_fn(
            _preload_content=False,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=WATCH_TIMEOUT_S,
            _request_timeout=(10, WATCH_TIMEOUT_S + 30),
        )
        try:
            yield from iter_resp_lines(resp)  # type: ignore[no-untyped-call]
        finally:
            resp.close()
            resp.release_conn()

    def _watch(self) -> None:
        for line in self._lines():
            if self.stop_event.is_set():
                return
            if not line:
                continue
            self.runner.beat()
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise GoneError()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = rv
            if kind == "BOOKMARK":
                continue  # only advances the resume point
            if self.echo is not None:
                self.echo.seen(object_key(obj), resource_version(obj))
            kind = str(kind)
            if self.projection is not None:
                kind, obj = self.projection.event(kind, obj)
            self.events.put(Event(self.resource, kind, obj=obj))


RESOURCES = ("resourceslices", "resourceclaims", "deviceclasses", "pods", "nodes")


NOT_SERVED_RECHECK_S = 60.0


class _EmptyList:
    """What a LIST of a resource the API does not serve reads as: no objects."""

    data = b'{"items": [], "metadata": {"resourceVersion": ""}}'


class OptionalList:
    """List and watch of a resource the API server may not serve (DeviceTaintRules are resource.k8s.io/v1
    from 1.37): a 404 lists as empty, so the cache syncs and nothing waits on it; its watch waits
    `NOT_SERVED_RECHECK_S` and then asks for a relist (a 410, no backoff), so a resource served after an
    API server upgrade is found without a restart. Any other error is the reflector's, as usual."""

    def __init__(self, list_fn: ListFn, stop: threading.Event | None = None) -> None:
        self.list_fn = list_fn
        self.stop = stop or threading.Event()

    def __call__(self, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.list_fn(**kwargs)
        except ApiException as exc:
            if exc.status != 404:
                raise
        if kwargs.get("watch"):
            self.stop.wait(NOT_SERVED_RECHECK_S)
            raise ApiException(status=410, reason="not served yet: list again")
        return _EmptyList()


class WatchCache:
    """The stores of every resource the controller reads, fed by reflectors through one queue."""

    def __init__(
        self,
        list_fns: Mapping[str, ListFn],
        *,
        stuck_after_s: float = STUCK_AFTER_S,
        on_error: Callable[[str, Exception], None] | None = None,
        projections: Mapping[str, Projection] = PROJECTIONS,
    ) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        # Our claim writes as the watch delivers them (controller/kube/echo.py): the gate waits for it.
        self.claim_echo = WatchEcho()
        self.started = False  # reflectors running; the echo is only fed then
        self.stop_event = threading.Event()
        self.stores = {name: Store(p.strip if (p := projections.get(name)) else None) for name in list_fns}
        self.reflectors = [
            Reflector(
                name,
                fn,
                self.events,
                self.stop_event,
                stuck_after_s=stuck_after_s,
                on_error=None if on_error is None else functools.partial(on_error, name),
                projection=projections.get(name),
                echo=self.claim_echo if name == "resourceclaims" else None,
            )
            for name, fn in list_fns.items()
        ]

    @property
    def runners(self) -> list[LoopRunner]:
        """The reflectors' loops, for a health check."""
        return [r.runner for r in self.reflectors]

    @classmethod
    def for_api(cls, api_client: Any, **kwargs: Any) -> WatchCache:
        from kubernetes import client as k8s

        resource = k8s.ResourceV1Api(api_client)
        core = k8s.CoreV1Api(api_client)
        list_fns: dict[str, ListFn] = {
            "resourceslices": resource.list_resource_slice,
            "resourceclaims": resource.list_resource_claim_for_all_namespaces,
            "deviceclasses": resource.list_device_class,
            "pods": core.list_pod_for_all_namespaces,
            "nodes": core.list_node,
        }
        # DeviceTaintRules are resource.k8s.io/v1 from 1.37 (controller/state/taintrules.py): before,
        # the list is empty instead of an error a reflector would retry forever.
        rules = OptionalList(resource.list_device_taint_rule)
        list_fns["devicetaintrules"] = rules
        cache = cls(list_fns, **kwargs)
        rules.stop = cache.stop_event
        return cache

    def start(self) -> None:
        self.started = True
        for r in self.reflectors:
            r.start()

    def stop(self) -> None:
        self.stop_event.set()

    @property
    def synced(self) -> bool:
        return all(s.synced for s in self.stores.values())

    def next_batch(self, timeout_s: float, max_events: int = 10_000) -> list[Event]:
        """Block up to `timeout_s` for one event, then take whatever else is queued."""
        out: list[Event] = []
        deadline = time.monotonic() + timeout_s
        try:
            out.append(self.events.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            return out
        while len(out) < max_events:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                break
        return out

    def fresh_lists(self, resources: tuple[str, ...]) -> list[Event]:
        """A consistent LIST of each of `resources` now, as REPLACE events (not queued)."""
        by_name = {r.resource: r for r in self.reflectors}
        return [by_name[name].fresh_list() for name in resources if name in by_name]

    def __getitem__(self, resource: str) -> dict[str, Obj]:
        return self.stores[resource].objects
