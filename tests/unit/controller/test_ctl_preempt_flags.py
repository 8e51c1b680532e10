"""`flexmig controller --preemption` / `--preemption-hold` (flexmig/commands/controller.py): on by
default as in kube-scheduler, off on request; bad values are refused naming what is allowed."""

from __future__ import annotations

import pytest

from flexmig.cli import build_parser
from flexmig.commands.controller import _validate


def parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["controller", *argv])


def test_on_by_default_and_off_on_request() -> None:
    assert parse([]).preemption == "true" and parse([]).preemption_hold == 120.0
    assert _validate(parse([])) is None
    assert _validate(parse(["--preemption=false", "--preemption-hold=30"])) is None


def test_a_bad_switch_is_refused() -> None:
    assert _validate(parse(["--preemption=yes"])) == "--preemption: 'yes' is not one of true, false"


@pytest.mark.parametrize("value", ["0", "-5", "3601", "nan"])
def test_a_hold_out_of_range_is_refused_naming_the_range(value: str) -> None:
    problem = _validate(parse(["--preemption-hold", value]))
    assert problem is not None and problem.startswith("--preemption-hold:") and "from 1 to 3600" in problem
