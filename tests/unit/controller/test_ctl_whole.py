"""Whole-GPU requests (class gpu.flexmig.dev): idle GPUs only, exclusive with MIG, one node per pod."""

from __future__ import annotations

import random
from typing import Any

from ctl_helpers import CLASSES, catalogs, claim, mem

from api.constants import DRIVER_NAME
from controller.allocation.decide import ControllerReason, Decider, Decision
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.policy.allocator import PackingPolicy
from driver.policy.model import GpuRef, ShortReason
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

WHOLE = "gpu.flexmig.dev"
MIG = "mig.gpu.flexmig.dev"


def _class(name: str, kind: str) -> dict[str, Any]:
    expr = f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].type == "{kind}"'
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


ALL_CLASSES: dict[str, Any] = {**CLASSES, WHOLE: _class(WHOLE, "gpu"), MIG: _class(MIG, "mig")}


def _decider(nodes: dict[str, tuple[str, int, bool]]) -> Decider:
    """node -> (model, GPUs, MIG mode on); Ampere with MIG off publishes its whole GPU only."""
    slices = []
    for node, (model, n, mig_on) in nodes.items():
        built = build_node_slices(
            catalogs(model, n, node),
            node,
            1,
            NodeConfig(node, OperatingMode.MIG),
            dict.fromkeys(range(n), mig_on),
        )
        slices += [s.body for s in built.slices]
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())


def _whole(name: str, count: int = 1, selector: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": WHOLE, "count": count}
    if selector:
        body["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}},
    }


def _mig(name: str, mib: int) -> dict[str, Any]:
    c = claim(name, mem(mib))
    c["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = MIG
    return c


def _commit(d: Decider, decision: Decision) -> None:
    assert decision.ok, decision.message
    for alloc in decision.allocations:
        d.ledger.assume(alloc.uid, alloc.keys)


def _devices(decision: Decision) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for a in decision.allocations for r in a.results]


def test_whole_gpu_result_names_the_device_and_the_ledger_counts_it() -> None:
    d = _decider({"h": ("H100-80GB", 1, True)})
    decision = d.decide([_whole("w")], ALL_CLASSES)
    assert decision.ok and decision.node == "h"
    (alloc,) = decision.allocations
    assert alloc.results == [{"request": "gpu", "driver": DRIVER_NAME, "pool": "h", "device": "gpu-0"}]
    _commit(d, decision)
    assert d.ledger.cluster.gpu(GpuRef("h", 0)).whole_gpu_taken
    # MIG refused on the whole-taken GPU, whole GPU refused twice; both come back once it is freed.
    assert d.decide([_mig("m", 4000)], ALL_CLASSES).reason == ShortReason.NO_FREE_PLACEMENT
    again = d.decide([_whole("w2")], ALL_CLASSES)
    assert again.reason == ShortReason.NO_FREE_PLACEMENT and "none of the 1 GPUs" in again.message
    d.ledger.forget("uid-w")
    assert not d.ledger.cluster.gpu(GpuRef("h", 0)).whole_gpu_taken
    assert d.decide([_mig("m", 4000)], ALL_CLASSES).ok


def test_whole_gpu_only_on_idle_gpus() -> None:
    d = _decider({"h": ("H100-80GB", 2, True)})
    first = d.decide([_mig("m", 4000)], ALL_CLASSES)
    _commit(d, first)
    (mig_device,) = _devices(first)
    busy = mig_device[1].split("-mig-")[0]
    decision = d.decide([_whole("w")], ALL_CLASSES)
    assert decision.ok
    (whole,) = _devices(decision)
    assert whole[1] != busy and whole[1] in ("gpu-0", "gpu-1")
    _commit(d, decision)
    # The other GPU holds a 1g instance: not idle, so no whole GPU is left.
    nothing = d.decide([_whole("w2")], ALL_CLASSES)
    assert nothing.reason == ShortReason.NO_FREE_PLACEMENT
    assert "none of the 2 GPUs" in nothing.message


def test_pod_with_whole_and_mig_claims_lands_on_one_node_on_different_gpus() -> None:
    # Node a has no whole device (Ampere in MIG mode); h has two H100s, one already holding an instance.
    d = _decider({"a": ("A100-40GB", 1, True), "h": ("H100-80GB", 2, True)})
    _commit(d, d.decide([_mig("pre", 4000)], ALL_CLASSES, node_ok=lambda n: n == "h"))
    decision = d.decide([_whole("w"), _mig("m", 4000)], ALL_CLASSES)
    assert decision.ok and decision.node == "h"
    whole, mig = (alloc.results[0]["device"] for alloc in decision.allocations)
    assert mig.split("-mig-")[0] != whole
    _commit(d, decision)
    # Both GPUs of h are now busy: a second pod of that shape has no node.
    assert d.decide([_whole("w2"), _mig("m2", 4000)], ALL_CLASSES).reason == ShortReason.NO_FREE_PLACEMENT


def test_mig_devices_that_took_the_idle_gpu_are_moved_for_the_whole_gpu() -> None:
    # Both H100s idle; the MIG policy alone puts the 1g on gpu-0, the only GPU the whole request admits.
    d = _decider({"h": ("H100-80GB", 2, True)})
    alone = d.decide([_mig("probe", 4000)], ALL_CLASSES)
    assert alone.ok and _devices(alone)[0][1].startswith("gpu-0-mig-")
    only0 = f'device.attributes["{DRIVER_NAME}"].index == 0'
    decision = d.decide([_mig("m", 4000), _whole("w", selector=only0)], ALL_CLASSES)
    assert decision.ok, decision.message
    mig, whole = (alloc.results[0]["device"] for alloc in decision.allocations)
    assert whole == "gpu-0" and mig.startswith("gpu-1-mig-")


def test_count_two_whole_gpus_best_fit_node() -> None:
    d = _decider({"big": ("H100-80GB", 4, True), "small": ("H100-80GB", 2, True)})
    decision = d.decide([_whole("w", count=2)], ALL_CLASSES)
    assert decision.ok and decision.node == "small"  # same cost; the node left with fewer idle GPUs
    assert sorted(_devices(decision)) == [("small", "gpu-0"), ("small", "gpu-1")]
    _commit(d, decision)
    three = d.decide([_whole("w3", count=3)], ALL_CLASSES)
    assert three.ok and {p for p, _ in _devices(three)} == {"big"}
    _commit(d, three)
    two = d.decide([_whole("w4", count=2)], ALL_CLASSES)
    assert two.reason == ShortReason.NO_SINGLE_NODE  # one idle GPU left, on "big"


def test_gpu_without_mig_devices_is_taken_first() -> None:
    # An A100 with MIG off publishes its whole GPU only: taking it costs MIG placements nothing.
    d = _decider({"h": ("H100-80GB", 1, True), "z": ("A100-40GB", 2, False)})
    decision = d.decide([_whole("w")], ALL_CLASSES)
    assert decision.ok and _devices(decision) == [("z", "gpu-0")]


def test_selectors_narrow_the_whole_gpus() -> None:
    d = _decider({"h": ("H100-80GB", 1, True), "z": ("A100-40GB", 1, False)})
    sel = f'device.attributes["{DRIVER_NAME}"].model.startsWith("H100")'
    decision = d.decide([_whole("w", selector=sel)], ALL_CLASSES)
    assert decision.ok and _devices(decision) == [("h", "gpu-0")]
    none = d.decide(
        [_whole("w", selector=f'device.attributes["{DRIVER_NAME}"].model == "B200"')], ALL_CLASSES
    )
    assert none.reason == ControllerReason.NO_MATCHING_DEVICE


def test_first_available_falls_through_to_a_whole_gpu_and_mig_matching_selectors_stay_mig() -> None:
    d = _decider({"h": ("H100-80GB", 1, True)})
    subs: list[dict[str, Any]] = [
        {"name": "huge", "deviceClassName": MIG, "selectors": [{"cel": {"expression": mem(900000)}}]},
        {"name": "whole", "deviceClassName": WHOLE},
    ]
    decision = d.decide([claim("c", first_available=subs)], ALL_CLASSES)
    assert decision.ok and decision.allocations[0].results[0]["request"] == "gpu/whole"
    assert decision.allocations[0].results[0]["device"] == "gpu-0"
    # A class admitting MIG and whole devices alike keeps today's behaviour: a MIG device.
    both = d.decide([claim("b", mem(4000))], ALL_CLASSES)
    assert both.ok and "-mig-" in both.allocations[0].results[0]["device"]


def test_capacity_requests_on_whole_gpus_are_a_filter() -> None:
    # As upstream treats a device without allowMultipleAllocations: its capacity must hold the request.
    d = _decider({"h": ("H100-80GB", 1, True)})
    c = _whole("w")
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "1Gi"}}
    decision = d.decide([c], ALL_CLASSES)
    assert decision.ok and "consumedCapacity" not in decision.allocations[0].results[0]
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "999Gi"}}
    assert d.decide([c], ALL_CLASSES).reason == ControllerReason.NO_MATCHING_DEVICE


def test_node_filter_applies_to_whole_gpus() -> None:
    d = _decider({"a": ("H100-80GB", 1, True), "b": ("H100-80GB", 1, True)})
    decision = d.decide([_whole("w")], ALL_CLASSES, node_ok=lambda n: n == "b")
    assert decision.node == "b"
    refused = d.decide([_whole("w")], ALL_CLASSES, node_ok=lambda n: False)
    assert refused.reason == ShortReason.NO_FREE_PLACEMENT


def test_random_whole_and_mig_pods_never_share_a_gpu_and_idle_gpus_are_never_refused() -> None:
    rng = random.Random(7)
    d = _decider({"h": ("H100-80GB", 3, True), "z": ("A100-40GB", 2, False), "a": ("A100-40GB", 2, True)})
    live: list[str] = []
    for step in range(120):
        if live and rng.random() < 0.3:
            d.ledger.forget(live.pop(rng.randrange(len(live))))
            continue
        idle_before = len(d.ledger.idle_gpus().refs)
        if rng.random() < 0.4:
            decision = d.decide([_whole(f"w{step}")], ALL_CLASSES)
            # Completeness: a single unconstrained whole GPU is refused only when no GPU is idle.
            assert decision.ok == (idle_before > 0), decision.message
        else:
            decision = d.decide([_mig(f"m{step}", rng.choice([4000, 19000, 39000]))], ALL_CLASSES)
        if not decision.ok:
            continue
        _commit(d, decision)
        live.append(f"uid-{decision.allocations[0].claim['metadata']['name']}")
        for gpu in d.ledger.inventory.gpus.values():
            whole_held = gpu.whole_device is not None and d.ledger.is_used((gpu.pool, gpu.whole_device))
            mig_held = any(d.ledger.is_used((gpu.pool, name)) for name in gpu.mig_devices.values())
            assert not (whole_held and mig_held), f"{gpu.ref}: whole GPU and MIG devices both allocated"
            if gpu.whole_device is not None and gpu.mig_devices:
                # Where MIG devices are published too, the whole device consumes every slice counter, so
                # the counters alone admit it again exactly when nothing on the GPU is held.
                whole = d.ledger.inventory.device((gpu.pool, gpu.whole_device))
                assert whole is not None and whole.consumes
                free = d.ledger.counters_allow([whole]) is None
                assert free == (not whole_held and not mig_held), f"{gpu.ref}: counters disagree"
        for (pool, counter_set), used in d.ledger.consumed.items():
            available = d.ledger.inventory.pools[pool].counter_sets[counter_set]
            assert all(v <= available.get(k, 0) for k, v in used.items())
