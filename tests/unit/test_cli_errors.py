"""The CLI's one error path (flexmig/cliargs.py): input the program can check gives one line on stderr
naming the flag and the allowed values, exit status 2, and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flexmig.cli import main

REPO = Path(__file__).resolve().parents[2]


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("-1", "argument --timeout: '-1' is out of range; allowed: seconds per API request above 0"),
        ("0", "'0' is out of range"),
        ("nan", "'nan' is out of range"),
        ("soon", "'soon' is not a number; allowed: seconds per API request above 0 and at most 3600"),
    ],
)
def test_status_timeout_must_be_positive(value: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: --timeout -1 was accepted and handed to every API request.
    assert needle in _one_line_exit_2(["status", "--timeout", value], capsys)


@pytest.mark.parametrize("value", ["../kube-system", "a/b", "Flexmig", "x" * 64, ""])
def test_status_controller_namespace_must_be_a_namespace_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # It goes into a request's path: no '/', no '..', nothing a namespace cannot be called.
    err = _one_line_exit_2(["status", "--controller-namespace", value], capsys)
    assert "argument --controller-namespace:" in err and "is not a namespace name; allowed:" in err


def test_controller_without_a_kubeconfig_names_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a kubernetes ConfigException traceback.
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    err = _one_line_exit_2(["controller", "--metrics-port", "0"], capsys)
    assert (
        err.startswith("flexmig controller: --kubeconfig: not given") and "allowed: a kubeconfig file" in err
    )
    err = _one_line_exit_2(
        ["controller", "--metrics-port", "0", "--kubeconfig", str(tmp_path / "no")], capsys
    )
    assert "--kubeconfig: " in err and "does not exist" in err
    bad = tmp_path / "bad"
    bad.write_text("clusters: 7\n")
    err = _one_line_exit_2(["controller", "--metrics-port", "0", "--kubeconfig", str(bad)], capsys)
    assert f"--kubeconfig: cannot load {bad}" in err


def test_controller_flag_errors_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_exit_2(["controller", "--mode", "fast"], capsys)
    assert err == "flexmig controller: --mode: 'fast' is not one of controller, scheduler\n"


def test_argparse_refusals_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_exit_2(["status", "-o", "xml"], capsys)
    assert "argument -o/--output: invalid choice: 'xml'" in err and "flexmig status --help" in err
    assert "unrecognized arguments: --frobnicate" in _one_line_exit_2(["status", "--frobnicate"], capsys)


def test_no_traceback_from_a_fresh_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.cli", "simulate", "--pods", "0"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("flexmig simulate: argument --pods: 0 is out of range; allowed: an integer")
    assert "Traceback" not in proc.stderr


def test_sim_errors_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "show", "--state", str(tmp_path / "none.json")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--state: " in captured.err and "does not exist" in captured.err
