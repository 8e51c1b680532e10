"""Preemption's and moves' promises carried across leaders: read back once per leadership, written
right after each set of evictions and after each step that changed them (controller/allocation/roomstate.py is the document,
controller/kube/roomstore.py the ConfigMap that holds it).

A new leader reads before its first decision: a read that fails raises (the loop backs off and the
step is tried again; deciding without the promises could hand a waiting pod's room to another), while
a document that cannot be read back (`RoomStateError`, `RoomStoreError`) is reported and the leader
starts with no promises, as every leader did before the document existed. A failed write is reported
and tried again after the next step; it never stops allocation. A
replica not allowed to read the map (401/403) starts without promises too, reported each leadership.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.allocation.roomstate import EMPTY, RoomStateError, dump, restore
from controller.kube.roomstore import RoomStore, RoomStoreError, TooBig
from controller.kube.writer import NotLeader
from controller.state.ledger import Ledger

if TYPE_CHECKING:
    from controller.allocation.preempt import Preemption

log = structlog.get_logger(__name__)

RETRY_S = 5.0  # after a failed write: steps come many a second, a failing write must not follow each


class RoomSync:
    def __init__(
        self,
        store: RoomStore | None,
        on_error: Callable[[str], None] = lambda _stage: None,
        *,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.on_error = on_error
        self.restored = store is None  # nothing to read without a store
        self._mono, self._wall = mono, wall
        # One reading of both clocks per leadership, for every conversion between them: two readings
        # per write would differ by microseconds, and times rounded to the millisecond would then
        # change now and then with nothing else changed, rewriting the map for nothing.
        self._epoch = (mono(), wall())
        self._retry_at = float("-inf")
        self._trimmed_to: int | None = None

    def lost(self) -> None:
        """Not leading: the next leadership reads the document again (another leader may have
        changed it meanwhile)."""
        self.restored = self.store is None

    def restore_once(self, preemption: Preemption, ledger: Ledger) -> None:
        """Before the first decision of a leadership. Raises when the read fails."""
        if self.restored or self.store is None:
            return
        self._epoch = (self._mono(), self._wall())
        try:
            doc = self.store.load()
        except RoomStoreError as exc:
            self._bad(preemption, ledger, str(exc))
            return
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise
            # Not allowed (a chart without the ConfigMap's rule): allocating matters more than this.
            self._bad(preemption, ledger, f"reading configmap {self.store.name}: {exc.status} {exc.reason}")
            return
        try:
            restore(preemption, ledger, EMPTY if doc is None else doc, *self._epoch)
        except RoomStateError as exc:
            self._bad(preemption, ledger, str(exc))
            return
        self.restored = True
        noms, moves = preemption.nominations.entries, preemption.moves.active
        if noms or moves:
            log.info("promises of the previous leader read back", nominations=len(noms), moves=len(moves))

    def save(self, preemption: Preemption) -> None:
        """After a leading step: write the document if it changed. Never raises."""
        if self.store is None or not self.restored or self._mono() < self._retry_at:
            return
        doc = dump(preemption, *self._epoch)
        if doc == EMPTY and self.store.absent():
            return  # nothing promised and nothing stored: no map in a cluster that never needed one
        try:
            self._save_within_bounds(doc)
        except NotLeader:
            pass  # the next leader reads what the last completed write left
        except Exception as exc:
            self.on_error("room-state-write")
            self._retry_at = self._mono() + RETRY_S
            log.warning("writing the room state failed; tried again after the next step", error=str(exc),
                        retry_s=RETRY_S)  # fmt: skip

    def _save_within_bounds(self, doc: dict[str, Any]) -> None:
        """Too big for the map (hundreds of preemptors waiting at once): the oldest nominations go
        first, halved until it fits; the moves, far fewer (rate-limited), are always kept."""
        assert self.store is not None
        while True:
            try:
                self.store.save(doc)
                return
            except TooBig:
                kept = doc["nominations"]
                if not kept:
                    raise
                doc = {**doc, "nominations": kept[: len(kept) // 2]}  # dump lists the newest first
                if self._trimmed_to != len(doc["nominations"]):  # once per size, not every step
                    self._trimmed_to = len(doc["nominations"])
                    log.warning("room state too big: only the newest nominations kept", kept=self._trimmed_to)

    def _bad(self, preemption: Preemption, ledger: Ledger, why: str) -> None:
        self.on_error("room-state-read")
        log.error("the stored room state cannot be read; starting without promises", error=why)
        restore(preemption, ledger, EMPTY, *self._epoch)
        self.restored = True


__all__ = ["RoomSync"]
