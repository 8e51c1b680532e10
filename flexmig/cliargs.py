"""The CLI's one error path for bad input: a one-line message naming the flag and the allowed values on
stderr, exit status 2 (a usage error), never a traceback.

Three ways in, one way out:
- argparse types (`int_in`, `float_in`) reject a value while parsing;
- `OneLineParser.error` (every parser of the `flexmig` command) prints argparse's own complaints as one
  line, instead of the usage block followed by the message;
- a command raises `UsageError` for what it can only check after parsing (a file, a kubeconfig);
  `flexmig.cli.main` prints it.
Pure apart from writing that line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

USAGE_EXIT = 2


class UsageError(Exception):
    """Bad command-line input found after parsing; the message names the flag and what is allowed."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (the full usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def usage_error(command: str, message: str) -> int:
    """Print the one line for `flexmig <command>` and return the exit status to return."""
    print(f"flexmig {command}: {message}", file=sys.stderr)
    return USAGE_EXIT


def _bounds(lo: int, hi: int | None) -> str:
    return f"{lo}.." + ("" if hi is None else str(hi))


def int_in(lo: int, hi: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in lo..hi (hi None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer; allowed: {what} in {_bounds(lo, hi)}"
            ) from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: {what} in {_bounds(lo, hi)}")
        return value

    return parse


def float_in(
    lo: float, hi: float | None = None, what: str = "a number", lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in lo..hi (`lo_open`: lo itself excluded)."""
    allowed = f"{what} {'above' if lo_open else 'from'} {lo:g}" + (
        "" if hi is None else f" {'and at most' if lo_open else 'to'} {hi:g}"
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; allowed: {allowed}") from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; allowed: {allowed}")
        return value

    return parse


__all__ = ["USAGE_EXIT", "OneLineParser", "UsageError", "float_in", "int_in", "usage_error"]
