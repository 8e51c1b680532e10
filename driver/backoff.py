"""Retry delays for a failing operation: exponential, capped, with jitter.

Every loop of flexmig that retries a failing call to the API server (or anything else) takes its delay
from here: the background loops through `driver/looprunner.py::LoopRunner`, the kubelet plugin's
start-up permission check (kubeletplugin/kube/access.py) directly. Standard library only.

    backoff = Backoff(start_s=0.5, max_s=30.0)   # jitter=0.5: each delay is stretched by 0..50 %
    delay = backoff.next_delay()                 # 0.5, 1, 2, 4, ... capped at 30, each times 1..1.5
    backoff.reset()                              # after a success: the next failure starts again at 0.5

Jitter only ever lengthens a delay, so `max_s * (1 + jitter)` bounds it; it keeps many processes that
fail together (an API-server restart) from retrying in lockstep.
"""

from __future__ import annotations

import random
from collections.abc import Callable

DEFAULT_JITTER = 0.5
_MAX_DOUBLINGS = 60  # 2**60 x any sane start_s is past any max_s


def backoff_delay(
    attempt: int, start_s: float, max_s: float, rng: Callable[[], float], jitter: float = DEFAULT_JITTER
) -> float:
    """Delay before retry `attempt` (1 = first retry): `start_s * 2**(attempt-1)` capped at `max_s`,
    times `1 + jitter * rng()` (`rng` returns a number in [0, 1))."""
    # The exponent is capped: 2.0 ** 1024 overflows, and a loop failing for hours must keep retrying.
    base = min(start_s * 2.0 ** min(max(0, attempt - 1), _MAX_DOUBLINGS), max_s)
    return base * (1 + rng() * jitter) if jitter else base


class Backoff:
    """The delays of one retried operation; not thread-safe (one loop owns one)."""

    def __init__(
        self,
        start_s: float,
        max_s: float,
        *,
        jitter: float = DEFAULT_JITTER,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < start_s <= max_s or jitter < 0:
            raise ValueError(
                f"backoff needs 0 < start_s <= max_s and jitter >= 0 (got {start_s}, {max_s}, {jitter})"
            )
        self.start_s = start_s
        self.max_s = max_s
        self.jitter = jitter
        self._rng = rng
        self.attempts = 0  # delays handed out since the last reset

    def next_delay(self) -> float:
        """The delay before the next retry; each call counts one more failed attempt."""
        self.attempts += 1
        return backoff_delay(self.attempts, self.start_s, self.max_s, self._rng, self.jitter)

    def reset(self) -> None:
        """The operation succeeded: the next failure waits `start_s` again."""
        self.attempts = 0


__all__ = ["DEFAULT_JITTER", "Backoff", "backoff_delay"]
