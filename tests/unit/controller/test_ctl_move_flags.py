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
        ["--moves=true", "--movable-namespaces", "batch, ml", "--move-window=60", "--move-timeout=30"]
    )
    assert _validate(args) is None
    settings = move_settings(args)
    assert settings.enabled and settings.namespaces == {"batch", "ml"}
    assert (settings.window_s, settings.timeout_s) == (60.0, 30.0)


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["--moves=yes"], "--moves:"),
        (["--movable-namespaces=Batch"], "--movable-namespaces:"),
        (["--move-window=-1"], "--move-window:"),
        (["--move-window=nan"], "--move-window:"),
        (["--move-timeout=5"], "--move-timeout:"),
    ],
)
def test_a_bad_value_is_refused(argv: list[str], start: str) -> None:
    problem = _validate(parse(argv))
    assert problem is not None and problem.startswith(start)
