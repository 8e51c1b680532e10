"""Priority preemption in controller mode: evict lower-priority pods on one node to make room.

A gated pod is never scheduled, so kube-scheduler never preempts for it; the controller does, with
kube-scheduler's rules (docs/preemption.md). When a pod's decision fails for lack of room
(`PREEMPTION_HELPS`), the pods whose eviction would free devices of ours are listed per node
(controller/allocation/preemptpods.py), and the cheapest victim set is searched
(controller/allocation/preemptsearch.py), each candidate set tested by the real decider on the
ledger with the victims' claims removed (`claims_freed`): MIG layout, counters, constraints and
node filters decide, nothing approximates them. The chosen set is evicted through the Eviction API
(controller/kube/writer.py `Writer.evict_pod`: PodDisruptionBudgets honoured, graceful termination),
lowest priority first; the freed devices are held for the preemptor (controller/allocation/nominate.py)
and both sides get an Event (`Preempted` on each victim, `Preempting` on the preemptor).

Boundaries: an eviction refused by a PodDisruptionBudget (429) is not retried for `REFUSED_RETRY_S`;
when it is the first of its set, the next set is tried in the same step, otherwise the pods already
evicted count as going in the next search, which completes around them instead of starting over. An
eviction whose answer was lost (controller/kube/outcome.py) is never sent again: the pod is taken as
possibly evicted and the nomination holds what it frees if it goes. Every exception other than lost
leadership stays here: a failed preemption leaves the pod waiting as it would without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from controller.allocation.decide import ControllerReason, Decider, Decision
from controller.allocation.freed import claims_freed
from controller.allocation.moves import Moves
from controller.allocation.nominate import HOLD_S, Nomination, Nominations
from controller.allocation.preemptpods import Candidate, candidates_by_node, may_preempt, priority
from controller.allocation.preemptsearch import VictimSet, victim_sets
from controller.allocation.searchbudget import SearchBudget
from controller.claims.candidates import CandidateIndex
from controller.kube.outcome import Outcome, write_outcome
from controller.kube.store import object_key
from controller.kube.watchcache import WatchCache
from controller.kube.writer import NotLeader, Writer
from controller.state.ledger import Held, Ledger
from driver.policy.model import EndHint, ShortReason
from driver.policy.placer import Placer

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
REFUSED_RETRY_S = 60.0
MAX_REFUSALS_PER_STEP = 3  # then the pod waits for the next step: a search is up to 64 decisions per node
PREEMPTION_HELPS = frozenset(
    {
        ShortReason.NO_FREE_PLACEMENT.value,
        ShortReason.FRAGMENTED.value,
        ShortReason.NO_SINGLE_NODE.value,
        ControllerReason.CONSTRAINT_UNSATISFIED.value,
    }
)
"""Failures that freeing devices can cure; the others (no such device or profile, an invalid claim, a
lost write) stay whatever is evicted."""


class State(Protocol):
    """What of the controller's state a preemption reads (controller/allocation/loop.py `Controller`)."""

    cache: WatchCache
    writer: Writer | None
    placer: Placer
    ledger: Ledger
    index: CandidateIndex


class Preemption:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        enabled: bool = True,
        hold_s: float = HOLD_S,
        moves: Moves | None = None,
        budget: SearchBudget | None = None,
    ) -> None:
        self.enabled = enabled
        self.budget = budget or SearchBudget()
        self.nominations = Nominations(hold_s)
        # Moving movable pods (controller/allocation/moves.py): tried when preemption finds nothing;
        # it reserves the waiting pod's placement with the same nominations. Off unless configured.
        self.moves = moves or Moves(registry=None)
        # Called right after evictions were sent and the promises recorded: the controller writes
        # them for the next leader then (controller/allocation/roomsync.py), not only after the step.
        self.persist: Callable[[], None] = lambda: None
        self.moves.bind(self.nominations, self._evict, self._event, lambda: self.persist())
        self.refused: dict[str, float] = {}  # victim pod uid -> until when a PDB is taken to refuse it
        self._expired_seen = 0
        kw: dict[str, Any] = {"registry": registry}  # None: not registered (unit tests)
        self.evictions = Counter(
            "flexmig_preemption_evictions",
            "Evictions the controller sent to make room for a pod of higher priority, by result "
            "(evicted, refused by a PodDisruptionBudget, unknown: the answer was lost, failed).",
            ["result"],
            **kw,
        )
        self.preemptions = Counter(
            "flexmig_preemptions",
            "Pods for which the controller evicted lower-priority pods (or nominated).",
            **kw,
        )
        self.searches = Counter(
            "flexmig_preemption_searches",
            "Searches for room (preemption, then moves) for pods that fit nowhere, by result: found, "
            "nothing, or put off (the pod's last search found nothing less than 5 s ago, or the step's "
            "1 s of searching is spent; controller/allocation/searchbudget.py).",
            ["result"],
            **kw,
        )
        self.expired = Counter(
            "flexmig_preemption_nominations_expired",
            "Nominations that ended without the preemptor being placed (held devices given back).",
            **kw,
        )

    # --- the nominee's hold, around every step and decision ----------------------------------------------

    def start_step(
        self, ledger: Ledger, pods: Mapping[str, Mapping[str, Any]], writer: Writer | None = None
    ) -> None:
        now = time.monotonic()
        self.budget.start_step()
        live = (str((p.get("metadata") or {}).get("uid")) for p in pods.values())
        try:
            self.nominations.hold(ledger, pods, live, now)
        except Exception as exc:  # a hold not renewed this step is renewed by the next; allocation goes on
            log.exception("holding nominated devices failed", error=str(exc))
        if self.nominations.expired > self._expired_seen:
            self.expired.inc(self.nominations.expired - self._expired_seen)
            self._expired_seen = self.nominations.expired
        try:  # after the nominations: a move's reservation for a pod ends with its nomination
            self.moves.start_step(ledger, pods, writer, now)
        except NotLeader:
            raise
        except Exception as exc:  # as for the holds above: the next step tries again
            log.exception("holding move reservations failed", error=str(exc))
        self.refused = {u: t for u, t in self.refused.items() if t > now}

    def before_decide(self, ledger: Ledger, pod_key: str) -> None:
        self.nominations.release(ledger, pod_key)
        self.moves.release_target(ledger, pod_key)

    def not_placed(self, ledger: Ledger, pod_key: str) -> None:
        self.nominations.hold_one(ledger, pod_key)
        self.moves.not_placed(ledger, pod_key)

    def placed(self, ledger: Ledger, pod_key: str) -> None:
        self.budget.forget(pod_key)
        self.nominations.drop(ledger, pod_key)
        self.moves.placed(ledger, pod_key)

    # --- preemption --------------------------------------------------------------------------------

    def preempt(
        self,
        st: State,
        pod: Obj,
        todo: Sequence[Mapping[str, Any]],
        node_ok: Callable[[str], bool],
        end_hint: EndHint | None,
        decision: Decision,
    ) -> str | None:
        """After `decision` failed for `pod`: evict and nominate where that makes it fit. The text for
        the pod's condition (reason `Preempting`), or None when preemption does not help (or is off,
        or failed: logged, and the pod waits as it would without preemption)."""
        if st.writer is None or decision.reason not in PREEMPTION_HELPS:
            return None
        if self.moves.is_replacement(pod):  # it waits for the room reserved for it, evicting nobody
            return None
        key = object_key(pod)
        nom = self.nominations.get(key)
        if nom is not None:
            return f"preempting on node {nom.node}: waiting for the evicted pods to end; their devices are held for this pod"
        if not self._may_try(pod):
            return None
        if not self.budget.may_search(key):
            self.searches.labels("put_off").inc()
            return None
        started = time.monotonic()
        found: str | None = None
        try:
            found = self._preempt(st, pod, todo, node_ok, end_hint) if self.enabled else None
            if found is None:
                found = self.moves.make_room(st, pod, todo, node_ok, end_hint)
            return found
        except NotLeader:
            raise
        except Exception as exc:
            log.exception("preemption failed; the pod waits", pod=object_key(pod), error=str(exc))
            return None
        finally:
            self.budget.searched(key, time.monotonic() - started, found is not None)
            self.searches.labels("found" if found is not None else "nothing").inc()

    def _may_try(self, pod: Obj) -> bool:
        """Whether any search could run for `pod` (preemption on and allowed to it, or moves on)."""
        return (self.enabled and may_preempt(pod)) or self.moves.settings.enabled

    def will_search(self, pod: Obj, decision: Decision) -> bool:
        """Whether `preempt` would search for `pod` now: only then does the caller wait for the writes
        in flight first (victims are chosen on what they left), so a pod that cannot be helped, or
        whose search is put off, never holds up the others' writes."""
        if decision.reason not in PREEMPTION_HELPS or self.moves.is_replacement(pod):
            return False
        key = object_key(pod)
        if key in self.nominations.entries or not self._may_try(pod):
            return False
        return self.budget.may_search(key)

    def _preempt(
        self,
        st: State,
        pod: Obj,
        todo: Sequence[Mapping[str, Any]],
        node_ok: Callable[[str], bool],
        end_hint: EndHint | None,
    ) -> str | None:
        if not may_preempt(pod):
            return None
        prio = priority(pod)
        # Pods another preemptor already chose: what they free is held for that one, not this.
        promised = {uid for nom in self.nominations.entries.values() for uid in nom.victims}
        listed = candidates_by_node(st.cache["pods"].values(), st.cache["resourceclaims"], st.ledger)
        by_node: dict[str, list[Candidate]] = {}
        for node, pods in listed.items():
            mine = [p for p in pods if p.uid not in promised]
            if node_ok(node) and any(p.priority < prio for p in mine):
                by_node[node] = mine
        if not by_node:
            return None
        fits = self._fits(st, todo, node_ok, end_hint)
        for _ in range(MAX_REFUSALS_PER_STEP):
            sets = victim_sets(by_node, prio, fits, skip=set(self.refused))
            if not sets:
                return None
            message = self._carry_out(st, pod, prio, sets[0])
            if message is not None:
                return message
            # Its first eviction was refused: the search again without that pod (on any node).
        return None

    def _fits(
        self,
        st: State,
        todo: Sequence[Mapping[str, Any]],
        node_ok: Callable[[str], bool],
        end_hint: EndHint | None,
    ) -> Callable[[str, Sequence[Candidate]], bool]:
        classes = st.cache["deviceclasses"]
        placer = Placer(st.placer.policy, 0.0)  # no burst plan: a test must not follow (or use) one

        def fits(node: str, gone: Sequence[Candidate]) -> bool:
            with claims_freed(st.ledger, {u for p in gone for u in p.claims}):
                decision = Decider(st.ledger, st.index, placer).decide(
                    todo, classes, node_ok=lambda n: n == node and node_ok(n), end_hint=end_hint
                )
            return decision.ok

        return fits

    def _carry_out(self, st: State, pod: Obj, prio: int, found: VictimSet) -> str | None:
        """Evict `found`'s victims, lowest priority first; nominate once all went. The condition text,
        or None when the first eviction was refused (the caller tries the next set)."""
        assert st.writer is not None
        evicted: list[Candidate] = []
        for victim in found.victims:
            target = st.cache["pods"].get(victim.key)
            if target is None or str(target["metadata"].get("uid")) != victim.uid:
                evicted.append(victim)  # gone already: what it held is freed
                continue
            result = self._evict(st.writer, target)
            self.evictions.labels(result).inc()
            if result in ("evicted", "unknown"):
                evicted.append(victim)
                continue
            self.refused[victim.uid] = time.monotonic() + REFUSED_RETRY_S
            log.info("eviction refused", pod=object_key(pod), victim=victim.key, result=result)
            if not evicted:
                return None
            names = ", ".join(v.key for v in evicted)
            self._event(st.writer, pod, "Warning", "PreemptionRefused",
                        f"evicting {victim.key} on node {found.node} was refused ({result}); {names} "
                        f"already evicted: the next attempt completes around them")  # fmt: skip
            return f"preempting on node {found.node}: evicted {names}; {victim.key} refused ({result}), retried later"
        self.preemptions.inc()
        devices: set[Held] = set()
        for gone in (*found.victims, *found.going):
            for claim_uid in gone.claims:
                devices |= set(st.ledger.claims.get(claim_uid, ()))
        meta = pod["metadata"]
        self.nominations.add(
            st.ledger,
            Nomination(
                object_key(pod),
                str(meta.get("uid")),
                found.node,
                frozenset(v.uid for v in (*found.victims, *found.going)),
                frozenset(devices),
                time.monotonic(),
            ),
        )
        self.persist()
        if not found.victims:
            going = ", ".join(v.key for v in found.going)
            return f"nominated on node {found.node}: {going} already terminating free what this pod needs"
        who = ", ".join(f"{v.key} (priority {v.priority})" for v in found.victims)
        log.info("preempting", pod=object_key(pod), node=found.node, victims=who)
        for victim in found.victims:
            target = st.cache["pods"].get(victim.key)
            if target is not None:
                self._event(st.writer, target, "Normal", "Preempted",
                            f"Preempted by pod {object_key(pod)} (priority {prio}) on node {found.node}: "
                            f"its GPU devices are needed by a pod of higher priority")  # fmt: skip
        self._event(st.writer, pod, "Normal", "Preempting",
                    f"evicting {who} on node {found.node} to free the GPU devices this pod needs; "
                    f"they are held for this pod until it is placed")  # fmt: skip
        return f"preempting on node {found.node}: evicted {who}; waiting for them to end"

    @staticmethod
    def _evict(writer: Writer, target: Obj) -> str:
        """`evicted` (or gone), `refused` (a PodDisruptionBudget: 429), `unknown` (the answer was
        lost: never sent again), `failed` (any other refusal, e.g. RBAC)."""
        try:
            writer.evict_pod(target)
        except NotLeader:
            raise
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or replaced by a pod of another uid: not ours to evict
                return "evicted"
            if exc.status == 429:
                return "refused"
            if write_outcome(exc) is Outcome.UNKNOWN:
                return "unknown"
            log.warning("eviction failed", pod=object_key(target), status=exc.status, error=str(exc)[:300])
            return "failed"
        except Exception as exc:
            if write_outcome(exc) is Outcome.UNKNOWN:
                return "unknown"
            log.warning("eviction not sent", pod=object_key(target), error=str(exc))
            return "failed"
        return "evicted"

    @staticmethod
    def _event(writer: Writer, pod: Obj, kind: str, reason: str, message: str) -> None:
        try:
            writer.event(pod, "Pod", kind, reason, message)
        except NotLeader:
            raise
        except Exception as exc:  # an Event is information: never what stops the preemption
            log.warning("event not written", pod=object_key(pod), reason=reason, error=str(exc))


__all__ = ["PREEMPTION_HELPS", "REFUSED_RETRY_S", "Preemption", "claims_freed"]
