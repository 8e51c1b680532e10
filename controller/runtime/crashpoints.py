"""Fault injection for the soak test: the controller kills itself (SIGKILL) at an exact step.

Set `FLEXMIG_CONTROLLER_CRASHPOINTS` to a comma-separated list of point names (see `POINTS`). The
first time the process reaches a listed point it logs `controller crashpoint reached` and sends itself
SIGKILL, so what the API server holds afterwards is exactly what a crash at that step leaves behind.
Unset (the production default) a hook costs one frozenset lookup. Exists only for tests
(tests/soak, tests/e2e); it changes no product behaviour when the variable is unset.
"""

from __future__ import annotations

import os
import signal

import structlog

log = structlog.get_logger(__name__)

ENV_POINTS = "FLEXMIG_CONTROLLER_CRASHPOINTS"

POINTS: dict[str, str] = {
    "before-allocation-write": "the claim carries our finalizer, its allocation is not yet written",
    "before-gate-removal": "the claims are allocated, the pod's scheduling gate is not yet removed",
    "after-move-evictions": "pods were evicted to make room and the promises written; nothing placed yet",
}


def _armed() -> frozenset[str]:
    raw = os.environ.get(ENV_POINTS, "")
    points = frozenset(p.strip() for p in raw.split(",") if p.strip())
    unknown = sorted(points - POINTS.keys())
    if unknown:
        raise ValueError(f"{ENV_POINTS}: unknown points {unknown}; allowed: {', '.join(POINTS)}")
    return points


_ARMED = _armed()


def reach(point: str) -> None:
    """SIGKILL this process if `point` is armed (never returns then)."""
    if point not in _ARMED:
        return
    log.warning("controller crashpoint reached; killing this process", point=point, meaning=POINTS[point])
    os.kill(os.getpid(), signal.SIGKILL)
