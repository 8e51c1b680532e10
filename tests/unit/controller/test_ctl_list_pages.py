"""The reflector's LIST in pages (bounded memory per list), and a watch running behind a fresher list."""

from __future__ import annotations

import json
import queue
import threading
from types import SimpleNamespace
from typing import Any

from controller.kube.store import Event, Store
from controller.kube.watchcache import LIST_PAGE, Reflector

Obj = dict[str, Any]


def _pod(i: int, gpu: bool) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "resources": {}}]}
    if gpu:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c{i}"}]
    return {
        "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": str(i)},
        "spec": spec,
    }


class PagedList:
    """A LIST that honours `limit` and `_continue` like the API server, recording each call."""

    def __init__(self, objects: list[Obj]) -> None:
        self.objects = objects
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kw: Any) -> Any:
        self.calls.append(kw)
        start = int(kw.get("_continue") or 0)
        limit = int(kw.get("limit") or len(self.objects))
        page = self.objects[start : start + limit]
        rest = start + limit < len(self.objects)
        meta = {
            "resourceVersion": "5000" if start == 0 else "ignored",
            "continue": str(start + limit) if rest else "",
        }
        return SimpleNamespace(data=json.dumps({"metadata": meta, "items": page}).encode())


def _reflector(list_fn: PagedList, resource: str = "pods") -> Reflector:
    from controller.kube.podview import PROJECTIONS

    return Reflector(
        resource, list_fn, queue.Queue(), threading.Event(), projection=PROJECTIONS.get(resource)
    )


def test_a_list_is_read_in_pages_at_the_first_pages_version() -> None:
    pods = [_pod(i, gpu=i % 10 == 0) for i in range(2 * LIST_PAGE + 7)]
    list_fn = PagedList(pods)
    event = _reflector(list_fn).fresh_list()
    assert len(list_fn.calls) == 3
    assert all(c["limit"] == LIST_PAGE for c in list_fn.calls)
    assert [c.get("_continue") for c in list_fn.calls] == [None, str(LIST_PAGE), str(2 * LIST_PAGE)]
    assert event.resource_version == "5000"
    assert {p["metadata"]["name"] for p in event.items} == {f"p{i}" for i in range(0, len(pods), 10)}


def test_a_watch_behind_a_fresh_list_cannot_bring_back_what_the_list_showed_deleted() -> None:
    store = Store()
    store.apply(Event("resourceclaims", "REPLACE", items=(), resource_version="20"))
    # The watch, still behind the list, delivers the claim's creation (rv 12) after the list (rv 20)
    # that no longer showed it: it was deleted in between.
    old = {"metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "12"}}
    assert store.apply(Event("resourceclaims", "ADDED", obj=old)) == []
    assert "ns/c" not in store.objects
    newer = {"metadata": {"name": "c", "namespace": "ns", "uid": "u2", "resourceVersion": "21"}}
    assert store.apply(Event("resourceclaims", "ADDED", obj=newer))
    # A late deletion of the older incarnation does not remove the newer one.
    assert store.apply(Event("resourceclaims", "DELETED", obj=old)) == []
    assert store.objects["ns/c"]["metadata"]["uid"] == "u2"
