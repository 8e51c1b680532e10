"""Moving movable pods to make room for a pod that fits nowhere (docs/moves.md).

Tried after priority preemption found nothing (controller/allocation/preempt.py calls `make_room`).
The plan (controller/allocation/moveplan.py, fit tests by the real decider in movefit.py) names the
fewest movable pods (controller/allocation/movable.py) whose re-placement makes room, and a
destination for each. Carried out in this order, so that nothing is evicted without somewhere to go:

1. reserve: each destination is held in the ledger under `moving/<moved pod uid>`, and the waiting
   pod's placement under `making-room/<pod uid>` (controller/allocation/reserve.py: as much of each
   placement as the pods still running there leave placeable, growing as they go); the waiting pod is
   also nominated (controller/allocation/nominate.py), so that no preemption counts on the moved pods
   and the reservation ends with the nomination;
2. evict each moved pod through the Eviction API (PodDisruptionBudgets honoured). The first refused:
   every reservation is given back at once, and that pod is not tried for `REFUSED_RETRY_S`; a later
   one refused: its own reservation goes, the others' moves go on;
3. the replacement its controller creates (same controller owner, same claim templates, gated) is
   decided on the destination node only, with its reservation released to it just before
   (`before_decide`); once placed, the move is complete.

A move gives up, releasing its reservation, when its pod has not ended `VICTIM_WAIT_S` after the
eviction, or no replacement was placed `timeout_s` after it ended; each outcome is counted in
`flexmig_moves_total{result}` and a give-up is an Event on the waiting pod. Moves are rate-limited
(`per_node` evictions per node and `per_cluster` in all per `RATE_WINDOW_S`), a pod (or its
replacement) is never moved twice within `window_s`, and the whole feature is off unless enabled.
The state outlives the leader in the room state (controller/allocation/roomstate.py, written right
after the evictions and after every step that changed it); a move whose leader died between its
evictions and that write completes as a plain recreation (its replacement placed by the policy
wherever it fits).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from controller.allocation.movable import (
    MIN_REMAINING_S,
    age_s,
    claim_shape,
    controller_owner,
    why_not_movable,
)
from controller.allocation.movefit import homes_test, room_test
from controller.allocation.moveplan import MAX_MOVES, Destination, MovePlan, plan_moves
from controller.allocation.nominate import VICTIM_WAIT_S, Nomination, Nominations
from controller.allocation.preemptpods import Candidate, candidates_by_node
from controller.allocation.reserve import hold_cover
from controller.kube.store import object_key
from controller.runtime import crashpoints
from controller.state.ledger import Held, Ledger
from driver.policy.model import EndHint

if TYPE_CHECKING:
    from controller.allocation.preempt import State

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
RATE_WINDOW_S = 600.0
REFUSED_RETRY_S = 60.0


@dataclass(frozen=True, slots=True)
class MoveSettings:
    enabled: bool = False
    namespaces: frozenset[str] = frozenset()  # movable by default (the pod annotation overrides)
    window_s: float = 3600.0  # never move a pod (or its replacement) twice within this
    timeout_s: float = 300.0  # after the moved pod ended, for its replacement to be placed
    min_remaining_s: float = MIN_REMAINING_S
    per_node: int = 2  # evictions per source node per RATE_WINDOW_S
    per_cluster: int = 10
    max_moves: int = MAX_MOVES


@dataclass(slots=True)
class Move:
    pod_key: str
    pod_uid: str
    owner: str
    shape: tuple[tuple[str, str], ...]
    source: str
    dest: Destination
    for_pod: str  # the waiting pod's key
    since: float
    gone_at: float | None = None
    replacement: str | None = None  # the replacement pod's key, once matched
    replacement_uid: str = ""

    @property
    def holder(self) -> str:
        return f"moving/{self.pod_uid}"


Evict = Callable[[Any, Obj], str]
Emit = Callable[[Any, Obj, str, str, str], None]


@dataclass(slots=True)
class _Hooks:
    nominations: Nominations
    evict: Evict
    event: Emit
    persist: Callable[[], None]


class Moves:
    def __init__(
        self, settings: MoveSettings | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings or MoveSettings()
        self.active: dict[str, Move] = {}  # moved pod uid -> move
        self.moved: dict[str, float] = {}  # pod uid (moved, or a replacement) -> when
        self.recent: deque[tuple[float, str]] = deque()  # (when, source node) of each eviction
        self.refused: dict[str, float] = {}
        self.targets: dict[str, tuple[str, frozenset[Held]]] = {}  # waiting pod key -> (uid, placement)
        self.hooks: _Hooks | None = None
        self.results = Counter(
            "flexmig_moves",
            "Pods moved to make room for a pod that fit nowhere, by result (evicted, completed: the "
            "replacement placed at its destination, refused by a PodDisruptionBudget, unknown: the "
            "eviction's answer was lost, failed, not_ended, not_recreated: given up after the timeout).",
            ["result"],
            registry=registry,
        )

    def bind(
        self, nominations: Nominations, evict: Evict, event: Emit, persist: Callable[[], None] = lambda: None
    ) -> None:
        """The preemption's nominations, eviction and event writer, and what records the promises for
        the next leader (controller/allocation/preempt.py)."""
        self.hooks = _Hooks(nominations, evict, event, persist)

    # --- around every step and decision ------------------------------------------------------------

    def start_step(
        self, ledger: Ledger, pods: Mapping[str, Mapping[str, Any]], writer: Any, now: float
    ) -> None:
        """Give up the moves out of time; hold every destination that is free."""
        window = self.settings.window_s
        self.moved = {u: t for u, t in self.moved.items() if now - t < window}
        while self.recent and now - self.recent[0][0] >= RATE_WINDOW_S:
            self.recent.popleft()
        self.refused = {u: t for u, t in self.refused.items() if t > now}
        # Every step runs this: the set of every pod's uid only while a move is under way.
        alive = {str((p.get("metadata") or {}).get("uid")) for p in pods.values()} if self.active else set()
        for key, (uid, devices) in list(self.targets.items()):
            if self.hooks is None or key not in self.hooks.nominations:  # placed, gone or given up
                self.drop_target(ledger, key)
            else:
                hold_cover(ledger, f"making-room/{uid}", devices)
        for uid, move in list(self.active.items()):
            if move.gone_at is None and uid not in alive:
                move.gone_at = now
            if move.gone_at is None and now - move.since > VICTIM_WAIT_S:
                self._give_up(ledger, pods, writer, move, "not_ended", "its pod did not end")
            elif move.gone_at is not None and now - move.gone_at > self.settings.timeout_s:
                self._give_up(ledger, pods, writer, move, "not_recreated", "no replacement was placed")
            else:
                self._hold(ledger, move)

    def before_decide(
        self, ledger: Ledger, pod: Mapping[str, Any], node_ok: Callable[[str], bool]
    ) -> Callable[[str], bool]:
        """For a moved pod's replacement: its reservation released to it, and only its destination."""
        move = self._replacement_of(pod)
        if move is None:
            return node_ok
        ledger.forget(move.holder)
        dest = move.dest.node
        return lambda n: n == dest and node_ok(n)

    def release_target(self, ledger: Ledger, pod_key: str) -> None:
        """Before the waiting pod's own decision: the room made for it is free to it."""
        if pod_key in self.targets:
            ledger.forget(f"making-room/{self.targets[pod_key][0]}")

    def drop_target(self, ledger: Ledger, pod_key: str) -> None:
        entry = self.targets.pop(pod_key, None)
        if entry is not None:
            ledger.forget(f"making-room/{entry[0]}")

    def not_placed(self, ledger: Ledger, pod_key: str) -> None:
        if pod_key in self.targets:
            uid, devices = self.targets[pod_key]
            hold_cover(ledger, f"making-room/{uid}", devices)
        for move in self.active.values():
            if move.replacement == pod_key:
                self._hold(ledger, move)

    def placed(self, ledger: Ledger, pod_key: str) -> None:
        self.drop_target(ledger, pod_key)
        for uid, move in list(self.active.items()):
            if move.replacement == pod_key:
                log.info("move completed", moved=move.pod_key, replacement=pod_key, node=move.dest.node)
                self.results.labels("completed").inc()
                self.moved[move.replacement_uid] = time.monotonic()
                ledger.forget(move.holder)
                del self.active[uid]

    def is_replacement(self, pod: Mapping[str, Any]) -> bool:
        return self._replacement_of(pod) is not None

    def _replacement_of(self, pod: Mapping[str, Any]) -> Move | None:
        key = object_key(dict(pod))
        uid = str((pod.get("metadata") or {}).get("uid"))
        owner, shape = controller_owner(pod), claim_shape(pod)
        for move in self.active.values():
            if move.replacement == key and move.replacement_uid == uid:
                return move
        for move in self.active.values():
            if (
                move.replacement is None
                and uid != move.pod_uid
                and owner == move.owner
                and shape == move.shape
                and key.split("/")[0] == move.pod_key.split("/")[0]
            ):
                move.replacement, move.replacement_uid = key, uid
                return move
        return None

    @staticmethod
    def _hold(ledger: Ledger, move: Move) -> None:
        hold_cover(ledger, move.holder, move.dest.devices)

    def _give_up(
        self, ledger: Ledger, pods: Mapping[str, Any], writer: Any, move: Move, result: str, why: str
    ) -> None:
        log.info("move given up", moved=move.pod_key, result=result, why=why)
        self.results.labels(result).inc()
        ledger.forget(move.holder)
        self.active.pop(move.pod_uid, None)
        waiting = pods.get(move.for_pod)
        if waiting is not None and writer is not None and self.hooks is not None:
            self.hooks.event(writer, dict(waiting), "Warning", "MoveGivenUp",
                             f"moving {move.pod_key} to node {move.dest.node} gave up: {why}; "
                             f"its reserved devices are free again")  # fmt: skip

    # --- planning and carrying out ---------------------------------------------------------------

    def make_room(
        self,
        st: State,
        pod: Obj,
        todo: Sequence[Mapping[str, Any]],
        node_ok: Callable[[str], bool],
        end_hint: EndHint | None,
    ) -> str | None:
        """After preemption found nothing: plan and start moves that make room for `pod`. The text for
        its condition, or None (off, rate-limited, no plan)."""
        s = self.settings
        if not s.enabled or st.writer is None or self.hooks is None or self.is_replacement(pod):
            return None
        if len(self.recent) >= s.per_cluster:
            return None
        nominations = self.hooks.nominations
        if object_key(pod) in nominations:
            return None
        now_wall, now = time.time(), time.monotonic()
        promised = {u for n in nominations.entries.values() for u in n.victims}
        per_node: dict[str, int] = {}
        for _, node in self.recent:
            per_node[node] = per_node.get(node, 0) + 1
        listed = candidates_by_node(st.cache["pods"].values(), st.cache["resourceclaims"], st.ledger)
        by_node: dict[str, list[Candidate]] = {}
        ages: dict[str, float] = {}
        for node, cands in listed.items():
            if not node_ok(node) or per_node.get(node, 0) >= s.per_node:
                continue
            for c in cands:
                obj = st.cache["pods"].get(c.key)
                if obj is None or c.uid in promised or c.uid in self.moved or c.uid in self.refused:
                    continue
                if c.uid in self.active or why_not_movable(obj, now_wall, s.namespaces, s.min_remaining_s):
                    continue
                by_node.setdefault(node, []).append(c)
                ages[c.uid] = age_s(obj, now_wall)
        if not by_node:
            return None
        max_moves = min(s.max_moves, s.per_cluster - len(self.recent))
        plan = plan_moves(
            by_node, ages, room_test(st, todo, node_ok, end_hint), homes_test(st), max_moves=max_moves
        )
        if plan is None or per_node.get(plan.node, 0) + len(plan.moves) > s.per_node:
            return None  # (the per-node limit counts every eviction of the plan: all are on its node)
        return self._carry_out(st, pod, plan, now)

    def _carry_out(self, st: State, pod: Obj, plan: MovePlan, now: float) -> str | None:
        assert self.hooks is not None and st.writer is not None
        key, uid = object_key(pod), str(pod["metadata"].get("uid"))
        moves = []
        for cand, dest in plan.moves:
            obj = st.cache["pods"][cand.key]
            owner, shape = controller_owner(obj), claim_shape(obj)
            assert owner is not None and shape is not None  # why_not_movable checked both
            move = Move(cand.key, cand.uid, owner, shape, cand.node, dest, key, now)
            self.active[cand.uid] = move
            self._hold(st.ledger, move)  # reserved before any eviction
            moves.append(move)
        victims = frozenset(c.uid for c, _ in plan.moves)
        # The nomination holds no devices itself (the placement overlaps instances still running):
        # the reservation below does, within the placement rules.
        self.hooks.nominations.add(st.ledger, Nomination(key, uid, plan.node, victims, frozenset(), now))
        self.targets[key] = (uid, plan.target)
        hold_cover(st.ledger, f"making-room/{uid}", plan.target)
        evicted: list[Move] = []
        for move in moves:
            target = st.cache["pods"].get(move.pod_key)
            result = "evicted" if target is None else self.hooks.evict(st.writer, target)
            self.results.labels(result).inc()
            if result in ("evicted", "unknown"):
                self.recent.append((now, move.source))
                self.moved[move.pod_uid] = now
                evicted.append(move)
                if target is not None:
                    self.hooks.event(st.writer, target, "Normal", "Moved",
                                     f"evicted to make room for pod {key}; its replacement has devices "
                                     f"reserved on node {move.dest.node}")  # fmt: skip
                continue
            self.refused[move.pod_uid] = now + REFUSED_RETRY_S
            st.ledger.forget(move.holder)
            del self.active[move.pod_uid]
            if not evicted:  # nothing happened yet: give everything back, the pod waits
                for other in moves[1:]:
                    st.ledger.forget(other.holder)
                    self.active.pop(other.pod_uid, None)
                self.hooks.nominations.drop(st.ledger, key)
                self.drop_target(st.ledger, key)
                self.hooks.event(st.writer, pod, "Warning", "MoveRefused",
                                 f"moving {move.pod_key} was refused ({result}); nothing was evicted")  # fmt: skip
                return None
            self.hooks.event(st.writer, pod, "Warning", "MoveRefused",
                             f"moving {move.pod_key} was refused ({result}); the moves already begun go on")  # fmt: skip
        self.hooks.persist()  # the next leader knows of these moves from now on
        crashpoints.reach("after-move-evictions")
        names = ", ".join(f"{m.pod_key} -> {m.dest.node}" for m in evicted)
        log.info("moving pods to make room", pod=key, node=plan.node, moves=names)
        self.hooks.event(st.writer, pod, "Normal", "MakingRoom",
                         f"moving {names} to make room on node {plan.node}; devices held for this pod")  # fmt: skip
        return f"making room on node {plan.node}: moving {names}"


__all__ = ["RATE_WINDOW_S", "Move", "MoveSettings", "Moves"]
