"""Random allocate/release sequences never overlap placements and never exceed a published counter."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from ctl_helpers import CLASSES, claim, decider, mem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.decide import Decider

MEMORIES = (4000, 9000, 19000, 30000, 39000, 70000)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.sampled_from(MEMORIES), st.integers(1, 3)),
        st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
    ),
    max_size=40,
)


def _check(d: Decider) -> None:
    inv = d.ledger.inventory
    per_gpu: dict[object, int] = defaultdict(int)
    used: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for key in d.ledger.owners:
        dev = inv.device((key[0], key[1]))  # a share (ShareUse) would name its device too
        assert dev is not None
        if dev.start is not None and dev.size is not None:
            mask = ((1 << dev.size) - 1) << dev.start
            assert per_gpu[dev.gpu] & mask == 0, f"overlapping placement {key}"
            per_gpu[dev.gpu] |= mask
        for counter_set, counters in dev.consumes:
            for name, value in counters:
                used[(dev.pool, counter_set)][name] += value
    for (pool, counter_set), totals in used.items():
        available = inv.pools[pool].counter_sets[counter_set]
        for name, value in totals.items():
            assert value <= available[name], f"{pool}/{counter_set}/{name} exceeded"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_allocate_release_respects_placements_and_counters(
    sequence: list[tuple[str, int, int]],
) -> None:
    d = decider({"a": ("A100-40GB", 2), "h": ("H100-80GB", 1), "r": ("RTX-PRO-6000", 1)})
    live: list[str] = []
    for i, (op, value, count) in enumerate(sequence):
        if op == "alloc":
            decision = d.decide([claim(f"c{i}", mem(value), count=count)], CLASSES)
            if not live and count == 1:
                # Completeness: every memory size fits some GPU of an empty cluster (up to 96 GB).
                assert decision.ok, decision.message
            for alloc in decision.allocations:
                d.ledger.assume(alloc.uid, alloc.keys)
                d.ledger.observe(alloc.uid, alloc.keys)
                live.append(alloc.uid)
        elif live:
            d.ledger.forget(live.pop(value % len(live)))
        _check(d)
