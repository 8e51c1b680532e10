"""`python -m benchmarks.packing --policies`: which reference policies the packing tables compare."""

from __future__ import annotations

import pytest

from benchmarks.packing.__main__ import POLICIES, main


def test_every_policy_is_compared_by_default() -> None:
    assert POLICIES == ("first-fit", "hami", "hami-2855", "flexmig")


def test_policies_narrows_the_online_and_offline_tables(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--skip", "scale", "--seeds", "1", "--policies", "flexmig,hami-2855"]
    assert main(argv) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    online = {r[2] for r in rows if len(r) == 6 and r[1].endswith("%")}
    offline = {r[1] for r in rows if len(r) == 5 and r[2].endswith("x")}
    assert online == {"hami-2855", "flexmig", "repacking-bound"}
    assert offline == {"hami-2855", "flexmig", "flexmig, burst decided together"}


@pytest.mark.parametrize("value", ["", "hami,best", "HAMI"])
def test_an_unknown_policy_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--quick", "--policies", value])
    assert exit_.value.code == 2
    assert "--policies: need one or more of first-fit, hami, hami-2855, flexmig" in capsys.readouterr().err
