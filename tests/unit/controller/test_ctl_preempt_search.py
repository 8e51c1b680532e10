"""Victim selection alone (controller/allocation/preemptsearch.py), with a `fits` rule given by the test."""

from __future__ import annotations

from collections.abc import Sequence

from controller.allocation.preemptpods import Candidate, may_preempt, priority
from controller.allocation.preemptsearch import cheapest_on_node, victim_sets


def pod(name: str, prio: int, node: str = "n1", *, started: str = "", terminating: bool = False) -> Candidate:
    return Candidate(f"ns/{name}", f"uid-{name}", node, prio, started, (f"claim-{name}",), terminating)


def names(victims: Sequence[Candidate]) -> set[str]:
    return {v.key.removeprefix("ns/") for v in victims}


def test_one_pod_that_frees_enough_beats_two_of_lower_priority() -> None:
    pods = [pod("a", 0), pod("b", 0), pod("big", 5)]

    def fits(node: str, gone: Sequence[Candidate]) -> bool:
        return "big" in names(gone) or {"a", "b"} <= names(gone)

    found = cheapest_on_node("n1", pods, 10, fits)
    assert found is not None and names(found.victims) == {"big"}


def test_among_sets_of_one_size_the_lowest_priorities_go() -> None:
    pods = [pod("p3", 3), pod("p1", 1), pod("p2", 2), pod("p0", 0)]

    def fits(node: str, gone: Sequence[Candidate]) -> bool:
        return len(gone) >= 2

    found = cheapest_on_node("n1", pods, 10, fits)
    assert found is not None and names(found.victims) == {"p0", "p1"}


def test_pods_of_equal_or_higher_priority_are_never_victims() -> None:
    pods = [pod("same", 10), pod("higher", 20)]
    assert cheapest_on_node("n1", pods, 10, lambda node, gone: True) is None


def test_a_node_that_does_not_fit_even_with_every_eligible_pod_gone_gives_no_set() -> None:
    pods = [pod("a", 0), pod("b", 0)]
    assert cheapest_on_node("n1", pods, 10, lambda node, gone: False) is None


def test_pods_refused_by_a_disruption_budget_are_skipped_for_another_set() -> None:
    pods = [pod("guarded", 0), pod("other", 1)]

    def fits(node: str, gone: Sequence[Candidate]) -> bool:
        return bool(gone)

    assert names(cheapest_on_node("n1", pods, 10, fits).victims) == {"guarded"}  # type: ignore[union-attr]
    found = cheapest_on_node("n1", pods, 10, fits, skip={"uid-guarded"})
    assert found is not None and names(found.victims) == {"other"}


def test_terminating_pods_count_as_going_and_nothing_more_is_evicted_when_they_suffice() -> None:
    pods = [pod("leaving", 0, terminating=True), pod("a", 0)]

    def fits(node: str, gone: Sequence[Candidate]) -> bool:
        return "leaving" in names(gone)

    found = cheapest_on_node("n1", pods, 10, fits)
    assert found is not None and found.victims == () and names(found.going) == {"leaving"}


def test_the_cheapest_node_wins() -> None:
    by_node = {
        "n1": [pod("a1", 0, "n1"), pod("b1", 0, "n1")],
        "n2": [pod("a2", 0, "n2")],
    }

    def fits(node: str, gone: Sequence[Candidate]) -> bool:
        return len(gone) == (2 if node == "n1" else 1)

    sets = victim_sets(by_node, 10, fits)
    assert [s.node for s in sets] == ["n2", "n1"]


def test_the_reprieve_keeps_the_most_important_pod_when_it_is_not_needed() -> None:
    pods = [pod("low", 0), pod("mid", 5)]
    found = cheapest_on_node("n1", pods, 10, lambda node, gone: len(gone) >= 1, max_tests=3)
    assert found is not None and names(found.victims) == {"low"}


def test_priority_and_preemption_policy_are_read_as_kube_scheduler_does() -> None:
    assert priority({"spec": {"priority": 1000}}) == 1000
    assert priority({"spec": {}}) == 0
    assert may_preempt({"spec": {"preemptionPolicy": "PreemptLowerPriority"}})
    assert not may_preempt({"spec": {"preemptionPolicy": "Never"}})
