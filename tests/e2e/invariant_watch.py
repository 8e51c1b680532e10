"""The soak's invariants (tests/soak/invariants.py, settle.py) on a Scenario while one test runs.

`InvariantWatch` reads the truth (every claim's allocation and the slices from the API server, the
simulated GPUs' instances, the plugins' checkpoints; tests/soak/truth.py) every `every_s` in a thread
and keeps every continuous violation it sees (a device in two claims, overlapping placements, a
counter over its value). `settle()` then polls until the settled invariants hold (every instance
belongs to an allocated claim and every running pod's MIG device has its instance: nothing leaked,
nothing missing), and reports both.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from tests.soak.invariants import Violation, exclusive_devices, gpu_geometry
from tests.soak.settle import settled
from tests.soak.truth import Truth, gather

from .scenario import Scenario


class InvariantWatch:
    def __init__(self, sc: Scenario, namespace: str, every_s: float = 0.5) -> None:
        self.sc, self.namespace, self.every_s = sc, namespace, every_s
        self.seen: dict[tuple[str, str], Violation] = {}
        self.checks = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="invariant-watch", daemon=True)

    def truth(self) -> Truth:
        return gather(self.sc.api, self.namespace, self.sc.nodes, lambda: [])

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                t = self.truth()
                for v in exclusive_devices(t) + gpu_geometry(t):
                    self.seen.setdefault(v.key, v)
                self.checks += 1
            except Exception as exc:  # an API server busy for a moment: the next round reads again
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.every_s)

    def __enter__(self) -> InvariantWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Stop watching, wait for the settled invariants, and fail on any violation seen."""
        self._stop.set()
        self._thread.join(10)
        deadline = time.monotonic() + timeout_s
        left = settled(self.truth(), sorted(self.sc.nodes))
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = settled(self.truth(), sorted(self.sc.nodes))
        found = list(self.seen.values()) + left
        assert self.checks > 0, f"the invariants were never read: {self.errors[-3:]}"
        assert not found, "\n".join(v.render() for v in found)


__all__ = ["InvariantWatch"]
