"""`flexmig layouts` and `flexmig profiles`, driven through a tiny argparse harness."""

from __future__ import annotations

import argparse

import pytest

from flexmig.commands import layouts, profiles


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flexmig")
    sub = parser.add_subparsers(dest="command")
    layouts.register(sub)
    profiles.register(sub)
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


def test_layouts_count_for_the_oracle(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["layouts", "A100-40GB", "--profiles", "1g.5gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb", "--count"]) == 0
    )
    assert capsys.readouterr().out.strip() == "19"


def test_layouts_listing_default_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["layouts", "NVIDIA A100-SXM4-40GB"]) == 0
    out = capsys.readouterr().out.splitlines()
    # Default allowlist (no 4g.20gb): 4g+3g style layouts collapse; still numbered and annotated.
    assert out[0].startswith("A100-40GB (NVIDIA A100-SXM4-40GB): ")
    assert "of 1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb" in out[0]
    assert out[1].startswith(" 1. 7g.40gb@0") and out[1].endswith("compute 7/7  memory 8/8")
    assert any("3g.20gb@4 + 2g.10gb@0 + 1g.5gb@2 + 1g.5gb@3" in line for line in out)
    assert len(out) - 1 == int(out[0].split(": ")[1].split()[0])


def test_layouts_all_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["layouts", "a30-24gb", "--profiles", "all", "--count"]) == 0
    count_all = int(capsys.readouterr().out)
    assert run(["layouts", "A30-24GB", "--count"]) == 0
    assert count_all > int(capsys.readouterr().out) == 5


def test_layouts_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["layouts", "H100-80GB", "--profiles", "1g.5gb"]) == 2
    err = capsys.readouterr().err
    assert "does not offer 1g.5gb" in err and "1g.10gb" in err and "'all'" in err


@pytest.mark.parametrize("command", ["layouts", "profiles"])
def test_unknown_model_exits_2_listing_models(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([command, "H2"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU model 'H2'" in err and "H200-141GB (NVIDIA H200)" in err and "A30-24GB" in err


def test_profiles_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["profiles", "A100-40GB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "NVIDIA A100-SXM4-40GB" in out[0] and "8 memory slices, 7 compute slices" in out[0]
    header = out[1].split()
    assert header[:4] == ["Name", "ID", "Instances", "Memory"]
    rows = {line.split()[1] if line.startswith("*") else line.split()[0]: line for line in out[2:9]}
    assert rows["1g.5gb"].startswith("*")
    assert rows["1g.10gb"].startswith(" ")  # offered, not allowlisted by default
    assert rows["2g.10gb"].split()[1:5] == ["2g.10gb", "14", "3", "9.62"]
    assert rows["2g.10gb"].endswith("{0,2,4}:2")
    assert rows["1g.5gb"].endswith("{0,1,2,3,4,5,6}:1")
    assert rows["7g.40gb"].endswith("{0}:8")
    assert out[-1].startswith("* = allowed")


def test_profiles_rtx_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["profiles", "RTX-PRO-6000"]) == 0
    out = capsys.readouterr().out
    for name in ("1g.24gb+me.all", "1g.24gb-me", "2g.48gb+gfx", "4g.96gb+gfx"):
        assert name in out
    assert "{0,3,6,9}:3" in out and "{0,6}:6" in out and "{0}:12" in out
