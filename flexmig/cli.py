"""The `flexmig` command: one entry point, one module per subcommand under `flexmig.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from api.buildinfo import revision, version
from api.constants import DRIVER_NAME
from flexmig.cliargs import OneLineParser, UsageError, usage_error
from flexmig.logsetup import configure_logging, level_from_env

# Each module exposes `register(subparsers)`; a subcommand that fails to import (an optional
# dependency missing) must not take the whole CLI down, so they are loaded one by one.
SUBCOMMANDS = (
    "simulate",
    "profiles",
    "layouts",
    "sim",
    "kubeletplugin",
    "controller",
    "status",
    "migrate_config",
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="flexmig",
        description="Dynamic MIG for Kubernetes: a DRA driver that creates MIG instances on demand.",
    )
    parser.add_argument("--log-level", default=level_from_env(), help="debug, info, warning or error")
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    parser.add_argument(
        "--version",
        action="version",
        version=f"flexmig {version()} (revision {revision()}, driver {DRIVER_NAME})",
        help="print the version and exit",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"flexmig.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"flexmig.commands.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format, component=args.command)
    except ValueError as exc:
        parser.error(str(exc))
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        result: int = func(args)
    except UsageError as exc:
        return usage_error(args.command, str(exc))
    except BrokenPipeError:
        # `flexmig layouts ... | head` closed our stdout: not an error worth a traceback.
        sys.stderr.close()
        return 0
    return result


if __name__ == "__main__":
    sys.exit(main())
