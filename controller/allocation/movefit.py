"""The fit tests of a move plan (controller/allocation/moveplan.py), answered by the real decider.

Each test runs `Decider.decide` on the controller's own ledger changed for the length of the test:
the moved pods' claims freed (preempt.py `claims_freed`), and what the plan has already given (the
waiting pod's target, the destinations of the pods placed before) held under temporary holders. The
placement rules, counters, constraints and node filters are those of a real allocation; the ledger is
exactly as before once a test returns. No burst plan is followed or used (a `Placer` without one).

A moved pod is decided as its replacement will be: its claims without their allocation (the
replacement's claims come from the same templates), its own placement rules without its node binding
(`spec.nodeName`: the replacement is not bound yet), and its lifetime hint counted from now (it
restarts).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from controller.allocation.decide import Decider
from controller.allocation.freed import claims_freed
from controller.allocation.lifetime import decision_hint
from controller.allocation.moveplan import Destination, Homes, Room
from controller.allocation.nodefilter import NodeFilter, PodRules
from controller.allocation.nodeselector import pinned_nodes
from controller.allocation.preemptpods import Candidate
from controller.state.ledger import Held, Ledger
from driver.policy.model import EndHint
from driver.policy.placer import Placer

if TYPE_CHECKING:
    from controller.allocation.preempt import State


@contextlib.contextmanager
def held_for_plan(ledger: Ledger) -> Iterator[Callable[[str, frozenset[Held]], None]]:
    """A `take(name, devices)` that holds devices for the length of the block, then gives them back."""
    taken: list[str] = []

    def take(name: str, devices: frozenset[Held]) -> None:
        holder = f"moveplan/{name}"
        taken.append(holder)
        ledger.assume(holder, devices)

    try:
        yield take
    finally:
        for holder in taken:
            ledger.forget(holder)


def _freed(gone: Sequence[Candidate]) -> set[str]:
    return {u for p in gone for u in p.claims}


def room_test(
    st: State, todo: Sequence[Mapping[str, Any]], node_ok: Callable[[str], bool], end_hint: EndHint | None
) -> Room:
    classes = st.cache["deviceclasses"]
    placer = Placer(st.placer.policy, 0.0)

    def room(node: str, gone: Sequence[Candidate]) -> frozenset[Held] | None:
        with claims_freed(st.ledger, _freed(gone)):
            decision = Decider(st.ledger, st.index, placer).decide(
                todo, classes, node_ok=lambda n: n == node and node_ok(n), end_hint=end_hint
            )
        if not decision.ok:
            return None
        return frozenset(k for a in decision.allocations for k in a.keys)

    return room


def replacement_claims(st: State, pod_claims: Sequence[str]) -> list[dict[str, Any]] | None:
    """The moved pod's claims (by uid) as its replacement's will be: unallocated."""
    by_uid = {str(c["metadata"].get("uid")): c for c in st.cache["resourceclaims"].values()}
    out = []
    for uid in pod_claims:
        claim = by_uid.get(uid)
        if claim is None:
            return None
        fresh = copy.deepcopy(claim)
        fresh.pop("status", None)
        out.append(fresh)
    return out


def homes_test(st: State) -> Homes:
    classes = st.cache["deviceclasses"]
    placer = Placer(st.placer.policy, 0.0)

    def homes(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
        found: list[Destination] = []
        with claims_freed(st.ledger, _freed(gone)), held_for_plan(st.ledger) as take:
            take("target", target)
            for pod in gone:
                obj = st.cache["pods"].get(pod.key)
                claims = replacement_claims(st, pod.claims)
                if obj is None or not claims:
                    return None
                unbound = copy.deepcopy(obj)
                unbound.setdefault("spec", {}).pop("nodeName", None)
                node_ok = NodeFilter(PodRules.from_pod(unbound), st.cache["nodes"], pinned_nodes(()))
                hint, _ = decision_hint(unbound, time.time())
                decision = Decider(st.ledger, st.index, placer).decide(
                    claims, classes, node_ok=node_ok, end_hint=hint
                )
                if not decision.ok or decision.node is None:
                    return None
                devices = frozenset(k for a in decision.allocations for k in a.keys)
                take(pod.uid, devices)
                found.append(Destination(decision.node, devices))
        return tuple(found)

    return homes


__all__ = ["held_for_plan", "homes_test", "replacement_claims", "room_test"]
