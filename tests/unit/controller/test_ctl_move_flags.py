"""`flexmig controller --moves` and its companions (flexmig/commands/controller_moves.py): off by
default, on request; bad values are refused naming what is allowed."""

from __future__ import annotations

import argparse

import pytest

from flexmig.cli import build_parser
from flexmig.commands.controller import _validate
from flexmig.commands.controller_moves import move_settings


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["controller", *argv])


def test_off_by_default_and_on_request() -> None:
    assert _validate(parse([])) is None and not move_settings(parse([])).enabled
    args = parse(
        [
            "--moves=true",
            "--movable-namespaces",
            "batch, ml",
            "--move-window=60",
            "--move-timeout=30",
            "--move-max-pods=2",
        ]
    )
    assert _validate(args) is None
    settings = move_settings(args)
    assert settings.enabled and settings.namespaces == {"batch", "ml"}
    assert (settings.window_s, settings.timeout_s, settings.max_moves) == (60.0, 30.0, 2)


def test_one_move_per_plan_by_default_in_the_cli_the_chart_and_the_planner() -> None:
    from pathlib import Path

    import yaml

    from controller.allocation.moveplan import MAX_MOVES
    from controller.allocation.moves import MoveSettings
    from flexmig.commands.controller_moves import MOVE_MAX_PODS

    values = yaml.safe_load((Path(__file__).parents[3] / "deployments/helm/flexmig/values.yaml").read_text())
    chart = values["controller"]["moves"]["maxPodsPerPlan"]
    assert (
        move_settings(parse([])).max_moves
        == MOVE_MAX_PODS
        == MAX_MOVES
        == MoveSettings().max_moves
        == chart
        == 1
    )


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["--moves=yes"], "--moves:"),
        (["--movable-namespaces=Batch"], "--movable-namespaces:"),
        (["--move-window=-1"], "--move-window:"),
        (["--move-window=nan"], "--move-window:"),
        (["--move-timeout=5"], "--move-timeout:"),
        (["--move-max-pods=0"], "--move-max-pods:"),
        (["--move-max-pods=5"], "--move-max-pods:"),
    ],
)
def test_a_bad_value_is_refused(argv: list[str], start: str) -> None:
    problem = _validate(parse(argv))
    assert problem is not None and problem.startswith(start)
