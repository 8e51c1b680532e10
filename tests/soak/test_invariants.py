"""The soak's checker on hand-made truths: it must see each kind of violation (and nothing on a clean
state), or a soak reporting `violations: 0` would prove nothing. No control plane needed."""

from __future__ import annotations

from typing import Any

from api.constants import DRIVER_NAME
from controller.kube.writer import FINALIZER

from . import invariants, settle
from .truth import Instance, Truth

POOL = "node-1"


def claim(
    name: str, *devices: str, consumed: dict[str, str] | None = None, pod_uid: str = ""
) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DRIVER_NAME, "pool": POOL, "device": d,
         **({"consumedCapacity": consumed, "shareID": f"s-{name}-{i}"} if consumed else {})}
        for i, d in enumerate(devices)
    ]  # fmt: skip
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "finalizers": [FINALIZER]},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod_uid}] if pod_uid else [],
        },
    }


def mig(index: int, start: int, size: int) -> dict[str, Any]:
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(start, start + size)}
    return {
        "name": f"gpu-{index}-mig-1g5gb-19-{start}" if size == 1 else f"gpu-{index}-mig-2g10gb-14-{start}",
        "attributes": {"placementStart": {"int": start}, "placementSize": {"int": size}},
        "consumesCounters": [{"counterSet": f"gpu-{index}-counter-set", "counters": counters}],
    }


def slices() -> list[dict[str, Any]]:
    devices = [mig(0, 0, 1), mig(0, 0, 2), mig(0, 1, 1)]
    devices.append({"name": "gpu-0", "consumesCounters": []})
    shared_cap = {"memory": {"value": "40Gi"}, "cores": {"value": "100"}, "shares": {"value": "2"}}
    devices.append({"name": "gpu-1-shared", "allowMultipleAllocations": True, "capacity": shared_cap})
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(8)}
    spec = {
        "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
        "sharedCounters": [{"name": "gpu-0-counter-set", "counters": counters}],
    }
    return [{"spec": spec}]


def truth(*claims: dict[str, Any], pods: list[dict[str, Any]] | None = None,
          instances: list[Instance] | None = None, leaders: list[str] | None = None) -> Truth:  # fmt: skip
    return Truth(
        0.0, list(claims), slices(), pods or [], {POOL: instances or []}, {POOL: set()}, leaders or ["a"]
    )


def kinds(found: list[invariants.Violation]) -> set[str]:
    return {v.kind for v in found}


def test_clean_state_has_no_violation() -> None:
    t = truth(claim("a", "gpu-0-mig-1g5gb-19-0"), claim("b", "gpu-0-mig-1g5gb-19-1"))
    assert invariants.continuous(t) == []


def test_one_device_in_two_claims_is_seen() -> None:
    t = truth(claim("a", "gpu-0-mig-1g5gb-19-0"), claim("b", "gpu-0-mig-1g5gb-19-0"))
    assert "double-allocation" in kinds(invariants.continuous(t))


def test_overlapping_placements_and_counters_are_seen() -> None:
    t = truth(claim("a", "gpu-0-mig-2g10gb-14-0"), claim("b", "gpu-0-mig-1g5gb-19-1"))
    assert {"mig-overlap", "counter-over-use"} <= kinds(invariants.continuous(t))


def test_whole_gpu_beside_a_mig_device_is_seen() -> None:
    t = truth(claim("a", "gpu-0"), claim("b", "gpu-0-mig-1g5gb-19-1"))
    assert "whole-gpu-overlap" in kinds(invariants.continuous(t))


def test_shared_gpu_over_capacity_is_seen_and_within_is_not() -> None:
    ok = truth(
        claim("a", "gpu-1-shared", consumed={"memory": "20Gi"}),
        claim("b", "gpu-1-shared", consumed={"memory": "20Gi"}),
    )
    assert invariants.continuous(ok) == []
    over = truth(
        claim("a", "gpu-1-shared", consumed={"memory": "30Gi"}),
        claim("b", "gpu-1-shared", consumed={"memory": "20Gi"}),
    )
    assert "shared-over-capacity" in kinds(invariants.continuous(over))
    slots = truth(*(claim(n, "gpu-1-shared", consumed={"memory": "1Gi"}) for n in "abc"))
    assert "shared-over-capacity" in kinds(invariants.continuous(slots))


def test_allocation_without_the_controllers_finalizer_and_two_leaders_are_seen() -> None:
    c = claim("a", "gpu-0-mig-1g5gb-19-0")
    c["metadata"]["finalizers"] = []
    assert "allocated-not-by-flexmig" in kinds(invariants.continuous(truth(c)))
    assert "two-leaders" in kinds(invariants.continuous(truth(leaders=["a", "b"])))


def test_settled_compares_instances_with_prepared_claims() -> None:
    pod = {"metadata": {"uid": "p1", "namespace": "ns", "name": "a"}, "spec": {"nodeName": POOL},
           "status": {"phase": "Running"}}  # fmt: skip
    running = claim("a", "gpu-0-mig-1g5gb-19-0", pod_uid="p1")
    missing = settle.settled(truth(running, pods=[pod]), [POOL])
    assert kinds(missing) == {"prepared-without-instance"}
    there = Instance(POOL, 0, 0, 1, "1g.5gb")
    assert settle.settled(truth(running, pods=[pod], instances=[there]), [POOL]) == []
    orphan = Instance(POOL, 0, 3, 1, "1g.5gb")
    assert kinds(settle.settled(truth(running, pods=[pod], instances=[there, orphan]), [POOL])) == {
        "instance-without-claim"
    }
    assert "node-silent" in kinds(settle.settled(truth(), [POOL, "node-2"]))


def test_final_reports_everything_left() -> None:
    t = truth(claim("a", "gpu-0-mig-1g5gb-19-0"), instances=[Instance(POOL, 0, 0, 1, "1g.5gb")])
    assert {"left-claim", "left-allocation", "left-instance"} <= kinds(settle.final(t, "ns"))
    assert settle.final(truth(), "ns") == []
