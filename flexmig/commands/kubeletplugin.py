"""`flexmig kubeletplugin`: the node agent (DaemonSet) that prepares MIG devices for kubelet.

Every flag has an environment-variable fallback (see `kubeletplugin.settings.config.FLAGS`). Invalid settings
are reported as one line naming the flag and what is allowed, with exit code 2, before anything on the
node is touched. Exit code 1 means a start-up failure after validation (NVML, checkpoint, sockets).
"""

from __future__ import annotations

import argparse
import sys

from flexmig.logsetup import configure_logging
from kubeletplugin.settings.config import LOG_FORMATS, LOG_LEVELS, ConfigError, add_flags, load_config


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "kubeletplugin",
        help="run the node agent: kubelet DRA plugin that creates MIG instances on demand",
        description=(
            "Registers with kubelet as DRA driver gpu.flexmig.dev, publishes this node's ResourceSlices, "
            "and prepares/unprepares claims by creating and destroying MIG instances through NVML. "
            "Test-only fault injection: FLEXMIG_CRASHPOINTS (see kubeletplugin/agent/crashpoints.py)."
        ),
    )
    add_flags(parser)
    # Also accepted after the subcommand (DaemonSet args read naturally that way); SUPPRESS keeps the
    # top-level values when these are not given here.
    parser.add_argument("--log-level", default=argparse.SUPPRESS, help=f"one of {', '.join(LOG_LEVELS)}")
    parser.add_argument("--log-format", default=argparse.SUPPRESS, help=f"one of {', '.join(LOG_FORMATS)}")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    level = str(getattr(args, "log_level", "info"))
    fmt = str(getattr(args, "log_format", "auto"))
    if level.lower() not in LOG_LEVELS:
        print(
            f"flexmig kubeletplugin: --log-level: {level!r}; allowed: {', '.join(LOG_LEVELS)}",
            file=sys.stderr,
        )
        return 2
    if fmt not in LOG_FORMATS:
        print(
            f"flexmig kubeletplugin: --log-format: {fmt!r}; allowed: {', '.join(LOG_FORMATS)}",
            file=sys.stderr,
        )
        return 2
    configure_logging(level.lower(), fmt, component="kubeletplugin")  # type: ignore[arg-type]
    try:
        cfg = load_config(args)
    except ConfigError as exc:
        print(f"flexmig kubeletplugin: {exc}", file=sys.stderr)
        return 2
    # Imported here: the CLI's other subcommands must not pay for grpc/kubernetes at start.
    from kubeletplugin.agent.main import run_plugin

    return run_plugin(cfg)
