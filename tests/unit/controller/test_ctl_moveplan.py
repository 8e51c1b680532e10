"""The move plan search (controller/allocation/moveplan.py): fewest moves first, then the least work
lost; a plan only where every moved pod has a destination; bounded by its fit-test budget; and the
fit tests themselves (controller/allocation/movefit.py) on real MIG geometry."""

from __future__ import annotations

from collections.abc import Sequence

from controller.allocation.moveplan import Destination, Room, plan_moves
from controller.allocation.preemptpods import Candidate
from controller.state.ledger import Held


def pod(name: str, node: str = "n1") -> Candidate:
    return Candidate(key=f"ns/{name}", uid=name, node=node, priority=0, started="", claims=(f"c-{name}",))


TARGET: frozenset[Held] = frozenset({("n1", "gpu-0-mig-7g40gb-0-0")})


def room_when(*sets: set[str]) -> tuple[list[list[str]], Room]:
    """A room test that passes when the pods gone include one of `sets`; records every call."""
    calls: list[list[str]] = []

    def room(node: str, gone: Sequence[Candidate]) -> frozenset[Held] | None:
        names = {c.uid for c in gone}
        calls.append(sorted(names))
        return TARGET if any(s <= names for s in sets) else None

    return calls, room


def homes_always(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
    return tuple(Destination("n2", frozenset({("n2", f"d-{c.uid}")})) for c in gone)


def test_one_move_is_preferred_to_two() -> None:
    _, room = room_when({"b", "c"}, {"a"})
    pods = {"n1": [pod("b"), pod("c"), pod("a")]}
    plan = plan_moves(pods, {"a": 500.0, "b": 1.0, "c": 1.0}, room, homes_always)
    assert plan is not None and [c.uid for c, _ in plan.moves] == ["a"]
    assert plan.target == TARGET and plan.node == "n1"


def test_among_equal_sizes_the_youngest_pods_go() -> None:
    _, room = room_when({"old"}, {"young"})
    pods = {"n1": [pod("old"), pod("young")]}
    plan = plan_moves(pods, {"old": 9000.0, "young": 10.0}, room, homes_always)
    assert plan is not None and [c.uid for c, _ in plan.moves] == ["young"]


def test_no_plan_when_a_moved_pod_has_nowhere_to_go_then_the_next_set_is_tried() -> None:
    _, room = room_when({"a"}, {"b"})

    def homes(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
        return None if any(c.uid == "a" for c in gone) else homes_always(target, gone)

    plan = plan_moves({"n1": [pod("a"), pod("b")]}, {"a": 1.0, "b": 2.0}, room, homes)
    assert plan is not None and [c.uid for c, _ in plan.moves] == ["b"]

    def nowhere(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
        return None

    assert plan_moves({"n1": [pod("a"), pod("b")]}, {}, room, nowhere) is None


def test_a_node_where_moving_everything_would_not_do_is_not_searched() -> None:
    calls, room = room_when({"a"})
    pods = {"n1": [pod("a")], "n2": [pod("x", "n2"), pod("y", "n2")]}
    plan = plan_moves(pods, {}, room, homes_always)
    assert plan is not None and [c.uid for c, _ in plan.moves] == ["a"]
    assert ["x"] not in calls and ["y"] not in calls  # n2 failed with both gone: no subsets tried


def test_more_moves_than_allowed_is_no_plan() -> None:
    _, room = room_when({"a", "b", "c"})
    pods = {"n1": [pod("a"), pod("b"), pod("c")]}
    assert plan_moves(pods, {}, room, homes_always, max_moves=2) is None
    plan = plan_moves(pods, {}, room, homes_always, max_moves=3)
    assert plan is not None and len(plan.moves) == 3


def test_the_search_stops_at_its_fit_test_budget() -> None:
    calls, room = room_when({"p8", "p9"})
    pods = {"n1": [pod(f"p{i}") for i in range(10)]}
    assert plan_moves(pods, {}, room, homes_always, max_moves=2, max_tests=12) is None
    assert len(calls) == 12
    plan = plan_moves(pods, {}, room, homes_always, max_moves=2, max_tests=200)
    assert plan is not None and {c.uid for c, _ in plan.moves} == {"p8", "p9"}
    # By default a plan moves one pod (docs/moves.md): room that needs two is not made.
    assert plan_moves(pods, {}, room, homes_always, max_tests=200) is None
