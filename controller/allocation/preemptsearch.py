"""The cheapest set of victims on one node that makes a waiting pod fit: pure search, no I/O.

`fits(node, pods)` answers whether the waiting pod's claims can be allocated on `node` once the
devices of `pods` are free (controller/allocation/preempt.py asks the real decider on the ledger with
those claims removed, so the MIG layout rules decide: freeing a slice counts only when it makes a
legal placement, together with what is already free).

Per node, as kube-scheduler's default preemption does: first the node must fit with every eligible
pod gone (lower priority, not refused by a PodDisruptionBudget lately); then pods are given back
("reprieved") most important first (highest priority, then earliest started) while the pod still
fits, which leaves a set no pod of which can be spared. Because the placement is MIG geometry, a
greedy reprieve can keep two pods where one other would do; so the sizes below the reprieve's are
then tried exactly, every combination, while the node's budget of fit tests lasts. Among the nodes,
the cheapest set wins: fewest pods, then the lowest highest priority, then the lowest sum of
priorities (kube-scheduler orders PDB violations first; here the Eviction API enforces PDBs, and a
refused set makes the caller try the next one).

Pods already terminating on a node (`Candidate.terminating`) are counted as gone in every test at no
cost: when they alone make the pod fit, the set is empty and nothing is evicted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from controller.allocation.preemptpods import Candidate

MAX_FIT_TESTS_PER_NODE = 64
"""Each test is one decision on a modified ledger (about a millisecond on a full A100 node)."""
MAX_FIT_TESTS = 512
"""For one search over every node: a step must not stall on a large cluster full of low-priority
pods. Nodes are searched most promising first (the lowest-priority victims, then the most of them),
so what the budget leaves out are the nodes least likely to hold the cheapest set."""

Fits = Callable[[str, Sequence[Candidate]], bool]


def set_cost(victims: Sequence[Candidate]) -> tuple[int, int, int]:
    """Fewest pods, then lowest highest priority, then lowest sum of priorities."""
    prios = [v.priority for v in victims]
    return (len(prios), max(prios, default=-(2**31)), sum(prios))


@dataclass(frozen=True, slots=True)
class VictimSet:
    node: str
    victims: tuple[Candidate, ...]  # to evict, cheapest first
    going: tuple[Candidate, ...] = ()  # already terminating; counted as freed

    @property
    def cost(self) -> tuple[int, int, int]:
        return set_cost(self.victims)


def _cheapest_first(pods: Collection[Candidate]) -> list[Candidate]:
    """Lowest priority first; among equals the latest started first (it loses the least work)."""
    by_start = sorted(pods, key=lambda c: (c.started, c.key), reverse=True)
    return sorted(by_start, key=lambda c: c.priority)


def cheapest_on_node(
    node: str,
    pods: Sequence[Candidate],
    preemptor_priority: int,
    fits: Fits,
    skip: Collection[str] = (),
    max_tests: int = MAX_FIT_TESTS_PER_NODE,
) -> VictimSet | None:
    """The cheapest victim set on `node`, None when evicting every eligible pod would not do."""
    going = tuple(c for c in pods if c.terminating and c.priority < preemptor_priority)
    eligible = _cheapest_first(
        [c for c in pods if not c.terminating and c.priority < preemptor_priority and c.uid not in skip]
    )
    tests = 0

    def test(victims: Sequence[Candidate]) -> bool:
        nonlocal tests
        tests += 1
        return fits(node, (*going, *victims))

    return _search(node, going, eligible, test, lambda: tests, max_tests)


def _search(
    node: str,
    going: tuple[Candidate, ...],
    eligible: list[Candidate],
    test: Callable[[Sequence[Candidate]], bool],
    tests: Callable[[], int],
    max_tests: int,
) -> VictimSet | None:
    """The search of one node (module docstring); `tests()` counts the decisions made so far. The
    first two tests (the terminating pods alone, every eligible pod) are made whatever the budget."""
    if going and test(()):
        return VictimSet(node, (), going)
    if not eligible or not test(eligible):
        return None
    victims = list(eligible)
    for pod in reversed(eligible):  # most important first: kept whenever the rest still make room
        if tests() >= max_tests:
            break
        trial = [v for v in victims if v is not pod]
        if test(trial):
            victims = trial
    best: tuple[Candidate, ...] = tuple(victims)
    for size in range(1, len(best) + 1):
        if tests() + math.comb(len(eligible), size) > max_tests:
            break
        fitting = [combo for combo in itertools.combinations(eligible, size) if test(combo)]
        if fitting:
            cheapest = min(fitting, key=set_cost)
            if set_cost(cheapest) < set_cost(best):
                best = cheapest
            break
    return VictimSet(node, tuple(_cheapest_first(best)), going)


def victim_sets(
    by_node: Mapping[str, Sequence[Candidate]],
    preemptor_priority: int,
    fits: Fits,
    skip: Collection[str] = (),
    max_tests: int = MAX_FIT_TESTS_PER_NODE,
    total_tests: int = MAX_FIT_TESTS,
) -> list[VictimSet]:
    """The cheapest set of every node where one exists (within `total_tests` decisions), cheapest first
    (ties: node name)."""
    used = 0

    def counted(node: str, gone: Sequence[Candidate]) -> bool:
        nonlocal used
        used += 1
        return fits(node, gone)

    def promise(node: str) -> tuple[int, int, str]:
        eligible = [
            c.priority for c in by_node[node] if c.priority < preemptor_priority and c.uid not in skip
        ]
        return (min(eligible, default=preemptor_priority), -len(eligible), node)

    found = []
    for node in sorted(by_node, key=promise):
        left = min(max_tests, total_tests - used)
        if left <= 0:
            break
        hit = cheapest_on_node(node, by_node[node], preemptor_priority, counted, skip, left)
        if hit is not None:
            found.append(hit)
    return sorted(found, key=lambda s: (s.cost, s.node))


__all__ = [
    "MAX_FIT_TESTS",
    "MAX_FIT_TESTS_PER_NODE",
    "VictimSet",
    "cheapest_on_node",
    "set_cost",
    "victim_sets",
]
