"""Stopping the plugin's loops (kubeletplugin/agent/shutdown.py): all of them within one budget, the
ones still inside a long call named and left, so SIGTERM ends the process before kubelet's SIGKILL."""

from __future__ import annotations

import threading
import time

from driver.looprunner import LoopRunner
from kubeletplugin.agent.shutdown import stop_loops


def test_two_loops_stuck_in_calls_cost_one_budget_and_are_named() -> None:
    release = threading.Event()
    entered = [threading.Event(), threading.Event()]

    def stuck(i: int) -> LoopRunner:
        def body() -> None:
            entered[i].set()
            release.wait(30)  # a request to an API server that does not answer

        return LoopRunner(f"stuck-{i}", body, interval_s=0.01)

    quick = LoopRunner("quick", lambda: None, interval_s=0.01)
    runners = [stuck(0), quick, stuck(1)]
    for r in runners:
        r.start()
    assert all(e.wait(5) for e in entered)
    started = time.monotonic()
    still = stop_loops(runners, budget_s=0.5)
    took = time.monotonic() - started
    assert still == ["stuck-0", "stuck-1"]
    assert took < 0.5 + 0.4  # one budget for both, not one each
    release.set()
    for r in runners:
        r.join(5)
    assert not any(r.alive() for r in runners)


def test_loops_that_stop_at_once_are_not_waited_for() -> None:
    runners = [LoopRunner(f"l{i}", lambda: None, interval_s=0.01) for i in range(3)]
    for r in runners:
        r.start()
    started = time.monotonic()
    assert stop_loops(runners, budget_s=10.0) == []
    assert time.monotonic() - started < 2.0
