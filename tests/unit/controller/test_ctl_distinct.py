"""distinctAttribute over MIG devices: `nvidia.com/gpu: N` (the shim's parentUUID constraint) means N
different GPUs. The packing policy would put them on one GPU; the controller must retry, not refuse."""

from __future__ import annotations

from ctl_helpers import CLASSES, claim, decider, mem

from controller.allocation.decide import ControllerReason

DISTINCT = [{"requests": ["gpu"], "distinctAttribute": "gpu.flexmig.dev/parentUUID"}]


def _gpus(decision: object) -> list[str]:
    return [r["device"].split("-mig-")[0] for r in decision.allocations[0].results]  # type: ignore[attr-defined]


def test_n_devices_land_on_n_gpus() -> None:
    for gpus, count in ((2, 2), (3, 3), (4, 2)):
        d = decider({"n": ("A100-40GB", gpus)})
        decision = d.decide([claim("c", mem(4000), count=count, constraints=DISTINCT)], CLASSES)
        assert decision.ok, decision.message
        assert len(set(_gpus(decision))) == count


def test_more_devices_than_gpus_waits_with_the_reason() -> None:
    d = decider({"n": ("A100-40GB", 2)})
    decision = d.decide([claim("c", mem(4000), count=3, constraints=DISTINCT)], CLASSES)
    assert not decision.ok and decision.reason == ControllerReason.CONSTRAINT_UNSATISFIED
    assert "distinctAttribute gpu.flexmig.dev/parentUUID" in decision.message


def test_the_node_with_enough_gpus_is_found() -> None:
    d = decider({"a": ("A100-40GB", 1), "b": ("A100-40GB", 2)})
    decision = d.decide([claim("c", mem(4000), count=2, constraints=DISTINCT)], CLASSES)
    assert decision.ok and decision.node == "b" and len(set(_gpus(decision))) == 2


def test_without_the_constraint_devices_may_share_a_gpu() -> None:
    d = decider({"n": ("A100-40GB", 2)})
    decision = d.decide([claim("c", mem(4000), count=2)], CLASSES)
    assert decision.ok and len(set(_gpus(decision))) == 1  # packing: why the constraint is needed
