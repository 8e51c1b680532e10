"""DeviceTaintRules in controller mode (controller/state/taintrules.py): a rule's taint is on the devices
it selects, as kube-scheduler sees them, so an untolerating request is not allocated there; the loop
rebuilds its inventory when a rule changes; the cache watches rules only where the API serves them."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from ctl_helpers import CLASS, CLASSES, claim, node_slices
from kubernetes.client.exceptions import ApiException

from controller.allocation.decide import ControllerReason, Decider
from controller.allocation.loop import Controller
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.kube.store import Event
from controller.kube.watchcache import OptionalList, WatchCache
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from controller.state.taintrules import with_taint_rules
from driver.policy.allocator import PackingPolicy

DRIVER = "gpu.flexmig.dev"
TOL = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}


def _rule(name: str, effect: str = "NoSchedule", **selector: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-12-05T00:00:00Z"},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "maintenance", "value": "gpu0", "effect": effect},
        },
    }


def _decide(rules: list[dict[str, Any]], request: dict[str, Any]) -> Any:
    inventory = Inventory(with_taint_rules(node_slices("n", "A100-40GB", 1), rules))
    d = Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())
    return d.decide([claim("c", exactly=request)], CLASSES)


def _taints(slices: list[Any]) -> dict[str, list[Any]]:
    return {d["name"]: d.get("taints", []) for s in slices for d in s["spec"].get("devices") or ()}


def test_a_rule_taints_the_devices_it_selects_only() -> None:
    slices = node_slices("n", "A100-40GB", 2)
    out = _taints(
        with_taint_rules(slices, [_rule("r", driver=DRIVER, pool="n", device="gpu-1-mig-7g40gb-0-0")])
    )
    assert out["gpu-1-mig-7g40gb-0-0"] == [
        {"key": "maintenance", "value": "gpu0", "effect": "NoSchedule", "timeAdded": "2026-12-05T00:00:00Z"}
    ]
    assert sum(1 for t in out.values() if t) == 1
    assert all(not t for t in _taints(slices).values())  # the cache's slices are not changed


def test_a_rule_for_another_driver_or_pool_taints_nothing() -> None:
    slices = node_slices("n", "A100-40GB", 1)
    for rule in (_rule("a", driver="other.example.com"), _rule("b", pool="elsewhere")):
        assert with_taint_rules(slices, [rule]) == slices


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_an_untolerated_rule_taint_keeps_the_device_from_being_allocated(effect: str) -> None:
    request = {"deviceClassName": CLASS, "count": 1}
    decision = _decide([_rule("r", effect, driver=DRIVER)], request)
    assert decision.reason == ControllerReason.NO_MATCHING_DEVICE
    assert "maintenance" in decision.message


def test_a_tolerated_rule_taint_is_allocated_with_the_tolerations() -> None:
    request = {"deviceClassName": CLASS, "count": 1, "tolerations": [TOL]}
    decision = _decide([_rule("r", pool="n")], request)
    assert decision.ok and decision.allocations[0].results[0]["tolerations"] == [TOL]


def test_an_informational_rule_taint_does_not_block() -> None:
    assert _decide([_rule("r", "None")], {"deviceClassName": CLASS, "count": 1}).ok


def test_the_loop_rebuilds_its_inventory_when_a_rule_changes() -> None:
    names = ("resourceslices", "resourceclaims", "deviceclasses", "pods", "nodes", "devicetaintrules")
    cache = WatchCache({n: lambda **_: None for n in names})
    ctl = Controller(cache, None, catch_up=False)  # type: ignore[arg-type]
    ctl.apply(
        [
            Event("nodes", "REPLACE", items=({"metadata": {"name": "n"}, "spec": {}},)),
            Event("deviceclasses", "REPLACE", items=tuple(CLASSES.values())),
            Event("resourceslices", "REPLACE", items=tuple(node_slices("n", "A100-40GB", 1))),
            Event("devicetaintrules", "REPLACE", items=()),
        ]
    )
    assert not any(
        d.raw.get("taints") for p in ctl.ledger.inventory.pools.values() for d in p.devices.values()
    )
    rule = _rule("r", driver=DRIVER) | {"metadata": {"name": "r", "resourceVersion": "5"}}
    ctl.apply([Event("devicetaintrules", "ADDED", obj=rule)])
    devices = [d for p in ctl.ledger.inventory.pools.values() for d in p.devices.values()]
    assert devices and all(d.raw.get("taints") for d in devices)


def test_rules_list_empty_where_the_api_does_not_serve_them() -> None:
    def not_served(**_: Any) -> Any:
        raise ApiException(status=404)

    stop = threading.Event()
    optional = OptionalList(not_served, stop)
    assert json.loads(optional(limit=500).data)["items"] == []  # 1.34 .. 1.36: the cache syncs, empty
    stop.set()  # the watch waits for the next probe (not at all once stopped), then asks for a relist
    with pytest.raises(ApiException) as gone:
        optional(watch=True, resource_version="")
    assert gone.value.status == 410

    def broken(**_: Any) -> Any:
        raise ApiException(status=503)

    with pytest.raises(ApiException):
        OptionalList(broken, stop)(limit=500)  # any other error is the reflector's to retry
    served = SimpleNamespace(data=b'{"items": [], "metadata": {"resourceVersion": "7"}}')
    assert OptionalList(lambda **_: served, stop)(limit=500) is served


def test_the_reflector_syncs_an_unserved_resource_as_empty() -> None:
    def not_served(**_: Any) -> Any:
        raise ApiException(status=404)

    cache = WatchCache({"devicetaintrules": OptionalList(not_served)})
    reflector = cache.reflectors[0]
    reflector._list()
    event = cache.events.get_nowait()
    assert event.kind == "REPLACE" and event.items == ()
