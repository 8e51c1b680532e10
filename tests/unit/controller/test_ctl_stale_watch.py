"""Defect 1 of issue 10: the watch delivers the controller's own older writes after their result.

The controller writes a claim twice (finalizer, then allocation) and stores the allocation at once; the
watch then brings the finalizer-only version. Accepting it freed the devices, and the next pod was given
the same GPU (two claims held `gpu-0-mig-7g40gb-...` on one A100-40GB). The cache must never go back to
an older version of an object the controller wrote, and the allocation stays assumed until the watch
shows it.
"""

from __future__ import annotations

from ctl_helpers import claim
from fake_apiserver import Harness

from controller.kube.store import Event, Store

WHOLE_MIG = 'device.attributes["gpu.flexmig.dev"].profile == "7g.40gb"'


def _two_pods_for_one_gpu() -> Harness:
    h = Harness({"n1": ("A100-40GB", 1)})
    for name in ("a", "b"):
        h.add_claim(claim(name, WHOLE_MIG))
        h.add_pod(f"p-{name}", [name])
    h.deliver()
    h.cycle()
    assert sum(not h.gated(p) for p in ("p-a", "p-b")) == 1  # one GPU: one pod placed
    return h


def test_a_late_finalizer_only_event_does_not_free_the_allocation() -> None:
    h = _two_pods_for_one_gpu()
    # The watch now brings our writes one event at a time, the controller stepping after each: the
    # first is the finalizer-only version of the allocated claim, older than what the cache holds.
    while h.pending_watch():
        h.deliver(1)
        h.cycle()
    assert h.api.audit() == []
    assert len(h.api.allocations()) == 1, h.api.allocations()
    assert sum(h.gated(p) for p in ("p-a", "p-b")) == 1
    assert h.ctl.metrics.registry.get_sample_value("flexmig_controller_stale_events_total") >= 1


def test_a_replayed_watch_after_a_reconnect_does_not_free_it_either() -> None:
    h = _two_pods_for_one_gpu()
    replay = list(h.pending_watch())
    h.deliver()
    h.cycle()
    for event in replay:  # a watch resumed from an old resourceVersion sends everything again
        h.ctl.cache.events.put(event)
        h.cycle()
    assert h.api.audit() == []
    assert len(h.api.allocations()) == 1


def test_a_relist_older_than_our_write_does_not_regress_it() -> None:
    h = _two_pods_for_one_gpu()
    old_lists = h.api.lists()
    # A relist taken before our writes (410, then a list served by a lagging cache), then delivered.
    stale = [
        Event(e.resource, "REPLACE", items=e.items, resource_version=str(int(e.resource_version) - 50))
        for e in old_lists
    ]
    for event in stale:
        for item in event.items:
            if item["metadata"].get("resourceVersion"):
                item["metadata"]["resourceVersion"] = str(int(item["metadata"]["resourceVersion"]) - 50)
    h.ctl.apply(stale)
    h.ctl.step()
    assert h.api.audit() == []
    assert len(h.api.allocations()) == 1


def test_store_never_regresses_and_accepts_newer_from_others() -> None:
    store = Store()
    store.apply(Event("resourceclaims", "REPLACE", items=(_obj("5"),), resource_version="5"))
    store.assume(_obj("7", mine=True))
    assert store.apply(Event("resourceclaims", "MODIFIED", obj=_obj("6"))) == []  # ours, older: ignored
    assert store.objects["ns/c"]["metadata"]["resourceVersion"] == "7"
    changes = store.apply(Event("resourceclaims", "MODIFIED", obj=_obj("9")))  # someone else, newer
    assert [new["metadata"]["resourceVersion"] for _, _, new in changes if new] == ["9"]
    # A relist older than the stored version neither regresses it ...
    store.assume(_obj("12"))
    store.apply(Event("resourceclaims", "REPLACE", items=(_obj("10"),), resource_version="10"))
    assert store.objects["ns/c"]["metadata"]["resourceVersion"] == "12"
    # ... nor deletes what it predates; one listed after it says it is gone.
    store.apply(Event("resourceclaims", "REPLACE", items=(), resource_version="11"))
    assert "ns/c" in store.objects
    store.apply(Event("resourceclaims", "REPLACE", items=(), resource_version="13"))
    assert "ns/c" not in store.objects
    # resourceVersions that are not integers cannot be compared: the event wins.
    store.assume(_obj("x1"))
    store.apply(Event("resourceclaims", "MODIFIED", obj=_obj("x0")))
    assert store.objects["ns/c"]["metadata"]["resourceVersion"] == "x0"


def _obj(rv: str, mine: bool = False) -> dict[str, object]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "resourceVersion": rv, "labels": {"mine": str(mine)}}
    }
