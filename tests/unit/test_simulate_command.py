"""`flexmig simulate` end to end on the simulator (small scenario)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.policy.allocator import FirstFitPolicy, PackingPolicy
from driver.policy.bound import FitProgram, model_groups
from driver.policy.hami_scored import HamiScoredPolicy
from driver.policy.model import ShortReason
from flexmig.cli import main
from flexmig.simulation import fit_highs, runner, workload
from flexmig.simulation.fit_search import SearchProgram

SMALL = ["simulate", "--nodes", "2", "--pods", "40", "--models", "A100-40GB,H100-80GB"]


def test_simulate_prints_a_row_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--nodes", "2", "--pods", "40", "--quiet", "--models", "A100-40GB,H100-80GB"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.strip().startswith(("flexmig ", "first-fit ", "hami ", "hami-2855 ", "bound "))
    }
    assert set(rows) == {"flexmig", "first-fit", "hami", "hami-2855", "bound"}
    assert "4 GPUs (2x A100-40GB, 2x H100-80GB)" in out
    assert "below the bound" in out and "Refused per request size" in out


@pytest.mark.parametrize(
    ("given", "sku"),
    [
        ("B200", "B200-180GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("h200-sxm5", "H200-141GB"),
        ("A800-80GB-PCIe", "A800-PCIE-80GB"),
    ],
)
def test_models_resolve_like_profiles(given: str, sku: str, capsys: pytest.CaptureFixture[str]) -> None:
    # One resolver for every command: what `flexmig profiles` accepts, `simulate --models` accepts.
    code = main(
        [
            "simulate",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--pods",
            "5",
            "--quiet",
            "--policy",
            "first-fit",
            "--models",
            given,
        ]
    )
    assert code == 0
    assert f"1x {sku}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--models", "A100-40GB,Z9000"], "--models: unknown GPU model 'Z9000'"),
        (["--policy", "best"], "--policy: unknown value 'best'"),
        (["--report", "/proc/version/x"], "--report: cannot create /proc/version/x: /proc/version is not"),
    ],
)
def test_bad_arguments_name_the_field(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--quiet", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and needle in captured.err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--pods", "0"], "argument --pods: 0 is out of range; allowed: an integer in 1..1000000"),
        (["--pods", "-1"], "argument --pods: -1 is out of range"),
        (["--pods", "many"], "argument --pods: 'many' is not an integer; allowed: an integer in 1..1000000"),
        (["--nodes", "0"], "argument --nodes: 0 is out of range; allowed: an integer in 1..1000"),
        (["--gpus-per-node", "0"], "argument --gpus-per-node: 0 is out of range"),
    ],
)
def test_bad_numbers_are_one_line_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: --pods 0 ran the whole simulation and ended in a TypeError traceback.
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--quiet", *argv])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and needle in captured.err


def test_a_report_dir_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ran: list[object] = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: ran.append(a))
    assert main([*SMALL, "--quiet", "--policy", "flexmig", "--report", str(blocker / "sub")]) == 2
    assert ran == [] and "--report: cannot create" in capsys.readouterr().err
    assert main([*SMALL, "--quiet", "--policy", "flexmig", "--report", str(blocker)]) == 2
    assert ran == [] and f"--report: {blocker} is not a directory" in capsys.readouterr().err
    assert not (blocker / "sub").exists() and blocker.read_text() == "x"


def test_every_decision_is_realised_in_nvml_and_nothing_leaks() -> None:
    nodes = [runner.NodeSpec("n0", ("A100-40GB", "H200-141GB")), runner.NodeSpec("n1", ("A30-24GB",))]
    pods = workload.generate(60, seed=7)
    for policy in (PackingPolicy(), FirstFitPolicy(), HamiScoredPolicy()):
        result = runner.run(policy, nodes, pods)
        assert result.pods == 60
        assert result.accepted + sum(result.rejected.values()) == 60
        devices_placed = sum(
            p.devices for p in pods[: result.pods]
        )  # upper bound; creates count only placed devices
        assert 0 < result.nvml_creates <= devices_placed
        assert result.nvml_destroys == result.nvml_creates
        assert result.leaked_instances == 0


def test_json_is_one_document_with_the_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds nothing else
    assert doc["schema"] == "flexmig.simulate/v1"
    assert set(doc) == {"schema", "cluster", "workload", "results", "making_room"}
    assert doc["making_room"] is None  # neither --movable-share nor --priority-mix
    assert doc["cluster"]["gpus"] == 4 and doc["cluster"]["nodes"][1]["gpus"] == ["H100-80GB"] * 2
    assert doc["workload"]["pods"] == 40 and sum(s["pods"] for s in doc["workload"]["sizes"]) == 40
    assert [r["policy"] for r in doc["results"]] == ["flexmig", "first-fit", "hami", "hami-2855", "bound"]
    keys = {
        "policy", "realized", "pods", "accepted", "acceptance", "asked_mib", "accepted_mib",
        "memory_acceptance", "below_bound", "refused_by_reason", "refused_by_size", "mean_fragmentation",
        "mean_memory_in_use", "gi_created", "gi_destroyed", "gi_leaked", "decision_ms", "timeline",
        "final_slice_map",
    }  # fmt: skip
    for r in doc["results"]:
        assert set(r) == keys
        refused = sum(row["refused"] for row in r["refused_by_size"])
        assert r["accepted"] + refused == r["pods"] == 40
        assert 0 <= r["memory_acceptance"] <= 1 and len(r["timeline"]) == 40
    flexmig, bound = doc["results"][0], doc["results"][-1]
    assert set(flexmig["refused_by_reason"]) == {reason.value for reason in ShortReason}
    assert flexmig["gi_leaked"] == 0 and flexmig["gi_created"] == flexmig["gi_destroyed"] > 0
    assert {g["model"] for g in flexmig["final_slice_map"]} == {"A100-40GB", "H100-80GB"}
    assert bound["realized"] is False and bound["below_bound"] is None and bound["decision_ms"] is None
    assert flexmig["below_bound"]["pods"] == pytest.approx(
        100 * (bound["acceptance"] - flexmig["acceptance"])
    )


def test_progress_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--policy", "flexmig,bound"]) == 0
    captured = capsys.readouterr()
    assert "[flexmig] 40/40 pods" in captured.err and "[bound] 40/40 pods" in captured.err
    assert "40/40" not in captured.out and "[flexmig]" not in captured.out
    assert main([*SMALL, "--policy", "flexmig", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_report_writes_a_self_contained_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out" / "report"
    assert main([*SMALL, "--quiet", "--report", str(target)]) == 0
    page = (target / "index.html").read_text()
    doc = json.loads((target / "simulate.json").read_text())
    assert doc["schema"] == "flexmig.simulate/v1"
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 3 + 3  # 3 charts, 3 slice maps
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for title in ("Pods accepted so far", "GPU memory in use", "Refused pods per request size"):
        assert title in page
    for policy in ("flexmig", "first-fit", "hami", "hami-2855"):
        assert f"<h3>{policy}: " in page  # its final slice map
    assert "<h3>bound: " not in page  # the bound has no slices to show
    assert "below the bound" in capsys.readouterr().out


def test_report_into_a_file_path_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main([*SMALL, "--quiet", "--policy", "flexmig", "--report", str(blocker)]) == 2
    assert "--report: " in capsys.readouterr().err


def _programs() -> list[type[SearchProgram] | type[fit_highs.HighsProgram]]:
    return [SearchProgram, fit_highs.HighsProgram] if fit_highs.available() else [SearchProgram]


@pytest.mark.parametrize("program", _programs())
def test_fast_fit_programs_agree_with_the_reference_program(
    program: type[SearchProgram] | type[fit_highs.HighsProgram],
) -> None:
    catalogs = [simulated_catalog(s) for s in ("A100-40GB", "A100-40GB", "H100-80GB", "A30-24GB")]
    groups = model_groups(catalogs)
    reference, fast = FitProgram(groups), program(groups)
    sizes = [m for m, _ in workload.DEFAULT_MIX]
    rng = random.Random(5)
    answers = set()
    for count, _ in itertools.product(range(1, 18), range(12)):
        asked = [rng.choice(sizes) for _ in range(count)]
        expected = reference.solve(asked) is not None
        layouts = fast.solve(asked)
        assert (layouts is not None) == expected, asked
        answers.add(expected)
        if layouts is not None:
            # The witness is real: one layout per GPU, in group order, whose instances cover the asks.
            assert len(layouts) == len(catalogs)
            per_gpu = [g.layouts for g in groups for _ in range(g.count)]
            assert all(
                not lay or tuple(sorted(lay)) in allowed
                for lay, allowed in zip(layouts, per_gpu, strict=True)
            )
            free = sorted(m for layout in layouts for m in layout)
            for size in sorted(asked, reverse=True):
                fit = [m for m in free if m >= size]
                assert fit, asked
                free.remove(fit[0])
    assert answers == {True, False}


def test_quiet_and_json_keep_stderr_free_of_the_solvers_banner() -> None:
    # A fresh process: HiGHS prints its banner only when the process builds its first instance.
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    for flag in ("--quiet", "--json"):
        proc = subprocess.run(
            [sys.executable, "-m", "flexmig.cli", *SMALL[:-2], "--models", "A100-40GB", "--pods", "10",
             "--policy", "bound", flag, *(["--quiet"] if flag == "--json" else [])],
            capture_output=True, text=True, cwd=repo, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", (flag, proc.stderr)
        assert "HiGHS" not in proc.stdout


def test_sim_init_takes_any_model_name() -> None:
    from flexmig.commands.sim import parse_gpu_list

    assert parse_gpu_list("NVIDIA H200:2,b200") == ["H200-141GB", "H200-141GB", "B200-180GB"]
    with pytest.raises(ValueError, match="--gpus: unknown GPU model 'Z9'"):
        parse_gpu_list("Z9:1")
