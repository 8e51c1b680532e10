"""A bounded pool that sends the writes of different pods at the same time (issue 23).

Each placed pod costs three or four API writes (finalizer, allocation, gate; a condition), each a
round trip to the API server; sent one pod after another, a burst of 200 pods waited on 600+ round
trips in a row. Here the write *sequence* of one pod runs on one worker thread, in its order, and up
to `concurrency` pods' sequences run at once.

What stays on the controller thread: every decision (each assumes its devices in the ledger before
the next pod is decided, so no later decision can take them, whatever becomes of the writes) and every
change to the ledger, the caches, the pending and dirty sets: a worker only calls the API and returns
the changes to make as effects (`PodWrites`), which the controller applies in `make_room` and `drain`.
Two pods that reference the same claim never have writes in flight together: the second is decided
only after the first's effects are applied (`busy`). With `concurrency` 1 there is no thread: the
caller runs the sequence and applies it at once, which is the sequential behaviour of before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

DEFAULT_WRITE_CONCURRENCY = 32
MAX_WRITE_CONCURRENCY = 64

Effect = Callable[[], object]


class WritesStopped(Exception):
    """A write result applied while waiting for room ended the step (lost leadership, a stale cache):
    the pod being decided was not decided, and it stays dirty."""


@dataclass(slots=True)
class PodWrites:
    """What one pod's write sequence did: the state changes to apply, in order, on the controller
    thread, then the error the sequence ended with (re-raised there, where it was raised before)."""

    key: str
    effects: list[Effect] = field(default_factory=list)
    error: BaseException | None = None


Apply = Callable[[PodWrites], bool]
"""Applies one result on the controller thread; False when the step must stop deciding."""


class WritePool:
    def __init__(self, concurrency: int = 1) -> None:
        if not 1 <= concurrency <= MAX_WRITE_CONCURRENCY:
            raise ValueError(f"write concurrency must be 1 to {MAX_WRITE_CONCURRENCY}, got {concurrency}")
        self.concurrency = concurrency
        self._executor = (
            ThreadPoolExecutor(concurrency, thread_name_prefix="flexmig-writes") if concurrency > 1 else None
        )
        # Insertion order is submission order: results are applied in it when several are done.
        self._in_flight: dict[Future[PodWrites], frozenset[str]] = {}

    @property
    def parallel(self) -> bool:
        return self._executor is not None

    def __len__(self) -> int:
        return len(self._in_flight)

    def busy(self, claim_keys: Iterable[str]) -> bool:
        """Whether a sequence in flight writes any of these claims."""
        keys = frozenset(claim_keys)
        return any(keys & held for held in self._in_flight.values())

    def submit(self, job: Callable[[], PodWrites], claim_keys: Iterable[str]) -> None:
        """Start one pod's sequence; only after `make_room` said there is room."""
        assert self._executor is not None and len(self._in_flight) < self.concurrency
        self._in_flight[self._executor.submit(job)] = frozenset(claim_keys)

    def make_room(self, apply: Apply) -> bool:
        """Apply every finished result, then wait while all workers are busy. False as soon as a
        result stopped the step (nothing more is to be decided; the caller drains)."""
        ok = self._collect(apply, block=False)
        while ok and len(self._in_flight) >= self.concurrency:
            ok = self._collect(apply, block=True)
        return ok

    def drain(self, apply: Apply) -> bool:
        """Wait for every sequence in flight and apply its result; False if any stopped the step."""
        ok = True
        while self._in_flight:
            ok = self._collect(apply, block=True) and ok
        return ok

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _collect(self, apply: Apply, *, block: bool) -> bool:
        if not self._in_flight:
            return True
        done, _ = wait(list(self._in_flight), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        ok = True
        for future in [f for f in self._in_flight if f in done]:
            del self._in_flight[future]
            ok = apply(future.result()) and ok
        return ok


__all__ = [
    "DEFAULT_WRITE_CONCURRENCY",
    "MAX_WRITE_CONCURRENCY",
    "PodWrites",
    "WritePool",
    "WritesStopped",
]
