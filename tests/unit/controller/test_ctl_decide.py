"""Policy integration: published slices -> inventory -> CEL candidates -> policy -> allocation results."""

from __future__ import annotations

from ctl_helpers import CLASSES, claim, decider, mem, node_slices

from controller.allocation.decide import ControllerReason, Decision
from controller.state.inventory import Inventory
from driver.catalog.simulated import simulated_catalog
from driver.policy.model import ShortReason


def _commit(d: object, decision: Decision) -> None:
    assert decision.ok, decision.message
    for alloc in decision.allocations:
        d.ledger.assume(alloc.uid, alloc.keys)  # type: ignore[attr-defined]


def test_inventory_rebuilds_the_catalog_from_published_devices() -> None:
    for model in ("A100-40GB", "H100-80GB", "A30-24GB", "RTX-PRO-6000"):
        inv = Inventory(node_slices("n", model, 1))
        (gpu,) = inv.gpus.values()
        real = simulated_catalog(model)
        assert gpu.catalog.model == real.model
        assert (gpu.catalog.memory_slices, gpu.catalog.compute_slices) == (
            real.memory_slices,
            real.compute_slices,
        )
        got = {
            (p.name, p.gi_profile_id, p.memory_mib, p.placements, p.instance_count)
            for p in gpu.catalog.profiles
        }
        want = {
            (p.name, p.gi_profile_id, p.memory_mib, p.placements, p.instance_count) for p in real.profiles
        }
        assert got == want


def test_memory_selector_picks_the_least_wasteful_model_and_writes_results() -> None:
    d = decider({"a100": ("A100-40GB", 1), "h100": ("H100-80GB", 1)})
    decision = d.decide([claim("c", mem(4000))], CLASSES)
    assert decision.ok and decision.node == "a100"
    (alloc,) = decision.allocations
    (result,) = alloc.results
    assert result["driver"] == "gpu.flexmig.dev" and result["pool"] == "a100"
    assert result["device"].startswith("gpu-0-mig-1g5gb-")
    assert alloc.config == [
        {
            "source": "FromClass",
            "requests": ["gpu"],
            "opaque": {"driver": "gpu.flexmig.dev", "parameters": {"from": "class"}},
        }
    ]


def test_profile_selector_pins_the_profile() -> None:
    d = decider({"a100": ("A100-40GB", 1)})
    decision = d.decide([claim("c", 'device.attributes["gpu.flexmig.dev"].profile == "3g.20gb"')], CLASSES)
    assert decision.ok
    # 3g on an empty A100 goes to start 4, keeping the 4g placeable (the policy's rule).
    assert decision.allocations[0].results[0]["device"] == "gpu-0-mig-3g20gb-9-4"


def test_count_and_match_attribute_keep_devices_on_one_gpu() -> None:
    d = decider({"n": ("A100-40GB", 2)})
    _commit(d, d.decide([claim("first", mem(4000), count=2)], CLASSES))
    c = claim("c", mem(4000), count=3, constraints=[{"matchAttribute": "gpu.flexmig.dev/parentUUID"}])
    decision = d.decide([c], CLASSES)
    assert decision.ok
    gpus = {r["device"].split("-mig-")[0] for r in decision.allocations[0].results}
    assert len(decision.allocations[0].results) == 3 and len(gpus) == 1


def test_first_available_falls_through_in_order() -> None:
    d = decider({"n": ("A100-40GB", 1)})
    subs = [
        {
            "name": "huge",
            "deviceClassName": "mig.gpu.flexmig.dev",
            "selectors": [{"cel": {"expression": mem(90000)}}],
        },
        {
            "name": "small",
            "deviceClassName": "mig.gpu.flexmig.dev",
            "selectors": [{"cel": {"expression": mem(4000)}}],
        },
    ]
    decision = d.decide([claim("c", first_available=subs)], CLASSES)
    assert decision.ok and decision.allocations[0].results[0]["request"] == "gpu/small"


def test_unplaceable_pod_gets_the_short_reason() -> None:
    d = decider({"n": ("A100-40GB", 1)})
    _commit(d, d.decide([claim("all", mem(30000))], CLASSES))
    decision = d.decide([claim("more", mem(30000))], CLASSES)
    assert decision.reason == ShortReason.NO_FREE_PLACEMENT
    nothing = d.decide([claim("big", mem(90000))], CLASSES)
    assert nothing.reason == ControllerReason.NO_MATCHING_DEVICE and "big" in nothing.message


def test_invalid_requests_name_the_field() -> None:
    d = decider({"n": ("A100-40GB", 1)})
    bad = claim("c", mem(4000))
    bad["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    decision = d.decide([bad], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST and "allocationMode" in decision.message
    missing = claim("c", mem(4000))
    missing["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nope"
    assert "does not exist" in d.decide([missing], CLASSES).message
    broken = claim("c", "device.driver ==")
    assert d.decide([broken], CLASSES).reason == ControllerReason.INVALID_REQUEST


def test_two_claims_of_one_pod_land_on_one_node_or_nowhere() -> None:
    d = decider({"a": ("A100-40GB", 1), "b": ("A100-40GB", 1)})
    first = d.decide([claim("x", mem(19000))], CLASSES)  # a 3g.20gb on one node
    _commit(d, first)
    # An A100-40GB holds two 3g.20gb: x's node has room for one more, so p and q together must both go
    # to the other node (one each on two nodes would be two nodes for one pod).
    decision = d.decide([claim("p", mem(19000)), claim("q", mem(19000))], CLASSES)
    assert decision.ok, decision.message
    pools = {r["pool"] for a in decision.allocations for r in a.results}
    assert len(pools) == 1 and len(decision.allocations) == 2
    assert pools.isdisjoint({r["pool"] for a in first.allocations for r in a.results})
    # Three need three 3g.20gb on one node: no node has that, so nothing is allocated.
    three = d.decide([claim("r", mem(19000)), claim("s", mem(19000)), claim("t", mem(19000))], CLASSES)
    assert not three.ok and not three.allocations and three.reason


def test_node_filter_excludes_nodes() -> None:
    d = decider({"a": ("A100-40GB", 1), "b": ("A100-40GB", 1)})
    decision = d.decide([claim("c", mem(4000))], CLASSES, node_ok=lambda n: n == "b")
    assert decision.node == "b"
