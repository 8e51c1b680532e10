"""Stopping the plugin's loops within one budget, so that SIGTERM ends the process before kubelet's
SIGKILL (a DaemonSet pod's default grace period is 30 s).

Each loop was joined with its own timeout, one after the other (10 + 10 + 5 s after the gRPC
servers' 10 s), so a slow API server holding two loops in requests could keep the process past 30 s.
Now every loop is told to stop first, then all are joined against one deadline; a loop still running
then is named in the log and left to the process exit. That is safe: every write the plugin makes is
atomic or idempotent (the checkpoint is replaced whole, claims are reconciled from it at the next
start), which is what makes a SIGKILL safe too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

STOP_LOOPS_S = 10.0


class Loop(Protocol):
    """What of a loop (driver/looprunner.py `LoopRunner`) stopping it needs."""

    name: str

    def stop(self) -> None: ...

    def join(self, timeout_s: float | None = None) -> None: ...

    def alive(self) -> bool: ...


def stop_loops(
    runners: Sequence[Loop], budget_s: float = STOP_LOOPS_S, clock: Callable[[], float] = time.monotonic
) -> list[str]:
    """Stop every loop and wait for them together for at most `budget_s`; the names still running."""
    for runner in runners:
        runner.stop()
    deadline = clock() + budget_s
    for runner in runners:
        runner.join(max(0.0, deadline - clock()))
    return [r.name for r in runners if r.alive()]


__all__ = ["STOP_LOOPS_S", "Loop", "stop_loops"]
