"""Priority mix, online: what preemption does for high-priority pods, and what it costs the others.

The streams of online.py, with a share of the pods high priority (`HIGH_SHARES`, its own seed), run by
flexmig/simulation/room.py (the engine `flexmig simulate --priority-mix` uses too). Unlike
online.py, a pod that does not fit waits (as a gated pod does): waiting pods are retried whenever a
pod leaves, high priority first, then by arrival, and give up after `PATIENCE` (in the streams'
time units; the mean lifetime is 40). With preemption on, a high-priority pod that fits nowhere evicts
low-priority pods on one node, chosen by the controller's own search
(controller/allocation/preemptsearch.py: fewest pods, then lowest priorities) with each set tested by
flexmig's packing policy on that node's GPUs without the victims (so only legal MIG placements
count). An evicted pod is restarted at once from the beginning: it waits again, then runs its whole
lifetime again (the work it had done is lost; `PATIENCE` applies to it again). No grace
period is modelled (the freed slices are placed at once; the controller holds them meanwhile).

Reported per scenario, load and high share, with preemption off and on: acceptance of high and low
pods (placed before giving up), the mean and 95th-percentile wait of the high pods that were placed,
and evictions per 100 high-priority pods.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from flexmig.simulation.room import Arrival, RoomOutcome, RoomRules, draw, run_room

from .online import MEAN_LIFETIME, Pod, Scenario, build_cluster, generate

HIGH_SHARES = (0.1, 0.25)
PATIENCE = RoomRules.scaled(MEAN_LIFETIME, wait=True).patience  # 20: half a mean lifetime


def arrivals(pods: Sequence[Pod], high_share: float, seed: int, movable_share: float = 0.0) -> list[Arrival]:
    """The stream with `high_share` of its pods high priority and `movable_share` movable (room.py
    `draw`: the movable ones are moves.py's, so its ceiling applies)."""
    return draw(((p.name, p.arrival, p.lifetime, p.sizes) for p in pods), seed, movable_share, high_share)


def run_priority(
    scenario: Scenario,
    pods: Sequence[Pod],
    high_share: float,
    seed: int,
    preemption: bool,
    warmup: float = 0.2,
    movable_share: float = 0.0,
) -> RoomOutcome:
    """Preemption off or on; with `movable_share`, pods that fit nowhere may also get room by moves
    (tried after preemption, as the controller does)."""
    rules = RoomRules.scaled(MEAN_LIFETIME, preemption=preemption, moves=movable_share > 0, wait=True)
    stream = arrivals(pods, high_share, seed, movable_share)
    return run_room(build_cluster(scenario), stream, rules, warmup=warmup)


def row(out: RoomOutcome) -> tuple[str, ...]:
    waits = sorted(out.high_waits)
    p95 = waits[int(0.95 * (len(waits) - 1))] if waits else 0.0
    return (
        f"{100 * out.high_placed / max(1, out.high):.1f}",
        f"{100 * out.low_placed / max(1, out.low):.1f}",
        f"{100 * out.weighted:.1f}",
        f"{statistics.fmean(waits) if waits else 0.0:.2f}",
        f"{p95:.2f}",
        f"{100 * out.evictions_all / max(1, out.high):.1f}",
        f"{100 * out.moves / max(1, out.placed):.1f}",
    )


def priority_table(
    seeds: int,
    pods: int,
    scenarios: Sequence[Scenario],
    loads: Sequence[float],
    high_shares: Sequence[float] = HIGH_SHARES,
    movable_shares: Sequence[float] = (0.0,),
) -> str:
    lines = [
        "| scenario | load | high share | movable | preemption | high placed % | low placed % | MiB placed % | "
        "high wait mean | high wait p95 | evictions per 100 high | moves per 100 placed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for load in loads:
            streams = [generate(scenario, load, pods, seed) for seed in range(seeds)]
            for share in high_shares:
                for movable in movable_shares:
                    for preemption in (False, True):
                        total = RoomOutcome()
                        for seed, stream in enumerate(streams):
                            total.add(
                                run_priority(scenario, stream, share, seed, preemption, movable_share=movable)
                            )
                        cells = " | ".join(row(total))
                        on = "on" if preemption else "off"
                        lines.append(
                            f"| {scenario.name} | {load} | {share:.0%} | {movable:.0%} | {on} | {cells} |"
                        )
    return "\n".join(lines)


__all__ = ["HIGH_SHARES", "PATIENCE", "arrivals", "priority_table", "row", "run_priority"]
