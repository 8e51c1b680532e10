"""`flexmig controller`'s flags for moving movable pods (docs/moves.md): off by default."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the controller's modules import kubernetes; `flexmig --help` must not pay for it
    from controller.allocation.moves import MoveSettings

MOVE_WINDOW_S = 3600.0  # controller/allocation/moves.py MoveSettings (not imported: see above)
MAX_MOVE_WINDOW_S = 7 * 24 * 3600.0
MOVE_TIMEOUT_S = 300.0
MIN_MOVE_TIMEOUT_S, MAX_MOVE_TIMEOUT_S = 10.0, 3600.0
MOVE_MAX_PODS = 1  # controller/allocation/moveplan.py MAX_MOVES (not imported: see above)
MOVE_MAX_PODS_LIMIT = 4
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def add_move_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--moves",
        default="false",
        help="true or false: evict pods that opted in (annotation gpu.flexmig.dev/movable) so that "
        "their controller recreates them on reserved devices elsewhere, to make room for a pod that "
        "fits nowhere (default false)",
    )
    p.add_argument(
        "--movable-namespaces",
        default="",
        help="comma-separated namespaces whose pods are movable unless annotated "
        "gpu.flexmig.dev/movable=false (default: none)",
    )
    p.add_argument(
        "--move-window",
        type=float,
        default=MOVE_WINDOW_S,
        help=f"seconds within which a pod (or its replacement) is never moved again, 0 to "
        f"{MAX_MOVE_WINDOW_S:g} (default {MOVE_WINDOW_S:g})",
    )
    p.add_argument(
        "--move-timeout",
        type=float,
        default=MOVE_TIMEOUT_S,
        help=f"seconds a moved pod's destination stays reserved for its replacement after it ended, "
        f"{MIN_MOVE_TIMEOUT_S:g} to {MAX_MOVE_TIMEOUT_S:g} (default {MOVE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--move-max-pods",
        type=int,
        default=MOVE_MAX_PODS,
        help=f"running pods one plan may move to make room for one waiting pod, 1 to "
        f"{MOVE_MAX_PODS_LIMIT} (default {MOVE_MAX_PODS}; docs/moves.md, 'One move per plan')",
    )


def _namespaces(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def validate_move_flags(args: argparse.Namespace) -> str | None:
    if args.moves not in ("true", "false"):
        return f"--moves: {args.moves!r} is not one of true, false"
    bad = [n for n in _namespaces(args.movable_namespaces) if not _NAMESPACE.fullmatch(n) or len(n) > 63]
    if bad:
        return f"--movable-namespaces: {', '.join(bad)} is not a namespace name"
    if not 0 <= args.move_window <= MAX_MOVE_WINDOW_S:  # NaN fails too
        return f"--move-window: {args.move_window} is not a number of seconds from 0 to {MAX_MOVE_WINDOW_S:g}"
    if not 1 <= args.move_max_pods <= MOVE_MAX_PODS_LIMIT:
        return f"--move-max-pods: {args.move_max_pods} is not a number from 1 to {MOVE_MAX_PODS_LIMIT}"
    if not MIN_MOVE_TIMEOUT_S <= args.move_timeout <= MAX_MOVE_TIMEOUT_S:
        return (
            f"--move-timeout: {args.move_timeout} is not a number of seconds from {MIN_MOVE_TIMEOUT_S:g} "
            f"to {MAX_MOVE_TIMEOUT_S:g}"
        )
    return None


def move_settings(args: argparse.Namespace) -> MoveSettings:
    from controller.allocation.moves import MoveSettings

    return MoveSettings(
        enabled=args.moves == "true",
        namespaces=frozenset(_namespaces(args.movable_namespaces)),
        window_s=args.move_window,
        timeout_s=args.move_timeout,
        max_moves=args.move_max_pods,
    )


__all__ = ["add_move_flags", "move_settings", "validate_move_flags"]
