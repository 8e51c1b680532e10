"""Upstream allocator cases about device taints, consumable capacity, distinct attributes, constraints
with firstAvailable and All with other claims, run through controller-mode allocation (continued from test_ctl_upstream_conformance.py, whose docstring
says how cases are translated and counted)."""

from __future__ import annotations

from typing import Any

import shared_helpers as sh
from conformance_helpers import (
    CLASS_B,
    CLASSES,
    TAINT_NO_EXECUTE,
    TAINT_NO_SCHEDULE,
    TAINT_NONE,
    TOL_NO_EXECUTE,
    TOL_NO_SCHEDULE,
    WHOLE,
    claim,
    decider,
    ex,
    fa,
    sub,
    upstream,
)
from ctl_helpers import mem

from controller.allocation.decide import ControllerReason

INVALID = ControllerReason.INVALID_REQUEST
H100 = "H100-80GB"


def _all(cls: str = WHOLE) -> dict[str, object]:
    return claim("c", ex("req-0", cls=cls, allocationMode="All"))


@upstream("tainted-two-devices", "same")
def test_tainted_two_devices() -> None:
    d = decider(gpus=2, taints={0: [TAINT_NO_SCHEDULE], 1: [TAINT_NO_EXECUTE]})
    assert d.decide([claim("c", ex("req-0"))], CLASSES).reason == ControllerReason.NO_MATCHING_DEVICE


@upstream("tainted-one-device-two-taints", "same")
def test_tainted_one_device_two_taints() -> None:
    d = decider(taints={0: [TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]})
    assert not d.decide([claim("c", ex("req-0"))], CLASSES).ok


@upstream("tainted-two-devices-tolerated", "same")
def test_tainted_two_devices_tolerated() -> None:
    d = decider(gpus=2, taints={0: [TAINT_NO_SCHEDULE], 1: [TAINT_NO_EXECUTE]})
    decision = d.decide([claim("c", ex("req-0", tolerations=[TOL_NO_EXECUTE]))], CLASSES)
    assert decision.ok
    (result,) = decision.allocations[0].results
    assert result["device"].startswith("gpu-1-") and result["tolerations"] == [TOL_NO_EXECUTE]


@upstream("tainted-two-devices-prioritized-list-tolerated", "same")
def test_tainted_two_devices_prioritized_list_tolerated() -> None:
    d = decider(gpus=2, taints={0: [TAINT_NO_SCHEDULE], 1: [TAINT_NO_EXECUTE]})
    c = claim("c", fa("req-0", sub("subReq-0"), sub("subReq-1", tolerations=[TOL_NO_EXECUTE])))
    (result,) = d.decide([c], CLASSES).allocations[0].results
    assert result["request"] == "req-0/subReq-1" and result["tolerations"] == [TOL_NO_EXECUTE]


@upstream("tainted-no-effect", "same")
def test_tainted_no_effect() -> None:
    decision = decider(taints={0: [TAINT_NONE]}).decide([claim("c", ex("req-0"))], CLASSES)
    assert decision.ok and "tolerations" not in decision.allocations[0].results[0]


@upstream("tainted-one-device-two-taints-both-tolerated", "same")
def test_tainted_one_device_two_taints_both_tolerated() -> None:
    d = decider(taints={0: [TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]})
    decision = d.decide([claim("c", ex("req-0", tolerations=[TOL_NO_SCHEDULE, TOL_NO_EXECUTE]))], CLASSES)
    assert decision.ok
    assert decision.allocations[0].results[0]["tolerations"] == [TOL_NO_SCHEDULE, TOL_NO_EXECUTE]


@upstream("tainted-prioritized-list", "same")
def test_tainted_prioritized_list() -> None:
    c = claim("c", fa("req-0", sub("subReq-0", cls=CLASS_B), sub("subReq-1")))
    assert not decider(taints={0: [TAINT_NO_SCHEDULE]}).decide([c], CLASSES).ok


@upstream("tainted-all-devices-single", "same")
def test_tainted_all_devices_single() -> None:
    assert not decider(taints={0: [TAINT_NO_SCHEDULE]}, model=H100).decide([_all()], CLASSES).ok


@upstream("consumable-capacity-dedicated-device-with-consumable-capacity-request", "same")
def test_consumable_capacity_dedicated_device_with_consumable_capacity_request() -> None:
    c = claim("c", ex("req-0", capacity={"requests": {"memory": "4000Mi"}}))
    decision = decider().decide([c], CLASSES)
    assert decision.ok and "consumedCapacity" not in decision.allocations[0].results[0]


@upstream("consumable-capacity-dedicated-device-with-multiple-consumable-capacity-request", "same")
def test_consumable_capacity_dedicated_device_with_multiple_consumable_capacity_request() -> None:
    # Two claims on the one device that holds the capacity: a dedicated device is not shared.
    big = {"requests": {"memory": "40000Mi"}}
    d = decider()
    claims = [claim("c0", ex("req-0", capacity=big)), claim("c1", ex("req-0", capacity=big))]
    assert not d.decide(claims, CLASSES).ok


@upstream("consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request", "same")
def test_consumable_capacity_multi_allocatable_device_with_range_policy_with_capacity_request() -> None:
    d = sh.decider({"node-1": [16000]})
    claims = [sh.claim(f"c{i}", sh.hami_body(memory=1000)) for i in range(2)]
    decision = d.decide(claims, sh.CLASSES)
    assert decision.ok and {r["device"] for a in decision.allocations for r in a.results} == {"gpu-0-shared"}


@upstream("consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request", "same")
def test_consumable_capacity_multi_allocatable_device_with_exceeded_consumable_capacity_request() -> None:
    d = sh.decider({"node-1": [16000]})
    claims = [sh.claim("c0", sh.hami_body(memory=8000)), sh.claim("c1", sh.hami_body(memory=9000))]
    assert not d.decide(claims, sh.CLASSES).ok


@upstream("with-distinct-constraints-attribute-not-set", "same")
def test_with_distinct_constraints_attribute_not_set() -> None:
    c = claim(
        "c", ex("req-0"), constraints=[{"requests": ["req-0"], "distinctAttribute": "gpu.flexmig.dev/nope"}]
    )
    assert decider().decide([c], CLASSES).reason == ControllerReason.CONSTRAINT_UNSATISFIED


@upstream("distinct-constraint-one-multi-allocatable-device-with-distinct-constraint", "same")
def test_distinct_constraint_one_multi_allocatable_device_with_distinct_constraint() -> None:
    d = sh.decider({"node-1": [16000]})
    c = sh.claim("c", sh.hami_body(memory=1000, count=2))
    c["spec"]["devices"]["constraints"] = [{"distinctAttribute": "gpu.flexmig.dev/uuid"}]
    assert not d.decide([c], sh.CLASSES).ok


@upstream("distinct-constraint-two-multi-allocatable-devices-with-distinct-constraint", "same")
def test_distinct_constraint_two_multi_allocatable_devices_with_distinct_constraint() -> None:
    d = sh.decider({"node-1": [16000, 16000]})
    c = sh.claim("c", sh.hami_body(memory=1000, count=2))
    c["spec"]["devices"]["constraints"] = [{"distinctAttribute": "gpu.flexmig.dev/uuid"}]
    decision = d.decide([c], sh.CLASSES)
    assert decision.ok and len({r["device"] for r in decision.allocations[0].results}) == 2


# --- constraints with firstAvailable, backtracking, All with other claims --------------------------

PARENT = "gpu.flexmig.dev/parentUUID"


def _gpu(decision: object, request: str) -> set[str]:
    results = [r for a in decision.allocations for r in a.results]  # type: ignore[attr-defined]
    return {r["device"].split("-mig-")[0] for r in results if r["request"] == request}


@upstream("small-and-large-backtrack-requests", "same")
def test_small_and_large_backtrack_requests() -> None:
    # Upstream must backtrack when the large device is listed first; flexmig places the largest first.
    c = claim("c", ex("req-1", sel=mem(9000)), ex("req-0", sel=mem(4000)))
    decision = decider().decide([c], CLASSES)
    assert decision.ok and sorted(r["request"] for r in decision.allocations[0].results) == ["req-0", "req-1"]


@upstream("with-constraint-for-request-retry", "same")
def test_with_constraint_for_request_retry() -> None:
    constraints: list[dict[str, Any]] = [
        {"requests": ["req-0"], "matchAttribute": "gpu.flexmig.dev/profile"},
        {"matchAttribute": PARENT},
    ]
    c = claim("c", ex("req-0", sel=mem(4000)), ex("req-1", sel=mem(4000)), constraints=constraints)
    decision = decider(gpus=2).decide([c], CLASSES)
    assert decision.ok and len(_gpu(decision, "req-0") | _gpu(decision, "req-1")) == 1


@upstream("prioritized-list-subrequests-with-constraints-ref-parent-request", "same")
def test_prioritized_list_subrequests_with_constraints_ref_parent_request() -> None:
    # subReq-0 (a whole-GPU-sized MIG device) cannot share req-0's GPU: the constraint on the parent
    # request covers every subrequest, so subReq-1 is taken, on req-0's GPU.
    constraints = [{"requests": ["req-0", "req-1"], "matchAttribute": PARENT}]
    c = claim(
        "c",
        ex("req-0", sel=mem(19000)),
        fa("req-1", sub("subReq-0", sel=mem(40000)), sub("subReq-1", sel=mem(4000))),
        constraints=constraints,
    )
    decision = decider(gpus=2).decide([c], CLASSES)
    assert decision.ok and _gpu(decision, "req-0") == _gpu(decision, "req-1/subReq-1")


@upstream("prioritized-list-subrequests-with-constraints-ref-sub-request", "same")
def test_prioritized_list_subrequests_with_constraints_ref_sub_request() -> None:
    # The constraint names only subReq-0: subReq-0 cannot meet it, subReq-1 is not bound by it.
    constraints = [{"requests": ["req-0", "req-1/subReq-0"], "matchAttribute": PARENT}]
    c = claim(
        "c",
        ex("req-0", sel=mem(19000)),
        fa("req-1", sub("subReq-0", sel=mem(40000)), sub("subReq-1", sel=mem(4000))),
        constraints=constraints,
    )
    decision = decider(gpus=2).decide([c], CLASSES)
    assert decision.ok and [r["request"] for r in decision.allocations[0].results][-1] == "req-1/subReq-1"


@upstream("check-combinations-with-backtracking", "same")
def test_check_combinations_with_backtracking() -> None:
    # req-1 needs two generic devices, req-2 the one kind only one GPU can still give.
    c = claim("c", ex("req-1", count=2, sel=mem(4000)), ex("req-2", sel=mem(40000)))
    decision = decider(gpus=2).decide([c], CLASSES)
    assert decision.ok and _gpu(decision, "req-2").isdisjoint(_gpu(decision, "req-1"))


@upstream("with-distinct-constraints", "same")
def test_with_distinct_constraints() -> None:
    c = claim(
        "c",
        *(ex(f"req-{i}", sel=mem(4000)) for i in range(4)),
        constraints=[{"requests": [f"req-{i}" for i in range(4)], "distinctAttribute": PARENT}],
    )
    decision = decider(gpus=4).decide([c], CLASSES)
    assert decision.ok and len({g for i in range(4) for g in _gpu(decision, f"req-{i}")}) == 4


@upstream("all-devices-plus-another", "same")
def test_all_devices_plus_another() -> None:
    first_two = 'device.attributes["gpu.flexmig.dev"].index < 2'
    claims = [
        claim(
            "c0", ex("req-0", cls=WHOLE, allocationMode="All", selectors=[{"cel": {"expression": first_two}}])
        ),
        claim("c1", ex("req-0", sel='device.attributes["gpu.flexmig.dev"].type == "mig"')),
    ]
    decision = decider(gpus=3, model=H100).decide(claims, CLASSES)
    assert decision.ok
    assert sorted(r["device"] for r in decision.allocations[0].results) == ["gpu-0", "gpu-1"]
    assert decision.allocations[1].results[0]["device"].startswith("gpu-2-mig-")


@upstream("all-devices-no-solution", "same")
def test_all_devices_no_solution() -> None:
    claims = [claim("c1", ex("req-0", cls=WHOLE)), claim("c0", ex("req-0", cls=WHOLE, allocationMode="All"))]
    assert not decider(model=H100).decide(claims, CLASSES).ok


@upstream("consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device", "same")
def test_consumable_capacity_multi_allocatable_device_with_allocated_capacity_next_device() -> None:
    d = sh.decider({"node-1": [16000, 16000]})
    first = d.decide([sh.claim("busy", sh.hami_body(memory=16000))], sh.CLASSES)
    for alloc in first.allocations:
        d.ledger.assume(alloc.uid, alloc.keys)
    decision = d.decide([sh.claim("c", sh.hami_body(memory=16000))], sh.CLASSES)
    assert decision.ok
    assert decision.allocations[0].results[0]["device"] != first.allocations[0].results[0]["device"]
