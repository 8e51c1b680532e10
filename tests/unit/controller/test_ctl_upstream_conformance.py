"""Upstream allocator cases (kubernetes staging/src/k8s.io/dynamic-resource-allocation/structured/
internal/allocatortesting/allocator_testing.go), translated onto flexmig's devices and run through
controller-mode allocation (Decider). Each test names its upstream case; conformance_helpers.py says
what "same", "refused" and "different" mean, and docs/native-claims.md reports the counts.

Translation: upstream's devices with a `memory` capacity become MIG devices of A100-40GB GPUs (1g.5gb
.. 7g.40gb), its multi-allocatable devices hami-core shared GPUs, its "allocatedDevices" devices held
by other claims. Which of several equally valid devices is chosen is flexmig's placement policy
(packing), not upstream's first-listed device: only what upstream's answer fixes is asserted.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from conformance_helpers import (
    CLASS_B,
    CLASSES,
    OUTCOMES,
    WHOLE,
    claim,
    decider,
    ex,
    fa,
    fill,
    from_slices,
    opaque,
    requests_of,
    sub,
    upstream,
)
from ctl_helpers import CLASS, mem, node_slices

from controller.allocation.decide import ControllerReason, node_selector

H100 = "H100-80GB"
BIG = mem(40000)  # only 7g.40gb: one per A100-40GB
INVALID = ControllerReason.INVALID_REQUEST


@upstream("simple", "same")
def test_simple() -> None:
    decision = decider().decide([claim("c", ex("req-0"))], CLASSES)
    assert decision.ok and decision.node == "node-1" and requests_of(decision) == ["req-0"]
    assert decision.allocations[0].results[0]["driver"] == "gpu.flexmig.dev"
    assert node_selector("node-1")["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]


@upstream("other-node", "same")
def test_other_node() -> None:
    other = {
        "spec": {"driver": "other.example.com", "nodeName": "node-1", "pool": {"name": "p"}, "devices": []}
    }
    d = from_slices([other, *node_slices("node-2", "A100-40GB", 1)])
    decision = d.decide([claim("c", ex("req-0"))], CLASSES)
    assert decision.ok and decision.node == "node-2"


@upstream("small-and-large", "same")
def test_small_and_large() -> None:
    c = claim("c", ex("req-0", sel=mem(4000)), ex("req-1", sel=mem(9000)))
    decision = decider().decide([c], CLASSES)
    assert decision.ok and sorted(requests_of(decision)) == ["req-0", "req-1"]


@upstream("small-and-large-backtrack-claims", "same")
def test_small_and_large_backtrack_claims() -> None:
    claims = [claim("c0", ex("req-0", sel=mem(4000))), claim("c1", ex("req-1", sel=mem(9000)))]
    decision = decider().decide(claims, CLASSES)
    assert decision.ok and [len(a.results) for a in decision.allocations] == [1, 1]


@upstream("devices-split-across-different-slices", "same")
def test_devices_split_across_different_slices() -> None:
    decision = decider(gpus=2).decide([claim("c", ex("req-0", count=2, sel=BIG))], CLASSES)
    assert decision.ok and len({r["device"] for r in decision.allocations[0].results}) == 2


@upstream("no-allocation-from-incomplete-pools", "same")
def test_no_allocation_from_incomplete_pools() -> None:
    slices = node_slices("node-1", "A100-40GB", 1)
    for s in slices:
        s["spec"]["pool"]["resourceSliceCount"] = len(slices) + 1
    decision = from_slices(slices).decide([claim("c", ex("req-0"))], CLASSES)
    assert decision.reason == ControllerReason.NO_MATCHING_DEVICE


@upstream("no-slices", "same")
def test_no_slices() -> None:
    assert not from_slices([]).decide([claim("c", ex("req-0"))], CLASSES).ok


@upstream("not-enough-suitable-devices", "same")
def test_not_enough_suitable_devices() -> None:
    decision = decider().decide([claim("c", ex("req-0", sel=BIG), ex("req-1", sel=BIG))], CLASSES)
    assert not decision.ok


@upstream("unknown-class", "same")
def test_unknown_class() -> None:
    decision = decider().decide([claim("c", ex("req-0", cls="unknown-class"))], CLASSES)
    assert decision.reason == INVALID and "'unknown-class' does not exist" in decision.message


@upstream("empty-class", "same")
def test_empty_class() -> None:
    decision = decider().decide([claim("c", ex("req-0", cls=""))], CLASSES)
    assert decision.reason == INVALID and "deviceClassName is required" in decision.message


@upstream("already-allocated-devices", "same")
def test_already_allocated_devices() -> None:
    d = decider()
    fill(d, 40000, 1)
    assert not d.decide([claim("c", ex("req-0", sel=BIG))], CLASSES).ok


def _all(cls: str = WHOLE) -> dict[str, object]:
    return claim("c", ex("req-0", cls=cls, allocationMode="All"))


@upstream("all-devices-single", "same")
def test_all_devices_single() -> None:
    decision = decider(model=H100).decide([_all()], CLASSES)
    assert decision.ok and [r["device"] for r in decision.allocations[0].results] == ["gpu-0"]


@upstream("all-devices-many", "same")
def test_all_devices_many() -> None:
    decision = decider(gpus=2, model=H100).decide([_all()], CLASSES)
    assert decision.ok
    assert sorted(r["device"] for r in decision.allocations[0].results) == ["gpu-0", "gpu-1"]


@upstream("all-devices-some-allocated", "same")
def test_all_devices_some_allocated() -> None:
    d = decider(gpus=2, model=H100)
    fill(d, 9000, 1)  # a MIG device on one GPU: that whole GPU is in use
    assert not d.decide([_all()], CLASSES).ok


@upstream("all-devices-no-slices", "same")
def test_all_devices_no_slices() -> None:
    assert not from_slices([]).decide([_all()], CLASSES).ok


@upstream("prioritized-list-allocation-mode-all", "same")
def test_prioritized_list_allocation_mode_all() -> None:
    d = decider(gpus=2, model=H100)
    fill(d, 9000, 1)
    c = claim("c", fa("req-0", sub("subReq-0", cls=WHOLE, allocationMode="All"), sub("subReq-1", cls=WHOLE)))
    assert requests_of(d.decide([c], CLASSES)) == ["req-0/subReq-1"]


@upstream("with-constraint", "same")
def test_with_constraint() -> None:
    constraints = [
        {"matchAttribute": "gpu.flexmig.dev/productName"},
        {"matchAttribute": "gpu.flexmig.dev/model"},
        {"matchAttribute": "gpu.flexmig.dev/parentUUID"},
    ]
    c = claim("c", ex("req-0", sel=mem(4000)), ex("req-1", sel=mem(4000)), constraints=constraints)
    decision = decider(gpus=2).decide([c], CLASSES)
    assert decision.ok
    assert len({r["device"].split("-mig-")[0] for r in decision.allocations[0].results}) == 1


@upstream("with-constraint-non-existent-attribute", "same")
def test_with_constraint_non_existent_attribute() -> None:
    c = claim("c", ex("req-0"), constraints=[{"matchAttribute": "gpu.flexmig.dev/nonExistent"}])
    assert decider().decide([c], CLASSES).reason == ControllerReason.CONSTRAINT_UNSATISFIED


@upstream("with-constraint-not-matching-int-attribute", "same")
def test_with_constraint_not_matching_int_attribute() -> None:
    # Two 7g.40gb need two GPUs, whose `index` differs.
    c = claim("c", ex("req-0", count=2, sel=BIG), constraints=[{"matchAttribute": "gpu.flexmig.dev/index"}])
    assert decider(gpus=2).decide([c], CLASSES).reason == ControllerReason.CONSTRAINT_UNSATISFIED


@upstream("with-constraint-for-request", "same")
def test_with_constraint_for_request() -> None:
    constraints = [{"requests": ["req-0"], "matchAttribute": "gpu.flexmig.dev/parentUUID"}]
    c = claim("c", ex("req-0", sel=BIG), ex("req-1", sel=BIG), constraints=constraints)
    assert decider(gpus=2).decide([c], CLASSES).ok  # req-1 is not covered: another GPU is fine


@upstream("with-class-device-config", "same")
def test_with_class_device_config() -> None:
    classes = {CLASS: {**CLASSES[CLASS], "spec": {**CLASSES[CLASS]["spec"], "config": [opaque("class")]}}}
    decision = decider().decide([claim("c", ex("req-0"))], classes)
    assert decision.ok and decision.allocations[0].config == [
        {"source": "FromClass", "requests": ["req-0"], "opaque": opaque("class")["opaque"]}
    ]


@upstream("claim-with-device-config", "same")
def test_claim_with_device_config() -> None:
    decision = decider().decide([claim("c", ex("req-0"), config=[opaque("claim")])], CLASSES)
    assert decision.ok and decision.allocations[0].config == [{"source": "FromClaim", **opaque("claim")}]


@upstream("unknown-selector", "same")
def test_unknown_selector() -> None:
    c = claim("c", ex("req-0"))
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{}]
    decision = decider().decide([c], CLASSES)
    assert decision.reason == INVALID and "requests[0].exactly.selectors[0]" in decision.message


@upstream("unknown-allocation-mode", "same")
def test_unknown_allocation_mode() -> None:
    decision = decider().decide([claim("c", ex("req-0", allocationMode="future-mode"))], CLASSES)
    assert decision.reason == INVALID and "allocationMode 'future-mode'" in decision.message


@upstream("unknown-constraint", "same")
def test_unknown_constraint() -> None:
    decision = decider().decide([claim("c", ex("req-0"), constraints=[{}])], CLASSES)
    assert decision.reason == INVALID and "constraints[0]" in decision.message


@upstream("invalid-CEL-one-device", "same")
def test_invalid_cel_one_device() -> None:
    decision = decider().decide([claim("c", ex("req-0", sel="noSuchVar"))], CLASSES)
    assert decision.reason == INVALID and "requests[req-0]" in decision.message


@upstream("too-many-devices-single-request", "same")
def test_too_many_devices_single_request() -> None:
    decision = decider().decide([claim("c", ex("req-0", count=500))], CLASSES)
    assert decision.reason == INVALID and "at most 32" in decision.message


@upstream("too-many-devices-total", "same")
def test_too_many_devices_total() -> None:
    decision = decider(gpus=5).decide([claim("c", ex("req-0", count=32), ex("req-1"))], CLASSES)
    assert decision.reason == INVALID and "33 devices" in decision.message


@upstream("max-number-devices", "same")
def test_max_number_devices() -> None:
    decision = decider(gpus=5).decide([claim("c", ex("req-0", count=32, sel=mem(4000)))], CLASSES)
    assert decision.ok and len(decision.allocations[0].results) == 32


@upstream("prioritized-list-first-unavailable", "same")
def test_prioritized_list_first_unavailable() -> None:
    c = claim("c", fa("req-0", sub("subReq-0", cls=CLASS_B), sub("subReq-1")))
    assert requests_of(decider().decide([c], CLASSES)) == ["req-0/subReq-1"]


@upstream("prioritized-list-non-available", "same")
def test_prioritized_list_non_available() -> None:
    c = claim("c", fa("req-0", sub("subReq-0", 2, cls=CLASS_B), sub("subReq-1", 2, sel=BIG)))
    assert not decider().decide([c], CLASSES).ok


@upstream("prioritized-list-device-config", "same")
def test_prioritized_list_device_config() -> None:
    c = claim(
        "c",
        fa("req-0", sub("subReq-0", cls=CLASS_B), sub("subReq-1", 2, sel=mem(4000))),
        config=[opaque("foo", ["req-0/subReq-0"]), opaque("bar", ["req-0/subReq-1"])],
    )
    decision = decider().decide([c], CLASSES)
    assert decision.ok and requests_of(decision) == ["req-0/subReq-1"] * 2
    assert decision.allocations[0].config == [{"source": "FromClaim", **opaque("bar", ["req-0/subReq-1"])}]


@upstream("prioritized-list-class-config", "same")
def test_prioritized_list_class_config() -> None:
    classes = {
        CLASS: {**CLASSES[CLASS], "spec": {**CLASSES[CLASS]["spec"], "config": [opaque("bar")]}},
        CLASS_B: {**CLASSES[CLASS_B], "spec": {**CLASSES[CLASS_B]["spec"], "config": [opaque("foo")]}},
    }
    c = claim("c", fa("req-0", sub("subReq-0", 2, cls=CLASS_B), sub("subReq-1", 2, sel=mem(4000))))
    decision = decider().decide([c], classes)
    assert decision.ok and decision.allocations[0].config == [
        {"source": "FromClass", "requests": ["req-0/subReq-1"], "opaque": opaque("bar")["opaque"]}
    ]


@upstream("prioritized-list-subrequests-with-expressions", "same")
def test_prioritized_list_subrequests_with_expressions() -> None:
    c = claim(
        "c",
        ex("req-0", sel=mem(4000)),
        fa("req-1", sub("subReq-0", sel=mem(99000)), sub("subReq-1", 2, sel=mem(9000))),
    )
    decision = decider().decide([c], CLASSES)
    assert decision.ok and sorted(requests_of(decision)) == ["req-0", "req-1/subReq-1", "req-1/subReq-1"]


@upstream("prioritized-list-too-many-in-first-subrequest", "same")
def test_prioritized_list_too_many_in_first_subrequest() -> None:
    c = claim("c", fa("req-0", sub("subReq-0", 500, cls=CLASS_B), sub("subReq-1")))
    assert requests_of(decider().decide([c], CLASSES)) == ["req-0/subReq-1"]


@upstream("prioritized-list-max-allocation-limit-request", "same")
def test_prioritized_list_max_allocation_limit_request() -> None:
    both = [sub("subReq-0", 32, sel=mem(4000)), sub("subReq-1", 16, sel=mem(4000))]
    c = claim("c", fa("req-0", *both), fa("req-1", *both))
    decision = decider(gpus=5).decide([c], CLASSES)
    assert decision.ok and sorted(set(requests_of(decision))) == ["req-0/subReq-1", "req-1/subReq-1"]
    assert len(requests_of(decision)) == 32


def test_outcome_counts_are_the_documented_ones() -> None:
    import test_ctl_upstream_conformance_admin  # noqa: F401  (registers its cases in OUTCOMES)
    import test_ctl_upstream_conformance_devices  # noqa: F401

    doc = (Path(__file__).parents[3] / "docs" / "native-claims.md").read_text()
    found = re.search(r"same: (\d+), refused: (\d+), different: (\d+)", doc)
    assert found, "docs/native-claims.md must state the counts as 'same: N, refused: N, different: N'"
    counts = Counter(OUTCOMES.values())
    assert tuple(map(int, found.groups())) == (counts["same"], counts["refused"], counts["different"])
