"""What the searches for room may cost: preemption (preempt.py) and move plans (moves.py) together.

A pod that fits nowhere is decided again at every capacity change (loop.py), and each failed decision
may run a victim search (up to `preemptsearch.MAX_FIT_TESTS` decisions) and a move plan (up to
`moveplan.BUDGET_S`). With many such pods in a busy cluster that would be seconds of searching per
step, every step, while the pods that do fit wait behind them. So, like kube-scheduler's backoff of
unschedulable pods:

- a pod whose search found nothing is not searched again for `RETRY_S` (its plain decision still
  runs at every capacity change: a pod that now fits is placed at once);
- a step spends at most `STEP_BUDGET_S` searching, all pods together; the searches beyond it are
  put off to the next step (a second later at most: the loop steps every second);
- a put-off pod is decided again once it may be searched (`due`), whatever else changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

RETRY_S = 5.0
STEP_BUDGET_S = 1.0


class SearchBudget:
    def __init__(
        self,
        retry_s: float = RETRY_S,
        step_budget_s: float = STEP_BUDGET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_s = retry_s
        self.step_budget_s = step_budget_s
        self.clock = clock
        self._spent_s = 0.0
        self._fruitless: dict[str, float] = {}  # pod key -> when its last search found nothing
        self._put_off: set[str] = set()

    def start_step(self) -> None:
        self._spent_s = 0.0
        now = self.clock()
        self._fruitless = {k: t for k, t in self._fruitless.items() if now - t < self.retry_s}

    def may_search(self, key: str) -> bool:
        """Whether `key` may be searched now; if not, it is put off (see `due`)."""
        last = self._fruitless.get(key)
        if (last is not None and self.clock() - last < self.retry_s) or self._spent_s >= self.step_budget_s:
            self._put_off.add(key)
            return False
        return True

    def searched(self, key: str, seconds: float, found: bool) -> None:
        self._spent_s += seconds
        if found:
            self._fruitless.pop(key, None)
        else:
            self._fruitless[key] = self.clock()

    def forget(self, key: str) -> None:
        """The pod was placed (or is gone): nothing is put off for it any more."""
        self._fruitless.pop(key, None)
        self._put_off.discard(key)

    def due(self) -> set[str]:
        """Put-off pods that may be searched now: the loop decides them again this step."""
        now = self.clock()
        ready = {k for k in self._put_off if now - self._fruitless.get(k, -1e18) >= self.retry_s}
        self._put_off -= ready
        return ready

    def __len__(self) -> int:
        return len(self._put_off)


__all__ = ["RETRY_S", "STEP_BUDGET_S", "SearchBudget"]
