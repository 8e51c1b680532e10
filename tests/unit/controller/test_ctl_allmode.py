"""allocationMode All (controller/allocation/allmode.py): every matching whole GPU of the chosen node,
as upstream; refused, naming the field, where the selectors admit MIG devices or shares."""

from __future__ import annotations

from typing import Any

from test_ctl_whole import ALL_CLASSES, MIG, WHOLE, _commit, _decider, _mig

from controller.allocation.decide import ControllerReason


def _all(name: str, cls: str = WHOLE) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": cls, "allocationMode": "All"}}]
            }
        },
    }


def test_all_whole_gpus_of_the_node_are_allocated() -> None:
    d = _decider({"h": ("H100-80GB", 2, True)})
    decision = d.decide([_all("c")], ALL_CLASSES)
    assert decision.ok, decision.message
    assert sorted(r["device"] for r in decision.allocations[0].results) == ["gpu-0", "gpu-1"]
    assert {r["request"] for r in decision.allocations[0].results} == {"gpus"}


def test_all_fails_when_one_matching_gpu_is_in_use() -> None:
    # upstream all-devices-some-allocated: a request for all devices cannot take fewer.
    d = _decider({"h": ("H100-80GB", 2, True)})
    _commit(d, d.decide([_mig("m", 9000)], ALL_CLASSES))
    decision = d.decide([_all("c")], ALL_CLASSES)
    assert decision.reason == ControllerReason.NO_MATCHING_DEVICE
    assert "cannot take fewer" in decision.message


def test_all_takes_the_node_the_filter_allows() -> None:
    d = _decider({"a": ("H100-80GB", 1, True), "b": ("H100-80GB", 2, True)})
    decision = d.decide([_all("c")], ALL_CLASSES, node_ok=lambda n: n == "b")
    assert decision.ok and decision.node == "b" and len(decision.allocations[0].results) == 2


def test_all_falls_through_to_the_next_alternative() -> None:
    # upstream prioritized-list-allocation-mode-all: the All subrequest fails, the next one is taken.
    d = _decider({"h": ("H100-80GB", 1, True)})
    _commit(d, d.decide([_mig("m", 9000)], ALL_CLASSES))
    c = _all("c")
    c["spec"]["devices"]["requests"][0] = {
        "name": "gpus",
        "firstAvailable": [
            {"name": "all", "deviceClassName": WHOLE, "allocationMode": "All"},
            {"name": "one", "deviceClassName": MIG, "count": 1},
        ],
    }
    decision = d.decide([c], ALL_CLASSES)
    assert decision.ok and decision.allocations[0].results[0]["request"] == "gpus/one"


def test_all_on_mig_devices_is_refused_naming_the_field() -> None:
    d = _decider({"h": ("H100-80GB", 1, True)})
    decision = d.decide([_all("c", MIG)], ALL_CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "requests[gpus].allocationMode All" in decision.message and "ExactCount" in decision.message
    assert "not supported for MIG devices" not in decision.message
