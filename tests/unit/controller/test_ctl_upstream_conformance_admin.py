"""Upstream allocator cases about adminAccess, run through controller-mode allocation (continued from
test_ctl_upstream_conformance.py, whose docstring says how cases are translated and counted), and the
flexmig rules around them (controller/allocation/adminaccess.py).

Upstream's plain devices (no counters, always there) are translated onto whole GPUs of H100s (class
gpu.flexmig.dev): like upstream's, a whole GPU exists whether a claim holds it or not. "allocatedDevices"
are whole GPUs held by other claims.
"""

from __future__ import annotations

from conformance_helpers import (
    CLASSES,
    TAINT_NO_SCHEDULE,
    TOL_NO_SCHEDULE,
    WHOLE,
    claim,
    commit,
    decider,
    ex,
    fa,
    fill,
    sub,
    upstream,
)
from ctl_helpers import mem

from controller.allocation.decide import ControllerReason, Decider, Decision
from controller.state.audit import audit_allocations
from controller.state.ledger import claim_holdings
from controller.views.statusmodel import collect_allocations

H100 = "H100-80GB"


def _admin(name: str = "c", count: int = 1, **extra: object) -> dict[str, object]:
    return claim(name, ex("req-0", cls=WHOLE, count=count, adminAccess=True, **extra))


def _hold_whole(d: Decider, name: str) -> Decision:
    decision = d.decide([claim(name, ex("r", cls=WHOLE))], CLASSES)
    commit(d, decision)
    return decision


def _devices(decision: Decision) -> list[str]:
    return sorted(r["device"] for a in decision.allocations for r in a.results)


@upstream("admin-access-enabled", "same")
def test_admin_access_enabled() -> None:
    # Upstream's one device is allocated to another claim already: the admin gets it all the same.
    d = decider(model=H100)
    _hold_whole(d, "busy")
    decision = d.decide([_admin()], CLASSES)
    assert decision.ok and decision.node == "node-1"
    assert decision.allocations[0].results == [
        {
            "request": "req-0",
            "driver": "gpu.flexmig.dev",
            "pool": "node-1",
            "device": "gpu-0",
            "adminAccess": True,
        }
    ]


@upstream("count-devices-some-allocated-admin-access", "same")
def test_count_devices_some_allocated_admin_access() -> None:
    d = decider(gpus=2, model=H100)
    _hold_whole(d, "busy")
    decision = d.decide([_admin(count=2)], CLASSES)
    assert decision.ok and _devices(decision) == ["gpu-0", "gpu-1"]
    assert all(r["adminAccess"] is True for r in decision.allocations[0].results)


@upstream("all-devices-some-allocated-admin-access", "same")
def test_all_devices_some_allocated_admin_access() -> None:
    d = decider(gpus=2, model=H100)
    _hold_whole(d, "busy")
    decision = d.decide([_admin(allocationMode="All")], CLASSES)
    assert decision.ok and _devices(decision) == ["gpu-0", "gpu-1"]


@upstream("tainted-admin-access", "same")
def test_tainted_admin_access() -> None:
    # adminAccess does not pass taints: upstream does not allocate either.
    d = decider(taints={0: [TAINT_NO_SCHEDULE]}, model=H100)
    decision = d.decide([_admin()], CLASSES)
    assert not decision.ok and decision.reason == ControllerReason.NO_MATCHING_DEVICE


def test_tainted_admin_access_with_a_toleration() -> None:
    d = decider(taints={0: [TAINT_NO_SCHEDULE]}, model=H100)
    decision = d.decide([_admin(tolerations=[TOL_NO_SCHEDULE])], CLASSES)
    assert decision.ok
    assert decision.allocations[0].results[0]["tolerations"] == [TOL_NO_SCHEDULE]
    assert decision.allocations[0].results[0]["adminAccess"] is True


@upstream("all-devices-some-allocating-admin-access", "same")
def test_all_devices_some_allocating_admin_access() -> None:
    # The first request takes one device of the claim, so "all" cannot be had by the second.
    c = claim(
        "c",
        ex("req-0", cls=WHOLE, adminAccess=True),
        ex("req-1", cls=WHOLE, adminAccess=True, allocationMode="All"),
    )
    assert not decider(gpus=2, model=H100).decide([c], CLASSES).ok


@upstream("separate-claims-share-device-admin-access", "same")
def test_separate_claims_share_device_admin_access() -> None:
    decision = decider(gpus=2, model=H100).decide([_admin("c0"), _admin("c1")], CLASSES)
    assert decision.ok
    assert [a.results[0]["device"] for a in decision.allocations] == ["gpu-0", "gpu-0"]


@upstream("admin-access-claims-device-allocating-for-non-admin-access", "same")
def test_admin_access_claims_device_allocating_for_non_admin_access() -> None:
    # One pod: a claim taking a GPU and an admin claim that may be given the same one.
    d = decider(model=H100)
    decision = d.decide([claim("c0", ex("req-0", cls=WHOLE)), _admin("c1")], CLASSES)
    assert decision.ok
    [normal], [admin] = (a.results for a in decision.allocations)
    assert normal["device"] == admin["device"] == "gpu-0"
    assert "adminAccess" not in normal and admin["adminAccess"] is True


# --- flexmig's rules around adminAccess (not upstream cases) -----------------------------------------


def test_admin_devices_are_not_held_so_a_later_claim_still_gets_them() -> None:
    d = decider(model=H100)
    admin = d.decide([_admin()], CLASSES)
    commit(d, admin)
    assert admin.allocations[0].keys == []
    assert d.ledger.held_twice == 0 and not d.ledger.is_used(("node-1", "gpu-0"))
    later = _hold_whole(d, "user")
    assert _devices(later) == ["gpu-0"]


def test_admin_of_a_held_device_is_no_double_hold() -> None:
    d = decider(model=H100)
    held = _hold_whole(d, "user")
    admin = d.decide([_admin()], CLASSES)
    commit(d, admin)
    assert _devices(admin) == ["gpu-0"]
    assert d.ledger.held_twice == 0 and d.ledger.double_holds == []
    assert d.ledger.holders(("node-1", "gpu-0")) == (held.allocations[0].uid,)


def test_audit_does_not_count_an_admin_result_as_a_second_holder() -> None:
    d = decider(model=H100)
    held = _hold_whole(d, "user")
    admin = d.decide([_admin()], CLASSES)
    claims = []
    for decision in (held, admin):
        alloc = decision.allocations[0]
        claims.append({**alloc.claim, "status": {"allocation": {"devices": {"results": alloc.results}}}})
    from ctl_helpers import node_slices

    assert audit_allocations(claims, node_slices("node-1", H100, 1)) == []


def test_mig_device_in_use_is_given_to_an_admin_request() -> None:
    # The monitoring case: a MIG instance another claim holds (upstream's counter check would refuse it).
    d = decider()
    fill(d, 40000, 1)
    used = next(iter(d.ledger.owners))
    decision = d.decide([claim("c", ex("req-0", adminAccess=True))], CLASSES)
    assert decision.ok and _devices(decision) == [used[1]]
    assert decision.allocations[0].results[0]["adminAccess"] is True


def test_free_mig_placement_is_not_given_to_an_admin_request() -> None:
    # Deliberate difference: a free placement has no instance to watch; the message says what works.
    decision = decider().decide([claim("c", ex("req-0", adminAccess=True))], CLASSES)
    assert decision.reason == ControllerReason.NO_MATCHING_DEVICE
    assert "exactly.adminAccess" in decision.message and "gpu.flexmig.dev" in decision.message


def test_admin_request_next_to_a_normal_one_goes_to_the_same_node_and_claim() -> None:
    d = decider(nodes=("node-1", "node-2"), model=H100)
    c = claim("c", ex("mine", sel=mem(9000)), ex("watch", cls=WHOLE, adminAccess=True))
    decision = d.decide([c], CLASSES)
    assert decision.ok
    results = decision.allocations[0].results
    assert sorted(r["request"] for r in results) == ["mine", "watch"]
    assert [r.get("adminAccess") for r in results] == [None, True]
    # Only the normal device is held.
    assert decision.allocations[0].keys == [(decision.node, results[0]["device"])]


def test_one_claim_never_gets_one_device_twice() -> None:
    d = decider(model=H100)
    c = claim("c", ex("a", cls=WHOLE, adminAccess=True), ex("b", cls=WHOLE, adminAccess=True))
    assert d.decide([c], CLASSES).reason == ControllerReason.CONSTRAINT_UNSATISFIED
    assert decider(gpus=2, model=H100).decide([c], CLASSES).ok


def test_admin_constraint_over_admin_devices() -> None:
    c = claim(
        "c",
        ex("req-0", cls=WHOLE, count=2, adminAccess=True),
        constraints=[{"distinctAttribute": "gpu.flexmig.dev/uuid"}],
    )
    decision = decider(gpus=2, model=H100).decide([c], CLASSES)
    assert decision.ok and _devices(decision) == ["gpu-0", "gpu-1"]


def test_admin_access_in_a_subrequest_is_refused_naming_the_field() -> None:
    c = claim("c", fa("req-0", sub("s", cls=WHOLE, adminAccess=True)))
    decision = decider(model=H100).decide([c], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "firstAvailable[s].adminAccess is allowed only in exactly" in decision.message


def test_admin_access_with_capacity_is_refused_naming_the_field() -> None:
    c = claim("c", ex("req-0", cls=WHOLE, adminAccess=True, capacity={"requests": {"memory": "1Gi"}}))
    decision = decider(model=H100).decide([c], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST and "exactly.capacity" in decision.message


def test_an_allocation_with_admin_results_holds_only_its_other_devices() -> None:
    # What the watch shows (whoever allocated it): the admin result is not a holding of the claim.
    results = [
        {
            "request": "a",
            "driver": "gpu.flexmig.dev",
            "pool": "node-1",
            "device": "gpu-0",
            "adminAccess": True,
        },
        {"request": "b", "driver": "gpu.flexmig.dev", "pool": "node-1", "device": "gpu-1"},
    ]
    c = {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": results}}}}
    assert claim_holdings(c) == [("node-1", "gpu-1")]


def test_flexmig_status_shows_the_holder_not_an_admin_as_a_conflict() -> None:
    def claim_of(name: str, admin: bool) -> dict[str, object]:
        result = {"request": "r", "driver": "gpu.flexmig.dev", "pool": "node-1", "device": "gpu-0"}
        if admin:
            result["adminAccess"] = True
        return {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "status": {
                "allocation": {"devices": {"results": [result]}},
                "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": "u"}],
            },
        }

    found = collect_allocations([claim_of("user", False), claim_of("monitor", True)])
    assert not found.conflicts
    assert found.holders[("node-1", "gpu-0")].claim == "ns/user"


def test_an_admin_request_adds_nothing_to_the_pods_size() -> None:
    # The pod's size prices what it takes from the cluster (burst plans, age order): an admin takes nothing.
    from controller.allocation.podsize import pod_size

    d = decider(model=H100)
    c = claim("c", ex("mine", sel=mem(9000)), ex("watch", cls=WHOLE, adminAccess=True))
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": "c", "resourceClaimName": "c"}]},
    }
    size = pod_size(pod, {"ns/c": c}, CLASSES, d.index)
    assert size is not None and size.devices == 1 and size.plan_key is None


def test_an_admin_claim_may_watch_the_mig_device_its_own_pod_is_given() -> None:
    # As upstream's admin-access-claims-device-allocating-for-non-admin-access, on MIG devices: the
    # instance will exist once the pod's other claim is prepared.
    big = mem(40000)
    decision = decider().decide(
        [claim("c0", ex("req-0", sel=big)), claim("c1", ex("req-0", sel=big, adminAccess=True))], CLASSES
    )
    assert decision.ok, decision.message
    [normal], [admin] = (a.results for a in decision.allocations)
    assert normal["device"] == admin["device"] and admin["adminAccess"] is True
    assert decision.allocations[1].keys == []
