"""Issue 21, point 10: the watch cache keeps only pods allocation needs, stripped to what it reads.

Every pod-reading function of the controller gives the same answer on the stripped pod as on the full
one; ordinary pods are not kept on the list or the watch path; a pod that stops being relevant leaves
the cache; one that never was is deleted without error; our own writes are stripped and still never
regressed by an older watch event.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
from typing import Any

import pytest
from ctl_helpers import node_slices

from api.constants import ALLOCATION_GATE, ANNOTATION_EXPECTED_DURATION, DRIVER_NAME
from benchmarks.podcache import gpu_pod, list_fn, ordinary_pod, retained_per_pod
from controller.allocation import lifetime
from controller.allocation.nodefilter import PodRules
from controller.allocation.podsize import _plan_key
from controller.claims import podclaims
from controller.kube import podview
from controller.kube.podview import PROJECTIONS
from controller.kube.store import Event, Store
from controller.kube.watchcache import Reflector, WatchCache
from controller.kube.writer import Writer
from controller.state.inventory import Inventory
from controller.views.statusmodel import collect_allocations

Obj = dict[str, Any]
PODS = PROJECTIONS["pods"]


def _rich_pod() -> Obj:
    """A gated pod using every pod field the controller reads, plus many it does not."""
    pod = gpu_pod(7, gated=True)
    spec = pod["spec"]
    spec["schedulingGates"].insert(0, {"name": "example.com/other-gate"})
    spec["nodeSelector"] = {"gpu": "a100"}
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            }
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    spec["tolerations"].append({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"})
    spec["resourceClaims"].append({"name": "direct", "resourceClaimName": "shared-claim"})
    spec["initContainers"] = [
        {
            "name": "init",
            "image": "x",
            "env": [{"name": "A", "value": "b"}],
            "resources": {"claims": [{"name": "direct"}]},
        }
    ]
    spec["containers"][1]["resources"]["claims"] = [{"name": "gpu"}, {"name": "direct", "request": "r0"}]
    pod["metadata"]["annotations"][ANNOTATION_EXPECTED_DURATION] = "2h"
    pod["metadata"]["deletionTimestamp"] = "2026-01-02T04:00:00Z"
    return pod


def _variants() -> list[Obj]:
    running = gpu_pod(3)
    done = gpu_pod(4)
    done["status"]["phase"] = "Succeeded"
    pending = gpu_pod(5)
    del pending["status"]["resourceClaimStatuses"]  # template claim not generated yet
    legacy = ordinary_pod(6)
    legacy["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    return [_rich_pod(), running, done, pending, legacy]


def _claims_for(pod: Obj) -> dict[str, Obj]:
    """Allocated claims for the pod's entries, on a MIG device and a HAMi-core share."""
    devices = ["gpu-0-mig-1g5gb-19-0", "gpu-0-shared"]
    out = {}
    for i, entry in enumerate(pod["spec"].get("resourceClaims") or ()):
        result = {"request": "r0", "driver": DRIVER_NAME, "pool": "n1", "device": devices[i % 2]}
        out[entry["name"]] = {
            "metadata": {"name": f"c{i}", "namespace": pod["metadata"]["namespace"], "uid": f"u{i}"},
            "status": {
                "allocation": {"devices": {"results": [result]}},
                "reservedFor": [] if i else [{"resource": "pods", "name": "other"}],
            },
        }
    return out


class _Capture(Writer):
    def __init__(self) -> None:
        super().__init__(None)
        self.sent: list[tuple[str, str, Any]] = []

    def _write(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Obj:
        self.sent.append((method, path, body))
        return {}


def _reads(pod: Obj) -> dict[str, Any]:
    """Everything the controller derives from a pod (controller/allocation, claims, views, writer)."""
    out: dict[str, Any] = {}
    out["gated"] = podclaims.is_gated(pod)
    out["terminal"] = podclaims.is_terminal(pod)
    try:
        out["claim_names"] = podclaims.claim_names(pod)
    except podclaims.ClaimsPending as exc:
        out["claim_names"] = f"pending: {exc}"
    out["referenced"] = podclaims.referenced_claims(pod)
    claims = _claims_for(pod)
    results = {e: podclaims.allocation_results(c) for e, c in claims.items()}
    out["split"] = podclaims.split_share_problem(pod, results)
    out["mirror"] = podclaims.mirror_annotation(pod, claims, Inventory(node_slices("n1", "A100-40GB", 1)))
    rules = PodRules.from_pod(pod)
    out["rules"] = rules
    nodes: list[Obj] = [
        {"metadata": {"name": "n1", "labels": {"gpu": "a100", "zone": "a"}}, "spec": {}},
        {"metadata": {"name": "n2", "labels": {"gpu": "a100", "zone": "c"}}, "spec": {}},
        {
            "metadata": {"name": "n3", "labels": {}},
            "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
        },
    ]
    out["excluded"] = [rules.check(n) for n in nodes]
    out["plan_key"] = _plan_key(pod)
    out["duration"] = lifetime.pod_duration(pod)
    out["hint"] = lifetime.decision_hint(pod, 1000.0)
    out["end"] = lifetime.running_end(pod, 2e9, known=5.0)
    allocations = collect_allocations(list(claims.values()), [pod])
    out["holders"] = allocations.holders
    writer = _Capture()
    writer.release_pod(pod, {"hami.io/vgpu-mig-allocations": "[]"})
    out["release"] = writer.sent
    meta = pod["metadata"]
    out["identity"] = {
        k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
    }
    return out


@pytest.mark.parametrize("index", range(len(_variants())))
def test_the_controller_reads_the_same_from_a_stripped_pod(index: int) -> None:
    full = _variants()[index]
    stripped = podview.strip_pod(copy.deepcopy(full))
    assert podview.relevant(full)
    assert _reads(stripped) == _reads(full)
    assert len(json.dumps(stripped)) < len(json.dumps(full)) / 3
    assert "managedFields" not in stripped["metadata"]
    assert podview.LAST_APPLIED not in stripped["metadata"]["annotations"]


def test_which_pods_are_kept() -> None:
    assert not podview.relevant(ordinary_pod(1))
    assert podview.project_pod(ordinary_pod(1)) is None
    gated_only = ordinary_pod(2)
    gated_only["spec"]["schedulingGates"] = [{"name": ALLOCATION_GATE}]
    own_extended = ordinary_pod(3)
    own_extended["spec"]["containers"][1]["resources"]["requests"] = {f"{DRIVER_NAME}/mig": "1"}
    scheduler_claim = ordinary_pod(4)
    scheduler_claim["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "x"}
    for pod in (gpu_pod(1), gated_only, own_extended, scheduler_claim):
        assert podview.relevant(pod)
    other_gate = ordinary_pod(5)
    other_gate["spec"]["schedulingGates"] = [{"name": "example.com/gate"}]
    assert not podview.relevant(other_gate)


def _reflector(pods: list[Obj], list_rv: str = "1") -> tuple[Reflector, queue.Queue[Event]]:
    events: queue.Queue[Event] = queue.Queue()
    return Reflector("pods", list_fn(pods, list_rv), events, threading.Event(), projection=PODS), events


def _drain(events: queue.Queue[Event], store: Store) -> list[Any]:
    changes = []
    while not events.empty():
        changes += store.apply(events.get_nowait())
    return changes


def test_the_list_path_keeps_only_relevant_pods_stripped() -> None:
    reflector, events = _reflector([ordinary_pod(1), gpu_pod(2), ordinary_pod(3)])
    reflector._list()
    store = Store(PODS.strip)
    _drain(events, store)
    assert list(store.objects) == ["team-2/train-000002"]
    assert store.objects["team-2/train-000002"] == podview.strip_pod(gpu_pod(2))


def test_a_relist_drops_a_pod_that_stopped_being_relevant() -> None:
    store = Store(PODS.strip)
    gated = gpu_pod(1, gated=True)
    store.apply(Event("pods", "REPLACE", items=(podview.strip_pod(gated),), resource_version="100001"))
    ungated = ordinary_pod(1)
    ungated["metadata"]["resourceVersion"] = "200000"
    reflector, events = _reflector([ungated], "200000")
    reflector._list()
    (event,) = list(events.queue)
    assert event.items == ()
    assert store.apply(event) == [("team-1/train-000001", podview.strip_pod(gated), None)]


def test_the_watch_path_turns_irrelevant_pods_into_deletions() -> None:
    store = Store(PODS.strip)
    gated_only = ordinary_pod(2)
    gated_only["spec"]["schedulingGates"] = [{"name": ALLOCATION_GATE}]
    released = copy.deepcopy(gated_only)
    released["spec"]["schedulingGates"] = []
    released["metadata"]["resourceVersion"] = str(int(released["metadata"]["resourceVersion"]) + 1)
    reflector, events = _reflector([ordinary_pod(1), gated_only, released])
    reflector._watch()
    kinds = [(e.kind, e.obj and e.obj["metadata"]["name"]) for e in events.queue]
    assert kinds == [
        ("DELETED", "web-7d9f8b6c5-000001"),
        ("ADDED", "web-7d9f8b6c5-000002"),
        ("DELETED", "web-7d9f8b6c5-000002"),
    ]
    deleted = events.queue[0].obj
    assert deleted == {
        "metadata": {
            k: ordinary_pod(1)["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion")
        }
    }
    changes = _drain(events, store)
    # Never kept: no change at all. The gate-only pod: added, then removed when the gate went.
    key = "team-2/web-7d9f8b6c5-000002"
    assert changes == [(key, None, podview.strip_pod(gated_only)), (key, podview.strip_pod(gated_only), None)]
    assert store.objects == {}
    assert reflector.resource_version == released["metadata"]["resourceVersion"]


def test_our_write_is_stripped_and_an_older_event_does_not_regress_it() -> None:
    store = Store(PODS.strip)
    gated = gpu_pod(1, gated=True)
    store.apply(Event("pods", "ADDED", obj=podview.strip_pod(gated)))
    released = copy.deepcopy(gated)
    released["spec"]["schedulingGates"] = []
    released["metadata"]["resourceVersion"] = "300000"
    store.assume(released)
    key = "team-1/train-000001"
    assert store.objects[key] == podview.strip_pod(released)
    assert store.apply(Event("pods", "MODIFIED", obj=podview.strip_pod(gated))) == []
    assert store.objects[key]["metadata"]["resourceVersion"] == "300000"
    # An irrelevant result of our own write is kept until the watch says otherwise.
    gated_only = ordinary_pod(2)
    store.assume(gated_only)
    assert "managedFields" not in store.objects["team-2/web-7d9f8b6c5-000002"]["metadata"]
    kind, tomb = PODS.event("MODIFIED", gated_only)
    assert kind == "DELETED" and store.apply(Event("pods", kind, obj=tomb))[0][2] is None


def test_every_watch_cache_projects_pods_by_default() -> None:
    cache = WatchCache({"pods": lambda **_: None, "nodes": lambda **_: None})
    assert cache.stores["pods"].strip is podview.strip_pod and cache.stores["nodes"].strip is None
    assert [r.projection for r in cache.reflectors] == [PODS, None]


def test_an_ordinary_pod_costs_under_2_kib_retained() -> None:
    for path in ("list", "watch"):
        assert retained_per_pod(ordinary_pod, 200, PODS, path) < 2048
        assert (
            retained_per_pod(ordinary_pod, 200, None, path) > 20 * 1024
        )  # the benchmark's pods are realistic
