"""Fields where controller-mode allocation used to answer differently from kube-scheduler (issue 24):
unknown selectors and constraints, distinctAttribute on a missing attribute, firstAvailable config
and order, the per-claim result limit, device taints, and messages that blamed the wrong thing."""

from __future__ import annotations

import copy
from typing import Any

from ctl_helpers import CLASS, CLASSES, claim, mem, node_slices
from shared_helpers import CLASSES as SHARED_CLASSES
from shared_helpers import any_claim, hami_body
from shared_helpers import decider as shared_decider

from controller.allocation.decide import ControllerReason, Decider
from controller.allocation.upstream import shim_generated
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.policy.allocator import PackingPolicy
from driver.policy.model import ShortReason

TAINT = {"key": "maintenance", "value": "soon", "effect": "NoSchedule"}


def _decider(slices: list[dict[str, Any]]) -> Decider:
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())


def _tainted(gpus: int, tainted: set[int], taint: dict[str, Any] = TAINT) -> Decider:
    """One A100 node whose GPUs in `tainted` have every device tainted with `taint`."""
    slices = copy.deepcopy(node_slices("n", "A100-40GB", gpus))
    for s in slices:
        for dev in s["spec"].get("devices") or ():
            if any(dev["name"].startswith(f"gpu-{i}-") or dev["name"] == f"gpu-{i}" for i in tainted):
                dev["taints"] = [taint]
    return _decider(slices)


def _gpus(decision: Any) -> set[str]:
    return {r["device"].split("-mig-")[0] for a in decision.allocations for r in a.results}


# --- unknown fields -------------------------------------------------------------------------------


def test_a_selector_without_cel_is_refused_naming_it() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    c = claim("c", exactly={"deviceClassName": CLASS, "selectors": [{"cel": {"expression": "true"}}, {}]})
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"][1] = {"future": {"x": 1}}
    decision = d.decide([c], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "spec.devices.requests[0].exactly.selectors[1]" in decision.message
    assert "future" in decision.message and "cel.expression" in decision.message


def test_a_subrequest_selector_without_cel_is_refused_naming_it() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    subs: list[dict[str, Any]] = [
        {"name": "a", "deviceClassName": CLASS},
        {"name": "b", "deviceClassName": CLASS, "selectors": [{}]},
    ]
    decision = d.decide([claim("c", first_available=subs)], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "requests[0].firstAvailable[1].selectors[0]" in decision.message


def test_an_unknown_constraint_is_refused_naming_it() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    constraints: list[dict[str, Any]] = [
        {"matchAttribute": "gpu.flexmig.dev/uuid"},
        {"requests": ["gpu"], "sameRack": "x"},
    ]
    decision = d.decide([claim("c", mem(4000), constraints=constraints)], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "spec.devices.constraints[1]" in decision.message and "sameRack" in decision.message


# --- constraints ----------------------------------------------------------------------------------


def test_distinct_attribute_missing_on_the_devices_is_unsatisfiable() -> None:
    d = _decider(node_slices("n", "A100-40GB", 2))
    distinct = [{"distinctAttribute": "gpu.flexmig.dev/nosuchattribute"}]
    decision = d.decide([claim("c", mem(4000), count=2, constraints=distinct)], CLASSES)
    assert decision.reason == ControllerReason.CONSTRAINT_UNSATISFIED
    assert "lacks the attribute" in decision.message


def test_two_shares_with_a_gpu_match_name_the_one_share_per_gpu_rule() -> None:
    d = shared_decider({"h": [16000, 16000]})
    c = claim("c", exactly=hami_body(memory=1000, count=2))
    c["spec"]["devices"]["constraints"] = [{"matchAttribute": "gpu.flexmig.dev/uuid"}]
    decision = d.decide([c], SHARED_CLASSES)
    assert decision.reason == ControllerReason.CONSTRAINT_UNSATISFIED
    assert "one share per GPU per claim" in decision.message


# --- firstAvailable -------------------------------------------------------------------------------


def test_only_the_chosen_subrequests_config_goes_into_the_result() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    subs = [
        {"name": "big", "deviceClassName": CLASS, "selectors": [{"cel": {"expression": mem(99000)}}]},
        {"name": "small", "deviceClassName": CLASS, "selectors": [{"cel": {"expression": mem(4000)}}]},
    ]

    def cfg(tag: str, requests: list[str] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"opaque": {"driver": "other.example.com", "parameters": {"tag": tag}}}
        if requests is not None:
            out["requests"] = requests
        return out

    config = [cfg("big", ["gpu/big"]), cfg("small", ["gpu/small"]), cfg("parent", ["gpu"]), cfg("all", None)]
    decision = d.decide([claim("c", first_available=subs, config=config)], CLASSES)
    assert decision.ok, decision.message
    (alloc,) = decision.allocations
    assert alloc.results[0]["request"] == "gpu/small"
    tags = [c["opaque"]["parameters"]["tag"] for c in alloc.config if c["source"] == "FromClaim"]
    assert tags == ["small", "parent", "all"]


def test_a_users_claim_takes_the_first_alternative_that_fits() -> None:
    # The shim's claims take the share here (it strands less: test_ctl_shared); a user's claim
    # without the shim label keeps its own order, as kube-scheduler does.
    d = shared_decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)})
    c = any_claim("c", 4000, hami_body(memory=4000))
    del c["metadata"]["labels"]
    decision = d.decide([c], SHARED_CLASSES)
    assert decision.ok and decision.allocations[0].results[0]["request"] == "gpus/mig"


def test_a_claim_of_a_shim_template_older_than_the_label_keeps_the_shims_order() -> None:
    # Templates the shim wrote before it labelled their claims make unlabelled claims; the pod's
    # entry still names a shim template, so the claim is the shim's (strand-least, the share).
    d = shared_decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)})
    c = any_claim("c", 4000, hami_body(memory=4000))
    del c["metadata"]["labels"]
    pod = {
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "flexmig-any-1x4000mi-c0"}]}
    }
    uids = shim_generated(pod, {"gpus": c})
    assert uids == {c["metadata"]["uid"]}
    decision = d.decide([c], SHARED_CLASSES, shim_uids=uids)
    assert decision.ok and decision.allocations[0].results[0]["request"] == "gpus/hami-core"
    # A user's template name is not a shim shape: the claim stays the user's.
    user = {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "my-gpu"}]}}
    assert shim_generated(user, {"gpus": c}) == frozenset()


# --- the per-claim result limit --------------------------------------------------------------------


def test_more_than_32_results_in_one_claim_are_refused_before_writing() -> None:
    d = _decider(node_slices("n", "A100-40GB", 8))
    c = claim("c", mem(4000), count=20)
    c["spec"]["devices"]["requests"].append(
        {"name": "more", "exactly": {"deviceClassName": CLASS, "count": 20}}
    )
    decision = d.decide([c], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "40 devices" in decision.message and "at most 32" in decision.message


def test_an_alternative_that_would_pass_32_results_is_skipped_for_one_that_does_not() -> None:
    d = _decider(node_slices("n", "A100-40GB", 8))
    subs = [
        {"name": "many", "deviceClassName": CLASS, "count": 30},
        {"name": "few", "deviceClassName": CLASS, "count": 2},
    ]
    c = claim("c", first_available=subs)
    c["spec"]["devices"]["requests"].append(
        {"name": "more", "exactly": {"deviceClassName": CLASS, "count": 10}}
    )
    decision = d.decide([c], CLASSES)
    assert decision.ok, decision.message
    assert len(decision.allocations[0].results) == 12


# --- device taints --------------------------------------------------------------------------------


def test_a_tainted_device_is_not_given_to_a_request_without_a_toleration() -> None:
    d = _tainted(2, {0})
    decision = d.decide([claim("c", mem(4000))], CLASSES)
    assert decision.ok and _gpus(decision) == {"gpu-1"}
    assert "tolerations" not in decision.allocations[0].results[0]
    every = _tainted(1, {0}).decide([claim("c", mem(4000))], CLASSES)
    assert every.reason == ControllerReason.NO_MATCHING_DEVICE and "tainted" in every.message


def test_a_tolerated_taint_allows_the_device_and_the_result_carries_the_tolerations() -> None:
    tol = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    c = claim("c", exactly={"deviceClassName": CLASS, "selectors": [{"cel": {"expression": mem(4000)}}]})
    c["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [tol]
    decision = _tainted(1, {0}).decide([c], CLASSES)
    assert decision.ok, decision.message
    assert decision.allocations[0].results[0]["tolerations"] == [tol]


def test_tolerations_must_match_key_value_and_effect() -> None:
    wrong = [
        {"key": "maintenance", "operator": "Equal", "value": "later", "effect": "NoSchedule"},
        {"key": "other", "operator": "Exists"},
        {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"},
    ]
    for tol in wrong:
        c = claim("c", mem(4000))
        c["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [tol]
        assert _tainted(1, {0}).decide([c], CLASSES).reason == ControllerReason.NO_MATCHING_DEVICE, tol
    right = {"key": "maintenance", "operator": "Equal", "value": "soon"}
    c = claim("c", mem(4000))
    c["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [right]
    assert _tainted(1, {0}).decide([c], CLASSES).ok


def test_a_taint_with_effect_none_is_informational() -> None:
    d = _tainted(1, {0}, {"key": "note", "value": "x", "effect": "None"})
    assert d.decide([claim("c", mem(4000))], CLASSES).ok


def test_a_bad_toleration_is_refused_naming_it() -> None:
    c = claim("c", mem(4000))
    c["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [{"key": "k", "operator": "In"}]
    decision = _tainted(1, set()).decide([c], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "requests[0].exactly.tolerations[0].operator" in decision.message


# --- messages -------------------------------------------------------------------------------------


def test_allocation_mode_all_message_does_not_blame_mig_for_every_class() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    decision = d.decide([claim("c", exactly={"deviceClassName": CLASS, "allocationMode": "All"})], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "not supported for MIG devices" not in decision.message and "ExactCount" in decision.message


def test_one_node_cluster_says_the_requests_do_not_fit_together() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    c = claim("c", mem(20000), count=2)
    decision = d.decide([c], CLASSES)
    assert decision.reason == ShortReason.NO_SINGLE_NODE
    assert "no single node takes them all" not in decision.message
    assert "fits on node n alone, but not all of them together" in decision.message


# --- consumable capacity on a dedicated device ----------------------------------------------------


def test_capacity_on_a_dedicated_mig_device_is_a_filter() -> None:
    d = _decider(node_slices("n", "A100-40GB", 1))
    c = claim("c", exactly={"deviceClassName": CLASS, "capacity": {"requests": {"memory": "9000Mi"}}})
    decision = d.decide([c], CLASSES)
    assert decision.ok, decision.message
    (result,) = decision.allocations[0].results
    assert "-mig-2g10gb-" in result["device"]  # the least MIG device holding 9000 MiB
    assert "consumedCapacity" not in result and "shareID" not in result
    too_big = claim("c", exactly={"deviceClassName": CLASS, "capacity": {"requests": {"memory": "99Gi"}}})
    assert d.decide([too_big], CLASSES).reason == ControllerReason.NO_MATCHING_DEVICE


def test_a_capacity_request_on_mig_devices_has_a_pod_size() -> None:
    # Sized like the selector it becomes (controller/claims/resultconfig.py `dedicated`), not unknown.
    from controller.allocation.podsize import pod_size

    d = _decider(node_slices("n", "A100-40GB", 1))
    c = claim("c", exactly={"deviceClassName": CLASS, "capacity": {"requests": {"memory": "9000Mi"}}})
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": "c", "resourceClaimName": "c"}]},
    }
    size = pod_size(pod, {"ns/c": c}, CLASSES, d.index)
    assert size is not None and size.devices == 1 and size.memory_mib >= 9000


def test_a_class_selector_without_cel_is_refused_naming_the_class() -> None:
    classes = {CLASS: {"metadata": {"name": CLASS}, "spec": {"selectors": [{"future": {}}]}}}
    decision = _decider(node_slices("n", "A100-40GB", 1)).decide([claim("c", mem(4000))], classes)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert f"DeviceClass {CLASS} spec.selectors[0]" in decision.message
