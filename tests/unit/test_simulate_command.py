"""`flexmig simulate` end to end on the simulator (small scenario)."""

from __future__ import annotations

import pytest

from driver.policy.allocator import FirstFitPolicy, PackingPolicy
from flexmig.cli import main
from flexmig.simulation import runner, workload


def test_simulate_prints_a_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--nodes", "2", "--pods", "40", "--quiet", "--models", "A100-40GB,H100-80GB"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.strip().startswith(("flexmig ", "first-fit "))
    }
    assert set(rows) == {"flexmig", "first-fit"}
    assert "node-0: 2x A100-40GB" in out and "node-1: 2x H100-80GB" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--models", "A100-40GB,Z9000"], "--models: unknown value 'Z9000'"),
        (["--policy", "best"], "--policy: unknown value 'best'"),
        (["--nodes", "0"], "--nodes: must be >= 1"),
        (["--pods", "-1"], "pods: must be >= 0"),
    ],
)
def test_bad_arguments_name_the_field(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--quiet", *argv]) == 2
    assert needle in capsys.readouterr().out


def test_every_decision_is_realised_in_nvml_and_nothing_leaks() -> None:
    nodes = [runner.NodeSpec("n0", ("A100-40GB", "H200-141GB")), runner.NodeSpec("n1", ("A30-24GB",))]
    pods = workload.generate(60, seed=7)
    for policy in (PackingPolicy(), FirstFitPolicy()):
        result = runner.run(policy, nodes, pods)
        assert result.pods == 60
        assert result.accepted + sum(result.rejected.values()) == 60
        devices_placed = sum(
            p.devices for p in pods[: result.pods]
        )  # upper bound; creates count only placed devices
        assert 0 < result.nvml_creates <= devices_placed
        assert result.nvml_destroys == result.nvml_creates
        assert result.leaked_instances == 0
