"""The whole-GPU policy: cheapest MIG loss first, best-fit node, exact matching, reasons."""

from __future__ import annotations

from driver.policy.model import GpuRef, ShortReason
from driver.policy.whole import IdleGpu, IdleGpus, WholeRequest, place_on_node, place_whole


def _idle(*gpus: tuple[str, int, float]) -> IdleGpus:
    return IdleGpus(IdleGpu(GpuRef(n, i), c) for n, i, c in gpus)


def _refs(*gpus: tuple[str, int]) -> frozenset[GpuRef]:
    return frozenset(GpuRef(n, i) for n, i in gpus)


def test_cheapest_gpu_then_lowest_index_on_a_node() -> None:
    idle = _idle(("n", 0, 0.5), ("n", 1, 0.0), ("n", 2, 0.0))
    req = WholeRequest("r", _refs(("n", 0), ("n", 1), ("n", 2)))
    placement = place_whole(idle, [req])
    assert [p.gpu for p in placement.choices] == [GpuRef("n", 1)]


def test_cost_before_best_fit_before_name() -> None:
    everywhere = _refs(("a", 0), ("b", 0), ("b", 1), ("c", 0), ("c", 1))
    req = WholeRequest("r", everywhere)
    # b and c cost the same and are both left with one idle GPU: the name decides.
    same = _idle(("b", 0, 0.1), ("b", 1, 0.1), ("c", 0, 0.1), ("c", 1, 0.1), ("a", 0, 0.9))
    assert place_whole(same, [req]).node == "b"
    fitted = _idle(("b", 0, 0.1), ("b", 1, 0.1), ("c", 0, 0.1), ("a", 0, 0.9))
    assert place_whole(fitted, [req]).node == "c"  # c is left with no idle GPU, b with one
    cheap = _idle(("b", 0, 0.1), ("c", 0, 0.1), ("a", 0, 0.0))
    assert place_whole(cheap, [req]).node == "a"


def test_requests_with_different_selectors_are_matched_exactly() -> None:
    idle = _idle(("n", 0, 0.0), ("n", 1, 0.0))
    wide = WholeRequest("wide", _refs(("n", 0), ("n", 1)))
    narrow = WholeRequest("narrow", _refs(("n", 0)))
    hit = place_on_node(idle, [wide, narrow], "n")
    assert hit is not None
    assert {p.request: p.gpu.gpu_index for p in hit[1]} == {"wide": 1, "narrow": 0}
    assert place_on_node(idle, [narrow, WholeRequest("n2", _refs(("n", 0)))], "n") is None
    assert place_on_node(idle, [wide], "n", exclude=_refs(("n", 0), ("n", 1))) is None


def test_reasons() -> None:
    idle = _idle(("a", 0, 0.0), ("b", 0, 0.0))
    busy = WholeRequest("busy", _refs(("c", 0)))
    placement = place_whole(idle, [busy])
    assert placement.reason is ShortReason.NO_FREE_PLACEMENT and "busy" in placement.message
    two = [WholeRequest(f"r{i}", _refs(("a", 0), ("b", 0))) for i in range(2)]
    assert place_whole(idle, two).reason is ShortReason.NO_SINGLE_NODE
    assert place_whole(idle, two[:1], node_ok=lambda n: n == "b").node == "b"
