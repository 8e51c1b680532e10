"""Movable share, online: what moving movable pods (docs/moves.md) does for acceptance.

The streams of online.py, flexmig's packing policy, a seeded share of the pods movable (`SHARES`), run
by flexmig/simulation/room.py (the engine `flexmig simulate --movable-share` uses too). A pod
that fits nowhere is refused as in online.py, unless a move plan exists: the controller's own search
(controller/allocation/moveplan.py `plan_moves`: fewest moves, at most `MAX_MOVES` (1), the youngest pods first)
with each test made by the policy on a copy of the cluster (the pod's placement on one node with the
set gone; then a destination for each moved pod with that placement taken), so only legal MIG
placements count. A moved pod restarts at once at its destination and runs its whole lifetime again
(its work is lost, as in the controller). The controller's rules apply: a pod expected to end within
`MIN_REMAINING` is not moved (the hints are exact here), and a pod is moved at most once per
`WINDOW`. Not modelled: the per-node and cluster rate limits, eviction grace periods.

Reported per scenario, load and share: pod and MiB-weighted acceptance beside the ceiling of that
share (ceiling.py: the repacking bound in which only the movable pods may move, the same pods
movable) and the repacking bound in which every pod may move (online.py `run_bound`), the gap to
the ceiling in MiB-weighted points, refusals of the two largest sizes and of the largest alone
(the ceiling's in brackets), and moves per 100 accepted pods.
"""

from __future__ import annotations

from collections.abc import Sequence

from flexmig.simulation.room import Arrival, RoomOutcome, RoomRules, RoomSim, draw

from .ceiling import run_ceiling
from .online import MEAN_LIFETIME, Outcome, Pod, Scenario, build_cluster, generate, run_bound

SHARES = (0.0, 0.25, 0.5, 1.0)
RULES = RoomRules.scaled(MEAN_LIFETIME, moves=True)  # the controller's 600 s and window, in stream units
BEST_CASE = RoomRules(moves=True, resume=True)
"""The most one-move plans can do: moved pods lose no work, and no pod is kept from moving by its
remaining time or an earlier move (`--moves-best-case`)."""
MIN_REMAINING, WINDOW = RULES.min_remaining, RULES.window


def arrivals(pods: Sequence[Pod], share: float, seed: int) -> list[Arrival]:
    """The stream with `share` of its pods movable (room.py `draw`; ceiling.py's `movable_flags` draws
    the same)."""
    return draw(((p.name, p.arrival, p.lifetime, p.sizes) for p in pods), seed, share, 0.0)


def as_outcome(got: RoomOutcome, name: str) -> Outcome:
    out = Outcome(name, got.pods, got.placed, got.mib_asked, got.mib_placed)
    out.refused_by_size.update(got.refused_by_size)
    out.asked_by_size.update(got.asked_by_size)
    return out


def run_moves(
    scenario: Scenario,
    pods: Sequence[Pod],
    share: float,
    seed: int,
    warmup: float = 0.2,
    rules: RoomRules = RULES,
) -> tuple[Outcome, int, int]:
    """flexmig with `share` of the pods movable: the outcome, the moves made after warm-up, and the pods
    placed by a plan after warm-up (each of them fit nowhere without its moves)."""
    sim = RoomSim(build_cluster(scenario), rules)
    skip = int(len(pods) * warmup)
    for n, arrival in enumerate(arrivals(pods, share, seed)):
        sim.arrive(arrival, counted=n >= skip)
    sim.finish()
    return as_outcome(sim.out, f"flexmig, {share:.0%} movable"), sim.out.moves, sim.out.plans


def _refused(out: Outcome, sizes: Sequence[int]) -> float:
    return 100 * sum(out.refused_by_size[s] for s in sizes) / max(1, sum(out.asked_by_size[s] for s in sizes))


def moves_table(
    seeds: int,
    pods: int,
    scenarios: Sequence[Scenario],
    loads: Sequence[float],
    shares: Sequence[float] = SHARES,
    rules: RoomRules = RULES,
) -> str:
    lines = [
        "| scenario | load | movable | pods % | MiB % | ceiling pods % | ceiling MiB % | MiB gap to ceiling, "
        "pts | bound pods % | bound MiB % | refused, two largest sizes % (ceiling) | refused, largest "
        "size % (ceiling) | moves per 100 accepted | moves per pod placed by a plan |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for load in loads:
            streams = [generate(scenario, load, pods, seed) for seed in range(seeds)]
            bound = Outcome("bound")
            for stream in streams:
                bound.add(run_bound(scenario, stream))
            for share in shares:
                total, ceiling, moves, plans = Outcome("moves"), Outcome("ceiling"), 0, 0
                for seed, stream in enumerate(streams):
                    got, made, planned = run_moves(scenario, stream, share, seed, rules=rules)
                    plans += planned
                    total.add(got)
                    ceiling.add(run_ceiling(scenario, stream, share, seed)[0])
                    moves += made
                big = sorted(total.asked_by_size)[-2:]
                gap = 100 * (ceiling.weighted - total.weighted)
                lines.append(
                    f"| {scenario.name} | {load} | {share:.0%} | {100 * total.acceptance:.1f} | "
                    f"{100 * total.weighted:.1f} | {100 * ceiling.acceptance:.1f} | {100 * ceiling.weighted:.1f} | "
                    f"{gap:.1f} | {100 * bound.acceptance:.1f} | {100 * bound.weighted:.1f} | "
                    f"{_refused(total, big):.1f} ({_refused(ceiling, big):.1f}) | "
                    f"{_refused(total, big[-1:]):.1f} ({_refused(ceiling, big[-1:]):.1f}) | "
                    f"{100 * moves / max(1, total.accepted):.1f} | "
                    f"{moves / plans if plans else 0.0:.2f} |"
                )
    return "\n".join(lines)


__all__ = [
    "BEST_CASE",
    "MIN_REMAINING",
    "RULES",
    "SHARES",
    "WINDOW",
    "arrivals",
    "as_outcome",
    "moves_table",
    "run_moves",
]
