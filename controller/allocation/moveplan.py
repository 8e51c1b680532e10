"""The smallest set of movable pods whose re-placement makes room for a waiting pod: pure search.

Two tests, both answered by the controller's real decider on a copy of the ledger
(controller/allocation/movefit.py), so only legal MIG placements count:

- `room(node, gone)`: the devices the waiting pod would get on `node` once the pods `gone` (all on
  that node) have left; None when it still does not fit;
- `homes(target, gone)`: a destination for each pod of `gone` (same or another GPU or node, each
  under its own placement rules) with `target` taken by the waiting pod and each destination taken by
  the pods placed before it; None when one finds no room.

A plan exists only when both pass: every moved pod has a destination to reserve before anything is
evicted, and the waiting pod has its placement. Sets are tried smallest first (one move, then two,
up to `max_moves`), so the first plan found has the fewest moves; among sets of one size, the least
work lost first (the youngest pods: the sum of their ages). A node is tried only when the waiting pod
fits there with every movable pod of it gone. Each test costs one decision per pod placed; the
search stops after `max_tests` of them or `budget_s` seconds (like the preemption search and the
burst plan, a step must not stall on a large cluster): then no plan, and the pod waits.

One level only: a moved pod's destination is free room, never room made by moving a third pod.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.allocation.preemptpods import Candidate
from controller.state.ledger import Held

MAX_MOVES = 1
MAX_FIT_TESTS = 256
BUDGET_S = 1.0
MAX_SETS_PER_SIZE = 4096  # sets of one size listed per node before ordering: a bound on memory, not tests

Room = Callable[[str, Sequence[Candidate]], frozenset[Held] | None]


@dataclass(frozen=True, slots=True)
class Destination:
    node: str
    devices: frozenset[Held]


Homes = Callable[[frozenset[Held], Sequence[Candidate]], tuple[Destination, ...] | None]


@dataclass(frozen=True, slots=True)
class MovePlan:
    node: str  # where the waiting pod goes
    target: frozenset[Held]  # what it gets there
    moves: tuple[tuple[Candidate, Destination], ...]


def plan_moves(
    by_node: Mapping[str, Sequence[Candidate]],
    ages: Mapping[str, float],
    room: Room,
    homes: Homes,
    *,
    max_moves: int = MAX_MOVES,
    max_tests: int = MAX_FIT_TESTS,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> MovePlan | None:
    """The plan with the fewest moves (then the least work lost) found within the budgets; `ages`:
    seconds each candidate (by uid) has run."""
    deadline = clock() + budget_s
    tests = 0

    def spent() -> bool:
        return tests >= max_tests or clock() > deadline

    hopeful: dict[str, list[Candidate]] = {}
    for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):  # most room to make first
        pods = sorted(by_node[node], key=lambda c: (ages.get(c.uid, 0.0), c.key))
        if not pods or spent():
            continue
        tests += 1
        if room(node, pods) is not None:
            hopeful[node] = pods
    for size in range(1, max_moves + 1):
        sets = [
            (sum(ages.get(c.uid, 0.0) for c in combo), node, combo)
            for node, pods in hopeful.items()
            for combo in itertools.islice(itertools.combinations(pods, size), MAX_SETS_PER_SIZE)
        ]
        for _, node, combo in sorted(sets, key=lambda s: (s[0], s[1], [c.key for c in s[2]])):
            if spent():
                return None
            tests += 1
            target = room(node, combo)
            if target is None:
                continue
            tests += len(combo)
            found = homes(target, combo)
            if found is not None:
                return MovePlan(node, target, tuple(zip(combo, found, strict=True)))
    return None


__all__ = ["BUDGET_S", "MAX_FIT_TESTS", "MAX_MOVES", "Destination", "MovePlan", "plan_moves"]
