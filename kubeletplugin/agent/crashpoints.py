"""Fault injection for crash tests: stop the plugin at an exact step so a test can `kill -9` it there.

Set `FLEXMIG_CRASHPOINTS` to a comma-separated list of point names (see `POINTS`). When the plugin
reaches a listed point it logs `crashpoint reached`, writes the point's name to the file named by
`FLEXMIG_CRASHPOINT_MARKER` (default `<checkpoint dir>/crashpoint-reached`) and then blocks that thread
forever. It never exits by itself: the test waits for the marker and sends a real SIGKILL, so what
survives on disk is exactly what a node would see after a crash at that step. Each point fires once per
process. Unset (the production default) the hooks cost one set lookup.

This exists only for tests; it changes no product behaviour when the variable is unset.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import structlog

from driver.atomicfile import write_atomically

log = structlog.get_logger(__name__)

ENV_POINTS = "FLEXMIG_CRASHPOINTS"
ENV_MARKER = "FLEXMIG_CRASHPOINT_MARKER"

POINTS: dict[str, str] = {
    "after-gi-create": "a GPU instance exists, its identity is not yet committed",
    "after-ci-create": "GPU and compute instance exist, identity not yet committed",
    "after-cdi-write": "the claim's CDI spec is on disk, checkpoint still PrepareStarted",
    "before-checkpoint-commit": "immediately before the PrepareCompleted write",
    "after-checkpoint-commit": "PrepareCompleted written, claim status not yet written",
    "mid-destroy": "unprepare destroyed the compute instance, not yet the GPU instance",
    "after-idle-ci-destroy": "unprepare destroyed the CI to keep the GI idle; the idle record not yet written",
    "before-checkpoint-remove": "unprepare destroyed everything, the checkpoint entry still exists",
}


class Crashpoints:
    def __init__(self, points: frozenset[str], marker: Path) -> None:
        unknown = sorted(points - POINTS.keys())
        if unknown:
            raise ValueError(f"{ENV_POINTS}: unknown points {unknown}; allowed: {', '.join(POINTS)}")
        self._armed = set(points)
        self._marker = marker
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, default_marker: Path) -> Crashpoints:
        raw = os.environ.get(ENV_POINTS, "")
        points = frozenset(p.strip() for p in raw.split(",") if p.strip())
        marker = os.environ.get(ENV_MARKER, "").strip()
        return cls(points, Path(marker) if marker else default_marker)

    @property
    def armed(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._armed)

    def reach(self, point: str) -> None:
        if not self._armed:
            return
        with self._lock:
            if point not in self._armed:
                return
            self._armed.discard(point)
        log.warning("crashpoint reached; blocking until killed", point=point, meaning=POINTS[point])
        # Atomic so a test polling for the marker never reads it empty; no fsync, only a kill follows.
        # 0644 is what a plain write gave under the usual umask.
        write_atomically(self._marker, (point + "\n").encode(), durable=False, mode=0o644)
        threading.Event().wait()  # forever: the test sends SIGKILL
