"""driver/looprunner.py: a loop survives every exception, backs off with jitter, and its health says
when it is dead or stuck."""

from __future__ import annotations

import threading

import pytest
import urllib3.exceptions

from driver.backoff import backoff_delay
from driver.looprunner import LoopGroup, LoopRunner


def _wait_for(cond: threading.Event, timeout_s: float = 10.0) -> None:
    assert cond.wait(timeout_s), "timed out"


def test_survives_urllib3_and_any_exception_then_recovers() -> None:
    errors = [
        urllib3.exceptions.MaxRetryError(None, "/apis", reason="connection refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ReadTimeoutError(None, "/apis", "read timed out"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection aborted."),
        KeyError("spec"),
        RuntimeError("boom"),
    ]
    done = threading.Event()
    seen: list[str] = []
    calls = 0

    def body() -> None:
        nonlocal calls
        calls += 1
        if errors:
            raise errors.pop(0)
        done.set()

    runner = LoopRunner(
        "t",
        body,
        backoff_start_s=0.001,
        backoff_max_s=0.002,
        on_error=lambda e: seen.append(type(e).__name__),
    )
    runner.start()
    _wait_for(done)
    runner.stop()
    runner.join(5)
    assert seen == ["MaxRetryError", "ReadTimeoutError", "ProtocolError", "KeyError", "RuntimeError"]
    assert runner.failures == 5 and runner.consecutive_failures == 0
    assert runner.health().ok


def test_backoff_grows_caps_and_jitters() -> None:
    assert backoff_delay(1, 0.5, 30, lambda: 0.0) == 0.5
    assert backoff_delay(3, 0.5, 30, lambda: 0.0) == 2.0
    assert backoff_delay(30, 0.5, 30, lambda: 0.0) == 30.0
    assert backoff_delay(1, 0.5, 30, lambda: 1.0) == 0.75


def test_backoff_is_used_between_failures() -> None:
    waits: list[float] = []

    class Recording(LoopRunner):
        def _pause_for_retry(self, delay: float) -> None:
            waits.append(delay)
            if len(waits) == 4:
                self.stop()

    def body() -> None:
        raise OSError("down")

    Recording("t", body, backoff_start_s=1, backoff_max_s=3, rng=lambda: 0.0).run()
    assert waits == [1, 2, 3, 3]


def test_stuck_loop_is_unhealthy_and_says_why() -> None:
    now = [100.0]
    entered, release = threading.Event(), threading.Event()

    def body() -> None:
        entered.set()
        release.wait(10)

    runner = LoopRunner("reflector-pods", body, stuck_after_s=30, clock=lambda: now[0])
    group = LoopGroup()
    group.add(runner)
    runner.start()
    _wait_for(entered)
    now[0] += 29
    assert group.check()[0]
    runner.beat()
    now[0] += 29
    assert group.check()[0], "a heartbeat restarts the stuck timer"
    now[0] += 2
    ok, text = group.check()
    assert not ok and "reflector-pods is stuck" in text
    runner.stop()
    release.set()
    runner.join(5)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_loop_is_unhealthy() -> None:
    def body() -> None:
        raise SystemExit(3)  # not an Exception: the one way out

    runner = LoopRunner("leader", body)
    group = LoopGroup()
    group.add(runner)
    runner.start()
    runner.join(5)
    ok, text = group.check()
    assert not ok and "leader is dead" in text


def test_pausing_loop_is_not_stuck_and_wake_ends_the_pause() -> None:
    now = [0.0]
    ran = threading.Semaphore(0)

    def body() -> None:
        ran.release()

    runner = LoopRunner("slices", body, interval_s=3600, stuck_after_s=1, clock=lambda: now[0])
    runner.start()
    assert ran.acquire(timeout=5)
    now[0] += 1000
    assert runner.health().ok, "waiting for the next round is not being stuck"
    runner.wake()
    assert ran.acquire(timeout=5)
    runner.stop()
    runner.join(5)
    assert runner.health().ok


def test_stopped_loop_is_not_dead() -> None:
    runner = LoopRunner("x", lambda: None, interval_s=10)
    runner.start()
    runner.stop()
    runner.join(5)
    assert runner.health().ok


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="backoff_start_s"):
        LoopRunner("x", lambda: None, backoff_start_s=0)
