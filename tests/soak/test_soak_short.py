"""The short soak for CI: a fixed seed, every fault of the matrix once, on a real control plane.

It runs the same code as `python3 -m tests.soak` (runner.py) with a short churn, faults back to back
and an 8 s outage, and asserts that no invariant was violated, that each fault hit its target and that
the checker ran often enough to have looked.
"""

from __future__ import annotations

import pytest

from tests.e2e.cluster import ControlPlane, build_binaries

from .faults import Fault
from .runner import Soak, SoakConfig

pytestmark = pytest.mark.e2e
MIN_CYCLES = 10


@pytest.mark.timeout(1200)
def test_soak_short_every_fault_no_violation() -> None:
    cfg = SoakConfig(
        minutes=1.0, seed=20261202, fault_every_s=3.0, first_fault_s=10.0, down_s=8.0, max_live=10,
        settle_s=150.0, final_s=240.0,
    )  # fmt: skip
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    cp = ControlPlane(build_binaries()).start()
    failed = True
    try:
        report = Soak(cfg, out).run(cp)
        failed = bool(report.violations)
    finally:
        cp.stop(failed=failed)
    print(report.last_line)
    assert not report.violations, "\n".join(v.render() for v in report.violations)
    assert report.cycles >= MIN_CYCLES, report.last_line
    assert {r.fault for r in report.faults} == set(Fault)
    missed = [f"{r.fault}: {r.detail}" for r in report.faults if not r.reached]
    assert not missed, f"faults that did not hit their target: {missed}"
