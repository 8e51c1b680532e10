"""Run a background loop body forever: any exception is logged and retried with backoff and jitter,
and the loop's heartbeat tells a health endpoint whether it is dead or stuck.

Every background loop of flexmig's processes (watch reflectors, the allocation loop, leader election,
the webhook's maintenance, the kubelet plugin's slice publisher, health and reconcile loops) runs its
body through a `LoopRunner`, so no exception type (urllib3's `MaxRetryError`/`ReadTimeoutError`/
`ProtocolError` included) can end a loop for good while `/healthz` still answers 200. Standard library
and structlog only (driver/ imports no kubernetes or grpc), so controller/ and kubeletplugin/ both use it.

API (stable):

    runner = LoopRunner(
        "slices",              # name: thread name, log field, health text
        body,                  # Callable[[], None]: ONE iteration; may raise anything
        interval_s=30.0,       # pause after a successful iteration (0: none)
        wake=None,             # optional threading.Event: set it to end the pause early (cleared on use);
                               # with interval_s=0 the loop then pauses until it is set
        stuck_after_s=120.0,   # unhealthy when one iteration runs this long without a heartbeat
        backoff_start_s=0.5, backoff_max_s=30.0,   # after a failure: start * 2**n, capped, with jitter
                                                   # (driver/backoff.py)
        on_error=None,         # optional Callable[[Exception], None], e.g. a metric's inc()
        stop=None,             # optional shared threading.Event; set() stops the loop (within 0.5 s)
    )
    runner.start()             # run in a new daemon thread named `name`
    runner.run()               # ...or run in the calling thread until stopped
    runner.beat()              # from the body during long work (each watch event, each item)
    runner.wake()              # end the current pause now (sets `wake`, creating one if none)
    runner.stop(); runner.join(timeout_s)
    runner.health()            # LoopHealth(name, ok, reason, failures, consecutive_failures, last_error)

    group = LoopGroup()        # what a process's /healthz asks
    group.add(runner)          # returns the runner
    ok, text = group.check()   # ok False when any loop is dead (thread ended, not stopped) or stuck

A failing iteration is not unhealthy by itself (an unreachable API server is not cured by restarting
the process); `health().reason` names the failures so the probe's text shows them.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from driver.backoff import Backoff

log = structlog.get_logger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
STUCK_AFTER_S = 120.0
_PAUSE_SLICE_S = 0.5


@dataclass(frozen=True, slots=True)
class LoopHealth:
    name: str
    ok: bool
    reason: str
    failures: int
    consecutive_failures: int
    last_error: str


class LoopRunner:
    def __init__(
        self,
        name: str,
        body: Callable[[], None],
        *,
        interval_s: float = 0.0,
        wake: threading.Event | None = None,
        stuck_after_s: float = STUCK_AFTER_S,
        backoff_start_s: float = BACKOFF_START_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        on_error: Callable[[Exception], None] | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if interval_s < 0 or stuck_after_s <= 0 or not 0 < backoff_start_s <= backoff_max_s:
            raise ValueError(
                f"loop {name}: need interval_s >= 0 (got {interval_s}), stuck_after_s > 0 "
                f"(got {stuck_after_s}), 0 < backoff_start_s <= backoff_max_s "
                f"(got {backoff_start_s}, {backoff_max_s})"
            )
        self.name = name
        self._body = body
        self._interval_s = interval_s
        self._wake = wake if wake is not None else threading.Event()
        self._wait_for_wake = wake is not None  # interval 0 with a wake event: pause until woken
        self._stuck_after_s = stuck_after_s
        self._backoff = Backoff(backoff_start_s, backoff_max_s, rng=rng)
        self._on_error = on_error
        self._stop = stop if stop is not None else threading.Event()
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running = False  # inside run(), in whatever thread
        self._finished = False  # run() returned (stopped, or died)
        self._busy_since: float | None = None  # an iteration is running since (None: pausing)
        self._last_beat = clock()
        self.failures = 0
        self.consecutive_failures = 0
        self.iterations = 0
        self.last_error = ""

    # --- control ------------------------------------------------------------------------------------

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def alive(self) -> bool:
        """Its thread is running (started and not ended)."""
        return self._thread is not None and self._thread.is_alive()

    def beat(self) -> None:
        """The body is making progress (call it during long iterations)."""
        with self._lock:
            self._last_beat = self._clock()

    def wake(self) -> None:
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------------------

    def run(self) -> None:
        with self._lock:
            self._running, self._finished = True, False
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._busy_since = self._last_beat = self._clock()
                try:
                    self._body()
                except Exception as exc:
                    self._failed(exc)
                    try:
                        delay = self._backoff.next_delay()
                    except Exception:  # never let the retry arithmetic end the loop
                        delay = self._backoff.max_s
                    self._pause_for_retry(delay)
                    continue
                self._backoff.reset()
                with self._lock:
                    self.iterations += 1
                    self.consecutive_failures = 0
                    self._busy_since = None
                self._pause()
        finally:
            with self._lock:
                self._running, self._finished, self._busy_since = False, True, None
            if not self._stop.is_set():  # only a BaseException (SystemExit, KeyboardInterrupt) gets here
                log.error("loop ended", loop=self.name)

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            self._busy_since = None
        log.warning(
            "loop iteration failed; retrying with backoff",
            loop=self.name,
            error=self.last_error,
            consecutive_failures=self.consecutive_failures,
            exc_info=exc if self.consecutive_failures == 1 else None,
        )
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception as hook_exc:
                log.warning("loop error hook failed", loop=self.name, error=str(hook_exc))

    def _pause_for_retry(self, delay: float) -> None:
        self._stop.wait(delay)

    def _pause(self) -> None:
        if self._interval_s <= 0 and not self._wait_for_wake:
            return
        # In slices, so that a shared stop event set by someone else ends the pause promptly too.
        deadline = time.monotonic() + self._interval_s if self._interval_s > 0 else None
        while not self._stop.is_set():
            left = _PAUSE_SLICE_S if deadline is None else min(_PAUSE_SLICE_S, deadline - time.monotonic())
            if left <= 0 or self._wake.wait(left):
                break
        self._wake.clear()

    # --- health -------------------------------------------------------------------------------------

    def health(self) -> LoopHealth:
        with self._lock:
            now = self._clock()
            started = self._running or self._finished
            dead = self._finished and not self._stop.is_set()  # run() returned without being stopped
            stuck_for = now - self._last_beat if self._busy_since is not None else 0.0
            failing = self.consecutive_failures
            if dead:
                ok, reason = False, f"loop {self.name} is dead (last error: {self.last_error or 'none'})"
            elif stuck_for > self._stuck_after_s:
                ok, reason = (
                    False,
                    (
                        f"loop {self.name} is stuck: no heartbeat for {stuck_for:.0f} s "
                        f"(limit {self._stuck_after_s:.0f} s)"
                    ),
                )
            elif not started:
                ok, reason = True, f"loop {self.name} not started"
            elif failing:
                ok, reason = True, f"loop {self.name} retrying after {failing} failures: {self.last_error}"
            else:
                ok, reason = True, f"loop {self.name} ok"
            return LoopHealth(self.name, ok, reason, self.failures, failing, self.last_error)


class LoopGroup:
    """The loops of one process, as its health endpoint sees them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: list[LoopRunner] = []

    def add(self, runner: LoopRunner) -> LoopRunner:
        with self._lock:
            self._loops.append(runner)
        return runner

    def loops(self) -> list[LoopRunner]:
        with self._lock:
            return list(self._loops)

    def check(self) -> tuple[bool, str]:
        """(all loops alive and not stuck, one line per loop)."""
        states = [r.health() for r in self.loops()]
        ok = all(s.ok for s in states)
        lines = [("ok   " if s.ok else "FAIL ") + s.reason for s in states]
        return ok, "\n".join(lines) + "\n"

    def stop_all(self) -> None:
        for r in self.loops():
            r.stop()


__all__ = ["LoopGroup", "LoopHealth", "LoopRunner"]
