"""Defect 9 of issue 10: random churn against the controller, invariants checked on what the API server
holds (every claim's status.allocation) and on the NVML simulator's GPU instances.

The former property test checked "no overlap" over the ledger's owners, a map that cannot hold a device
twice, so it could not see a double allocation. This one drives the real `Controller` and `Writer`
against tests/unit/controller/fake_apiserver.py with pods, multi-claim pods, bursts competing for one
kind of slot, deletions, late/interleaved/replayed watch events, relists lagging behind the controller's
writes, injected 409/404/500 answers and leadership lost between writes (tests/unit/controller/churn.py),
and audits the server after every step with controller/state/audit.py.
"""

from __future__ import annotations

from churn import Churn, Op, check_on_simulator
from ctl_helpers import claim, mem
from fake_apiserver import Harness
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

KINDS = (
    "pod",
    "burst",
    "delete-pod",
    "delete-claim",
    "deliver",
    "trickle",
    "interleave",
    "replay",
    "stale-relist",
    "fault",
    "lose-leader",
    "cycle",
)
small = st.integers(0, 1_000)
ops = st.lists(st.tuples(st.sampled_from(KINDS), small, small, small), min_size=1, max_size=30)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
# The stale-watch double booking (defect 1): a burst allocated in one batch, then the watch brings the
# controller's own writes one at a time, the older finalizer-only version first.
@example([("burst", 4, 5, 0), ("trickle", 0, 0, 0)])
# A pod deleted before the controller saw it, brought back by a lagging relist: allocated and reserved
# for after it was gone, its claim is freed once the reservation is reaped (kube-controller-manager).
@example(
    [("pod", 0, 0, 0), ("lose-leader", 1000, 0, 0), ("pod", 0, 0, 0), ("cycle", 0, 0, 0),
     ("delete-pod", 1, 0, 0), ("stale-relist", 1, 0, 0)]
)  # fmt: skip
def test_random_churn_never_double_books_and_stays_realisable(sequence: list[Op]) -> None:
    churn = Churn()
    for op in sequence:
        churn.do(op)
    churn.settle()
    churn.check_settled()


def test_the_simulator_check_refuses_what_hardware_would() -> None:
    """The simulator step can fail: two claims on overlapping placements of one GPU are refused."""
    h = Harness({"a": ("A100-40GB", 2)})
    for name, device in (("x", "gpu-0-mig-3g20gb-9-0"), ("y", "gpu-0-mig-2g10gb-14-2")):
        body = claim(name, mem(9000))
        body["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.flexmig.dev", "pool": "a", "device": device}
                    ]
                }
            }
        }
        h.api.put_object("resourceclaims", body)
    claims, slices = h.api.objects["resourceclaims"], h.api.objects["resourceslices"]
    assert "placement-overlap" in {v.kind for v in h.api.audit()}
    try:
        check_on_simulator(claims.values(), slices.values())
    except AssertionError as exc:
        assert "cannot be created" in str(exc)
    else:
        raise AssertionError("overlapping placements were created on the simulator")
    del claims["ns/y"]
    assert check_on_simulator(claims.values(), slices.values()) == 1
