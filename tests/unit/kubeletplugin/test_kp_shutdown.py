"""Stopping the plugin's loops (kubeletplugin/agent/shutdown.py): all of them within one budget, the
ones still inside a long call named and left, so SIGTERM ends the process before kubelet's SIGKILL."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from driver.looprunner import LoopRunner
from kubeletplugin.agent.shutdown import stop_loops


@dataclass
class Stuck:
    """A loop inside a call that does not return: each join waits its whole timeout (on `clock`)."""

    name: str
    clock: list[float]
    stopped: bool = False
    waited: list[float] = field(default_factory=list)

    def stop(self) -> None:
        self.stopped = True

    def join(self, timeout_s: float | None = None) -> None:
        assert self.stopped, "joined before it was told to stop"
        self.waited.append(timeout_s or 0.0)
        self.clock[0] += timeout_s or 0.0

    def alive(self) -> bool:
        return True


def test_loops_stuck_in_calls_share_one_budget_and_are_named() -> None:
    now = [100.0]
    loops = [Stuck("publisher", now), Stuck("reconcile", now), Stuck("health", now)]
    assert stop_loops(loops, budget_s=10.0, clock=lambda: now[0]) == ["publisher", "reconcile", "health"]
    assert [loop.waited for loop in loops] == [[10.0], [0.0], [0.0]]  # one budget, not one each
    assert now[0] == 110.0


def test_real_loops_stop_and_one_inside_a_call_is_left_and_named() -> None:
    release = threading.Event()
    entered = threading.Event()

    def body() -> None:
        entered.set()
        release.wait(30)  # a request to an API server that does not answer

    stuck = LoopRunner("stuck", body, interval_s=0.01)
    quick = LoopRunner("quick", lambda: None, interval_s=0.01)
    for r in (stuck, quick):
        r.start()
    assert entered.wait(5)
    assert stop_loops([stuck, quick], budget_s=0.2) == ["stuck"]
    release.set()
    stuck.join(5)
    assert not stuck.alive() and not quick.alive()
