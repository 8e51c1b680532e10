"""409 conflicts on each of the controller's writes (finalizer, allocation, gate removal), and objects it
cannot process (defect 8 of issue 10): skipped with a metric and an Event, never fatal."""

from __future__ import annotations

import copy
import threading

from ctl_helpers import claim
from fake_apiserver import Harness

from controller.kube.store import Event
from controller.kube.writer import FINALIZER

ONE_G = 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"'


def _conflicts(h: Harness) -> float:
    return h.ctl.metrics.registry.get_sample_value("flexmig_write_conflicts_total") or 0.0


def _someone_else_labels(h: Harness, resource: str, key: str) -> None:
    obj = copy.deepcopy(h.api.objects[resource][key])
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"
    h.api.put_object(resource, obj)


def _settle(h: Harness, rounds: int = 5) -> None:
    for _ in range(rounds):
        h.deliver()
        h.cycle()


def _one_pod() -> Harness:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("a", ONE_G))
    h.add_pod("p", ["a"])
    h.deliver()
    return h


def _allocated_once(h: Harness) -> None:
    assert [v for v in h.api.audit() if "ns/bad" not in v.detail] == []
    stored = h.api.objects["resourceclaims"]["ns/a"]
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"].startswith("gpu-0-mig-1g5gb")
    assert FINALIZER in stored["metadata"]["finalizers"]
    assert not h.gated("p")


def test_finalizer_write_conflict_decides_again_from_the_new_version() -> None:
    h = _one_pod()
    _someone_else_labels(h, "resourceclaims", "ns/a")  # not yet delivered: the cache is stale
    h.cycle()
    assert _conflicts(h) == 1
    assert "allocation" not in (h.api.objects["resourceclaims"]["ns/a"].get("status") or {})
    assert h.gated("p") and not h.ctl.ledger.owners  # nothing half-written, nothing held
    _settle(h)
    _allocated_once(h)
    assert h.api.objects["resourceclaims"]["ns/a"]["metadata"]["labels"] == {"touched": "yes"}


def test_allocation_write_conflict_rolls_the_finalizer_back_and_retries() -> None:
    h = _one_pod()
    h.api.fail.append(("PUT", "/resourceclaims/a/status", 409))
    h.cycle()
    assert _conflicts(h) == 1
    stored = h.api.objects["resourceclaims"]["ns/a"]
    assert FINALIZER not in (stored["metadata"].get("finalizers") or [])  # rolled back
    assert "allocation" not in (stored.get("status") or {})
    assert h.gated("p") and not h.ctl.ledger.owners
    _settle(h)
    _allocated_once(h)


def test_gate_removal_conflict_keeps_the_claims_and_only_releases_again() -> None:
    h = _one_pod()
    h.api.fail.append(("PATCH", "/pods/p", 409))
    h.cycle()
    assert _conflicts(h) == 1
    allocation = h.api.objects["resourceclaims"]["ns/a"]["status"]["allocation"]
    assert h.gated("p")
    _someone_else_labels(h, "pods", "ns/p")  # and the pod changes before the retry
    h.cycle()  # the cache still has the old pod: another 409, the claim untouched
    assert _conflicts(h) == 2 and h.gated("p")
    _settle(h)
    _allocated_once(h)
    assert h.api.objects["resourceclaims"]["ns/a"]["status"]["allocation"] == allocation  # not re-decided
    allocation_writes = [
        r
        for r in h.api.requests
        if r == ("PUT", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a/status")
    ]
    assert len(allocation_writes) == 1


def _skipped(h: Harness, kind: str) -> float:
    total = 0.0
    for metric in h.ctl.metrics.registry.collect():
        if metric.name == "flexmig_controller_skipped_objects":
            total += sum(
                s.value for s in metric.samples if s.name.endswith("_total") and s.labels["kind"] == kind
            )
    return total


def test_malformed_objects_are_skipped_with_an_event_and_a_metric() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    bad_claim = claim("bad", ONE_G) | {"status": {"allocation": {"devices": ["not", "an", "object"]}}}
    h.add_claim(bad_claim)
    bad_pod = {
        "metadata": {"name": "garbage", "namespace": "ns", "uid": "pod-garbage", "annotations": {"x": 5}},
        "spec": {"resourceClaims": "not-a-list", "schedulingGates": "neither", "containers": []},
    }
    h.api.put_object("pods", bad_pod)
    h.add_claim(claim("a", ONE_G))
    h.add_pod("p", ["a"])
    h.deliver()
    h.cycle()  # must not raise
    _settle(h)
    _allocated_once(h)  # the good pod is placed despite its neighbours
    assert _skipped(h, "ResourceClaim") >= 1 and _skipped(h, "Pod") >= 1
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in h.api.events}
    assert ("bad", "FlexmigSkipped") in reasons and ("garbage", "FlexmigSkipped") in reasons
    # Reported once per version, not on every pass.
    n_events = len(h.api.events)
    _settle(h)
    assert len(h.api.events) == n_events


def test_a_claim_that_fails_to_decide_is_skipped_and_the_next_pod_still_placed() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    broken = claim("broken", ONE_G)
    broken["spec"]["devices"]["requests"] = [{"name": "gpu", "exactly": "wrong type"}]
    h.add_claim(broken)
    h.add_pod("p-broken", ["broken"])
    h.add_claim(claim("a", ONE_G))
    h.add_pod("p", ["a"])
    _settle(h)
    _allocated_once(h)
    assert h.gated("p-broken")
    assert any(e["involvedObject"]["name"] == "p-broken" for e in h.api.events)


def test_run_survives_a_poisoned_batch() -> None:
    """Controller.run itself: a batch holding a malformed object is applied around it."""
    h = Harness({"n1": ("A100-40GB", 1)})
    h.ctl.cache.events.put(Event("pods", "ADDED", obj={"metadata": None}))  # not even a key
    h.ctl.cache.events.put(Event("resourceclaims", "MODIFIED", obj={"metadata": {"name": "x"}, "spec": 1}))
    h.add_claim(claim("a", ONE_G))
    h.add_pod("p", ["a"])
    h.deliver()  # behind the poison, in the same batch
    h.ctl.cache.start = lambda: None  # type: ignore[method-assign]  # no reflectors: the test feeds
    done = threading.Event()
    ticks = [0]

    def stop() -> bool:
        ticks[0] += 1
        if not h.gated("p") or ticks[0] > 50:
            done.set()
        return done.is_set()

    h.ctl.run(stop)
    assert not h.gated("p"), "the pod behind the poisoned events was never placed"
