"""Nominations: the devices freed by a preemption are held for the pod that preempted.

Without a hold, the placements a preemption frees go to whichever pod the next step decides first (a
smaller pod, or the victim's own replacement from its Deployment), and the preemptor, which paid for
them with other pods' work, waits again. So each nomination is a reservation in the ledger under a
holder name of its own (`nominated/<pod uid>`, never a claim uid): every device the victims' claims
held is taken by it as soon as the ledger shows it free, so no other pod's decision, the burst plan
and the counters check included, can take it. Only the preemptor's own decision releases it first
(`release`); after a decision that failed it is held again (`hold_one`).

A nomination ends when the preemptor is allocated (`drop`), deleted or no longer gated, or gives up:
`hold_s` after the last victim is gone (the pod should have been placed in the next step; if the
cluster changed so that it no longer fits, the capacity goes back to everyone), or
`VICTIM_WAIT_S` after the eviction while victims are still terminating (a pod stuck in termination
must not hold a GPU forever). It outlives the leader in the room state (controller/allocation/roomstate.py);
were it lost (the leader died between the evictions and the write after them), the new leader's search counts the
victims still terminating as going (controller/allocation/preemptpods.py) and nominates again without
evicting more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from controller.claims.podclaims import is_gated
from controller.state.ledger import Held, Ledger

log = structlog.get_logger(__name__)

HOLD_S = 120.0
VICTIM_WAIT_S = 900.0


@dataclass(slots=True)
class Nomination:
    pod_key: str
    pod_uid: str
    node: str
    victims: frozenset[str]  # pod uids
    devices: frozenset[Held]
    since: float
    all_gone_at: float | None = None

    @property
    def holder(self) -> str:
        return f"nominated/{self.pod_uid}"


class Nominations:
    def __init__(self, hold_s: float = HOLD_S, victim_wait_s: float = VICTIM_WAIT_S) -> None:
        self.hold_s = hold_s
        self.victim_wait_s = victim_wait_s
        self.entries: dict[str, Nomination] = {}
        self.expired = 0  # nominations that gave up (a metric)

    def __contains__(self, pod_key: str) -> bool:
        return pod_key in self.entries

    def get(self, pod_key: str) -> Nomination | None:
        return self.entries.get(pod_key)

    def add(self, ledger: Ledger, nomination: Nomination) -> None:
        self.drop(ledger, nomination.pod_key)
        self.entries[nomination.pod_key] = nomination
        self._take_free(ledger, nomination)

    def hold(
        self, ledger: Ledger, pods: Mapping[str, Mapping[str, Any]], live: Iterable[str], now: float
    ) -> None:
        """At the start of a step: end nominations whose pod is gone, placed or out of time, and take
        every reserved device that became free for the others. `live`: uids of pods that exist."""
        if not self.entries:
            return  # every step runs this: no set of every pod's uid when nothing is nominated
        alive = set(live)
        for key, nom in list(self.entries.items()):
            pod = pods.get(key)
            if (
                pod is None
                or str((pod.get("metadata") or {}).get("uid")) != nom.pod_uid
                or not is_gated(dict(pod))
            ):
                self.drop(ledger, key)
                continue
            if nom.all_gone_at is None and not (nom.victims & alive):
                nom.all_gone_at = now
            if (nom.all_gone_at is not None and now - nom.all_gone_at > self.hold_s) or (
                nom.all_gone_at is None and now - nom.since > self.victim_wait_s
            ):
                log.info("nomination given up", pod=key, node=nom.node, held_s=round(now - nom.since, 1))
                self.expired += 1
                self.drop(ledger, key)
                continue
            self._take_free(ledger, nom)

    def release(self, ledger: Ledger, pod_key: str) -> None:
        """Before the preemptor's own decision: what is held for it is free to it."""
        nom = self.entries.get(pod_key)
        if nom is not None:
            ledger.forget(nom.holder)

    def hold_one(self, ledger: Ledger, pod_key: str) -> None:
        """After a decision of the preemptor that did not place it: held for it again."""
        nom = self.entries.get(pod_key)
        if nom is not None:
            self._take_free(ledger, nom)

    def drop(self, ledger: Ledger, pod_key: str) -> None:
        nom = self.entries.pop(pod_key, None)
        if nom is not None:
            ledger.forget(nom.holder)

    @staticmethod
    def _take_free(ledger: Ledger, nom: Nomination) -> None:
        mine = set(ledger.claims.get(nom.holder, ()))
        free = {d for d in nom.devices if d in mine or not ledger.holders(d)}
        if not free:
            ledger.forget(nom.holder)
        elif free != mine:
            ledger.assume(nom.holder, free)


__all__ = ["HOLD_S", "VICTIM_WAIT_S", "Nomination", "Nominations"]
