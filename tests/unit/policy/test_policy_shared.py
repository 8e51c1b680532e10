"""Share placement (driver/policy/shared.py): best fit, one node, limits, groups, explanations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driver.policy.model import GpuRef, ShortReason
from driver.policy.shared import (
    ShareAmount,
    SharedGpuState,
    ShareRequest,
    place_shares,
)


def _gpus(spec: dict[str, list[tuple[int, int]]], split: int = 10) -> dict[GpuRef, SharedGpuState]:
    """node -> [(total MiB, used MiB)] with one used share per GPU that has memory in use."""
    out = {}
    for node, gpus in spec.items():
        for i, (total, used) in enumerate(gpus):
            ref = GpuRef(node, i)
            out[ref] = SharedGpuState(
                ref, ShareAmount(total, 100, split), ShareAmount(used, 0, int(used > 0))
            )
    return out


def _req(
    name: str, gpus: dict[GpuRef, SharedGpuState], mib: int, cores: int = 0, group: str = ""
) -> ShareRequest:
    return ShareRequest(name, dict.fromkeys(gpus, ShareAmount(mib, cores)), group)


def test_best_fit_picks_the_gpu_left_with_least_memory() -> None:
    gpus = _gpus({"n": [(16000, 0), (16000, 9000), (16000, 13000)]})
    placed = place_shares(gpus, [_req("r", gpus, 3000)])
    assert placed.ok and placed.choices[0].gpu == GpuRef("n", 2)
    placed = place_shares(gpus, [_req("r", gpus, 5000)])
    assert placed.choices[0].gpu == GpuRef("n", 1)


def test_node_with_tighter_fit_wins_and_empty_nodes_stay_empty() -> None:
    gpus = _gpus({"a": [(16000, 0)], "b": [(16000, 8000)]})
    placed = place_shares(gpus, [_req("r", gpus, 4000)])
    assert placed.node == "b"


def test_each_share_gets_its_best_fit_and_picks_come_back_in_request_order() -> None:
    # gpu-0 has 10000 MiB free, gpu-1 7000: the big share only fits gpu-0, the small one fits gpu-1 best.
    gpus = _gpus({"n": [(16000, 6000), (16000, 9000)]})
    placed = place_shares(gpus, [_req("small", gpus, 6000), _req("big", gpus, 10000)])
    assert placed.ok
    by = {p.request: p.gpu.gpu_index for p in placed.choices}
    assert by == {"small": 1, "big": 0}
    assert [p.request for p in placed.choices] == ["small", "big"]  # in request order


def test_group_members_never_share_a_gpu_and_backtracking_finds_the_assignment() -> None:
    gpus = _gpus({"n": [(16000, 0), (4000, 0)]})
    reqs = [_req("a", gpus, 1000, group="c"), _req("b", gpus, 3000, group="c")]
    placed = place_shares(gpus, reqs)
    assert placed.ok and len({p.gpu for p in placed.choices}) == 2
    three = [*reqs, _req("c", gpus, 10, group="c")]
    refused = place_shares(gpus, three)
    assert refused.reason == ShortReason.NO_SINGLE_NODE


def test_limits_and_explanations() -> None:
    gpus = _gpus({"n": [(16000, 0)]}, split=1)
    placed = place_shares(gpus, [_req("a", gpus, 1000), _req("b", gpus, 1000)])
    assert placed.reason == ShortReason.NO_SINGLE_NODE  # each fits alone, not both: one split slot
    gpus = _gpus({"n": [(16000, 15000)]}, split=1)
    full = place_shares(gpus, [_req("a", gpus, 2000, cores=10)])
    assert full.reason == ShortReason.NO_FREE_PLACEMENT
    assert "memory on 1" in full.message and "split slots on 1" in full.message
    assert (
        place_shares(gpus, [_req("a", gpus, 1)], node_ok=lambda n: False).reason
        == ShortReason.NO_FREE_PLACEMENT
    )


def test_stranded_memory_is_reported_when_the_last_slot_goes() -> None:
    gpus = _gpus({"n": [(16000, 1000)]}, split=2)
    placed = place_shares(gpus, [_req("a", gpus, 5000)])
    assert placed.choices[0].stranded_mib == 10000


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5000), st.integers(0, 60)), min_size=1, max_size=8),
    st.integers(1, 4),
)
def test_placements_never_exceed_any_gpu_and_stay_on_one_node(
    wanted: list[tuple[int, int, int]], split: int
) -> None:
    gpus = _gpus({"a": [(8000, 0), (6000, 0)], "b": [(12000, 0)]}, split=split)
    reqs = [
        ShareRequest(f"r{i}", dict.fromkeys(gpus, ShareAmount(mib, cores)), group=str(g))
        for i, (g, mib, cores) in enumerate(wanted)
    ]
    placed = place_shares(gpus, reqs)
    # Completeness: any one request fits an empty GPU, and requests of distinct groups that fit on the
    # 12000 MiB GPU together (memory, cores and split slots) must be placed.
    assert place_shares(gpus, reqs[:1]).ok
    fits_b = (
        len({g for g, _, _ in wanted}) == len(wanted)
        and sum(mib for _, mib, _ in wanted) <= 12000
        and sum(cores for _, _, cores in wanted) <= 100
        and len(wanted) <= split
    )
    if fits_b:
        assert placed.ok
    if not placed.ok:
        return
    assert len({p.gpu.node for p in placed.choices}) == 1 and len(placed.choices) == len(reqs)
    used = {ref: st_.used for ref, st_ in gpus.items()}
    for p in placed.choices:
        used[p.gpu] = used[p.gpu] + p.amount
    for ref, amount in used.items():
        assert gpus[ref].capacity.covers(amount)
    groups = [(r.group, p.gpu) for r, p in zip(reqs, placed.choices, strict=True)]
    assert len(set(groups)) == len(groups)
