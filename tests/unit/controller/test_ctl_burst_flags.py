"""`flexmig controller --burst-plan-budget`: the seconds a step may spend on a burst plan, 0 turns it
off; bad values are refused with the allowed range (flexmig/commands/controller.py)."""

from __future__ import annotations

import pytest
from ctl_helpers import claim, mem
from fake_apiserver import Harness

from flexmig.cli import build_parser
from flexmig.commands.controller import _validate


def parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["controller", *argv])


def test_default_and_zero_are_accepted() -> None:
    assert parse([]).burst_plan_budget == 0.5
    assert _validate(parse([])) is None
    assert _validate(parse(["--burst-plan-budget", "0"])) is None


@pytest.mark.parametrize("value", ["-1", "11", "nan", "inf"])
def test_out_of_range_is_refused_naming_the_range(value: str) -> None:
    problem = _validate(parse(["--burst-plan-budget", value]))
    assert problem is not None
    assert problem.startswith("--burst-plan-budget:") and "from 0 to 10" in problem


def test_budget_zero_decides_a_burst_pod_by_pod() -> None:
    # The burst of tests/unit/controller/test_ctl_burstplan.py: only the plan fits all six.
    h = Harness({"n1": ("H100-80GB", 2)})
    h.ctl.placer.burst_budget_s = 0.0
    for i, mib in enumerate([30000, 30000, 19000, 19000, 16000, 16000]):
        h.add_claim(claim(f"c{i}", mem(mib)))
        h.add_pod(f"p{i}", [f"c{i}"])
    h.deliver()
    h.cycle()
    assert sum(h.gated(f"p{i}") for i in range(6)) == 1
    count = h.ctl.metrics.registry.get_sample_value(
        "flexmig_controller_burst_plan_seconds_count", {"outcome": "planned"}
    )
    assert not count
