"""benchmarks/packing/moves.py: the movable-share stream (moves of movable pods to make room)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from benchmarks.packing import ceiling, moves, online
from controller.allocation.moveplan import MovePlan
from driver.policy.allocator import PackingPolicy
from flexmig.simulation.room import RoomSim


def test_with_no_movable_pod_nothing_changes_and_with_all_movable_more_is_accepted() -> None:
    scenario = online.SCENARIOS[0]
    stream = online.generate(scenario, 0.9, 300, 0)
    plain = online.run_policy(PackingPolicy(), scenario, stream)
    none, made_none, planned_none = moves.run_moves(scenario, stream, 0.0, 0)
    assert made_none == planned_none == 0 and (none.accepted, none.mib_accepted) == (
        plain.accepted,
        plain.mib_accepted,
    )
    every, made, planned = moves.run_moves(scenario, stream, 1.0, 0)
    assert made > 0 and every.mib_accepted > none.mib_accepted
    assert 0 < planned <= made <= 2 * planned  # a plan moves one or two pods


def test_only_movable_pods_are_moved_and_each_at_most_once_per_window() -> None:
    scenario = online.SCENARIOS[0]
    sim = RoomSim(online.build_cluster(scenario), moves.RULES)
    moved_at: dict[str, list[float]] = {}
    plan = sim._plan

    def watched(job: Any, now: float) -> MovePlan | None:
        found = plan(job, now)
        for cand, _ in found.moves if found else ():
            assert sim.running[cand.key].pod.movable
            assert sim.running[cand.key].end - now >= moves.MIN_REMAINING
            moved_at.setdefault(cand.key, []).append(now)
        return found

    sim._plan = watched  # type: ignore[method-assign]
    for arrival in moves.arrivals(online.generate(scenario, 1.0, 300, 1), 0.5, 0):
        sim.arrive(arrival, counted=True)
    assert moved_at
    for times in moved_at.values():
        assert all(b - a >= moves.WINDOW for a, b in itertools.pairwise(times))


def test_the_table_has_a_row_per_share() -> None:
    text = moves.moves_table(1, 80, [online.SCENARIOS[0]], [0.9], [0.0, 0.5])
    rows = [line for line in text.splitlines() if line.startswith("| single-8")]
    assert [r.split(" | ")[2] for r in rows] == ["0%", "50%"]


def test_the_ceiling_uses_the_movable_pods_of_the_moves_run() -> None:
    stream = online.generate(online.SCENARIOS[0], 0.9, 120, 2)
    drawn = {a.name: a.movable for a in moves.arrivals(stream, 0.5, 2)}
    flags = ceiling.movable_flags(stream, 0.5, 2)
    assert drawn == flags and 0 < sum(flags.values()) < len(flags)


def test_the_ceiling_is_the_full_bound_with_all_movable_and_flexmig_with_none() -> None:
    scenario = online.SCENARIOS[-1]  # mixed models: groups of several catalogs
    stream = online.generate(scenario, 0.9, 200, 1)
    bound = online.run_bound(scenario, stream)
    every, _ = ceiling.run_ceiling(scenario, stream, 1.0, 1)
    assert (every.accepted, every.mib_accepted) == (bound.accepted, bound.mib_accepted)
    # flexmig's policy finds a legal placement whenever one exists, so with nothing movable the
    # ceiling (which pins pods where the policy puts them) accepts exactly what flexmig does.
    plain = online.run_policy(PackingPolicy(), scenario, stream)
    none, _ = ceiling.run_ceiling(scenario, stream, 0.0, 1)
    assert (none.accepted, none.mib_accepted) == (plain.accepted, plain.mib_accepted)
    half, _ = ceiling.run_ceiling(scenario, stream, 0.5, 1)
    assert plain.mib_accepted <= half.mib_accepted <= bound.mib_accepted


def _moved_ends(rules: Any) -> list[tuple[float, float, float, float]]:
    """(end before the move, end after, when moved, lifetime) of every pod moved in one stream."""
    scenario = online.SCENARIOS[0]
    sim = RoomSim(online.build_cluster(scenario), rules)
    seen: list[tuple[float, float, float, float]] = []
    plan, move = sim._plan, sim._move
    before: dict[str, float] = {}

    def watched_plan(job: Any, now: float) -> MovePlan | None:
        found = plan(job, now)
        for cand, _ in found.moves if found else ():
            before[cand.key] = sim.running[cand.key].end
        return found

    def watched_move(job: Any, now: float) -> bool:
        before.clear()
        done = move(job, now)
        for key, end in before.items():
            seen.append((end, sim.running[key].end, now, sim.running[key].pod.lifetime))
        return done

    sim._plan = watched_plan  # type: ignore[method-assign]
    sim._move = watched_move  # type: ignore[method-assign]
    for arrival in moves.arrivals(online.generate(scenario, 0.9, 300, 0), 1.0, 0):
        sim.arrive(arrival, counted=True)
    return seen


def test_a_moved_pod_restarts_and_in_the_best_case_goes_on_where_it_stopped() -> None:
    restarted = _moved_ends(moves.RULES)
    assert restarted and all(after == pytest.approx(now + life) for _, after, now, life in restarted)
    resumed = _moved_ends(moves.BEST_CASE)
    assert resumed and all(after == pytest.approx(end) for end, after, _, _ in resumed)
