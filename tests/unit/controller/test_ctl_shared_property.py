"""Random share allocate/release sequences never exceed a GPU's memory, cores or split count."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_helpers import CLASSES, any_claim, claim, decider, hami_body

from controller.claims.quantity import parse_quantity

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("alloc"), st.integers(1, 20000), st.integers(0, 100), st.integers(1, 3), st.booleans()
        ),
        st.tuples(st.just("release"), st.integers(0, 50), st.just(0), st.just(0), st.just(False)),
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_shares_respect_every_capacity(sequence: list[tuple[str, int, int, int, bool]]) -> None:
    d = decider({"a": [16000, 40960], "b": [24000]}, mig={"m": ("A100-40GB", 1)}, split=3)
    live: dict[str, list[dict[str, object]]] = {}
    for i, (op, mib, cores, count, mixed) in enumerate(sequence):
        if op == "alloc":
            body = hami_body(memory=mib, cores=cores, count=count)
            c = any_claim(f"c{i}", mib, body, distinct=True) if mixed else claim(f"c{i}", body)
            decision = d.decide([c], CLASSES)
            if not live and count == 1:
                # Completeness: one share of at most 20000 MiB fits the empty 24000/40960 MiB GPUs.
                assert decision.ok, decision.message
            for alloc in decision.allocations:
                d.ledger.assume(alloc.uid, alloc.keys)
                live[alloc.uid] = alloc.results
                shared = [r for r in alloc.results if "shareID" in r]
                assert len({r["device"] for r in shared}) == len(shared)  # one share per GPU per claim
        elif live:
            uid = sorted(live)[mib % len(live)]
            d.ledger.forget(uid)
            del live[uid]
        # Independent recount from the results written, against the published capacities.
        total: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for results in live.values():
            for r in results:
                if "consumedCapacity" not in r:
                    continue
                cc = r["consumedCapacity"]
                assert isinstance(cc, dict)
                t = total[(str(r["pool"]), str(r["device"]))]
                t[0] += int(parse_quantity(cc["memory"]) // 2**20)
                t[1] += int(parse_quantity(cc["cores"]))
                t[2] += int(parse_quantity(cc["shares"]))
        for ref, state in d.ledger.shared_states().items():
            info = d.ledger.inventory.shared[ref]
            t = total[(info.pool, info.device)]
            assert (state.used.memory_mib, state.used.cores, state.used.shares) == tuple(t)
            assert state.capacity.covers(state.used)
