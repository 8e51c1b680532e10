"""`flexmig simulate --movable-share/--priority-mix`: making room, on the simulated nodes, through NVML.

Each row runs the simulate stream through flexmig/simulation/room.py (the controller's preemption
search and move planner, flexmig's policy) on fresh simulated nodes, and every start, eviction and
move is carried out in NVML: a moved pod's GPU and compute instances are destroyed before the waiting
pod's and its own new ones are created, so the run proves each plan legal on the simulated hardware.

- **Movable rows** (one per share): pods that fit nowhere are refused at once, as in the main table,
  so a 0 % row equals flexmig's row there. Beside each, the ceiling of that share
  (driver/policy/pinned.py `PinnedBound`: the repacking bound in which only the movable pods may move;
  the same pods movable).
- **Priority rows** (per high-priority share, per movable share, preemption off and on): a pod that
  fits nowhere waits up to `PATIENCE` and is retried whenever a pod leaves, high priority first;
  reported are how many high and low pods were placed, the high pods' wait and the evictions.

Times are the stream's units (workload.py: mean lifetime `MEAN_DURATION`); the controller's rules
are scaled to it: a pod expected to end within a quarter lifetime is not moved (600 s in the
controller), nor one moved within a lifetime.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from driver.catalog.simulated import simulated_catalog
from driver.policy.bound import ModelGroup, Program
from driver.policy.model import Choice, GpuRef
from driver.policy.pinned import PinnedBound, ProgramFactory
from flexmig.simulation import fit_highs
from flexmig.simulation.fit_search import SearchProgram
from flexmig.simulation.room import Arrival, RoomOutcome, RoomRules, draw, run_room
from flexmig.simulation.runner import NodeSpec, Realized, SimulatedCluster
from flexmig.simulation.workload import MEAN_DURATION, PodSpec

RULES = RoomRules.scaled(MEAN_DURATION, wait=True)  # the rules' times, for the tests and the docs
PATIENCE, MIN_REMAINING, WINDOW = RULES.patience, RULES.min_remaining, RULES.window


@dataclass(frozen=True, slots=True)
class RoomRow:
    """One row: which pods were movable or high priority, what it gave, and what NVML saw."""

    movable_share: float
    high_share: float  # 0: the movable rows (refused at once)
    preemption: bool
    outcome: RoomOutcome
    gi_created: int
    gi_leaked: int
    ceiling_pods: float | None = None  # the movable rows only
    ceiling_memory: float | None = None


class NvmlRealizer:
    """Creates and destroys each pod's instances on the simulated nodes, as the node agents would."""

    def __init__(self, cluster: SimulatedCluster) -> None:
        self.cluster = cluster
        self.held: dict[str, list[Realized]] = {}
        self.created = 0

    def started(self, name: str, choices: Sequence[Choice]) -> None:
        self.held[name] = [self.cluster.realize(c) for c in choices]
        self.created += len(choices)

    def stopped(self, name: str, choices: Sequence[Choice]) -> None:
        for done in self.held.pop(name):
            self.cluster.destroy(done)


def arrivals(pods: Sequence[PodSpec], seed: int, movable_share: float, high_share: float) -> list[Arrival]:
    """The stream with seeded draws (room.py `draw`), so a share's movable pods are the same in its
    ceiling and in every priority row."""
    return draw(
        ((p.name, p.arrival, p.duration, (p.memory_mib,) * p.devices) for p in pods),
        seed,
        movable_share,
        high_share,
    )


def _realized_run(
    nodes: Sequence[NodeSpec], pods: Sequence[Arrival], rules: RoomRules
) -> tuple[RoomOutcome, int, int]:
    cluster = SimulatedCluster(nodes)
    try:
        realizer = NvmlRealizer(cluster)
        got = run_room(cluster.state, pods, rules, realizer=realizer, warmup=0.0)
        return got, realizer.created, cluster.count_instances()
    finally:
        cluster.close()


def _program(groups: Sequence[ModelGroup]) -> Program:
    # Both are exact; HiGHS is only faster (fit_highs.py).
    return fit_highs.HighsProgram(groups) if fit_highs.available() else SearchProgram(groups)


def run_ceiling(nodes: Sequence[NodeSpec], pods: Sequence[Arrival]) -> tuple[float, float]:
    """Pod and memory acceptance of the pinned repacking bound for the movable flags of `pods`."""
    gpus = [(GpuRef(n.name, i), simulated_catalog(sku)) for n in nodes for i, sku in enumerate(n.skus)]
    factory: ProgramFactory = _program
    bound = PinnedBound(gpus, factory)
    leaving: list[tuple[float, str]] = []
    accepted = asked_mib = accepted_mib = 0
    for pod in pods:
        while leaving and leaving[0][0] <= pod.arrival:
            bound.release(heapq.heappop(leaving)[1])
        asked_mib += sum(pod.sizes)
        if bound.admit(pod.name, pod.sizes, pod.movable):
            accepted += 1
            accepted_mib += sum(pod.sizes)
            heapq.heappush(leaving, (pod.arrival + pod.lifetime, pod.name))
    return accepted / max(1, len(pods)), accepted_mib / max(1, asked_mib)


def run_rows(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    seed: int,
    movable_shares: Sequence[float],
    high_shares: Sequence[float],
    progress: Callable[[str], None] | None = None,
) -> list[RoomRow]:
    rows: list[RoomRow] = []
    moves_rules = RoomRules.scaled(MEAN_DURATION, moves=True)
    for share in movable_shares:
        stream = arrivals(pods, seed, share, 0.0)
        got, created, leaked = _realized_run(nodes, stream, moves_rules)
        ceiling = run_ceiling(nodes, stream)
        rows.append(RoomRow(share, 0.0, False, got, created, leaked, *ceiling))
        if progress is not None:
            progress(f"[making room] {share:.0%} movable: {got.placed}/{got.pods} placed, {got.moves} moves")
    for high in high_shares:
        for share in movable_shares or (0.0,):
            stream = arrivals(pods, seed, share, high)
            for preemption in (False, True):
                rules = RoomRules.scaled(MEAN_DURATION, preemption=preemption, moves=share > 0, wait=True)
                got, created, leaked = _realized_run(nodes, stream, rules)
                rows.append(RoomRow(share, high, preemption, got, created, leaked))
                if progress is not None:
                    progress(
                        f"[making room] {high:.0%} high, {share:.0%} movable, preemption "
                        f"{'on' if preemption else 'off'}: {got.evictions} evictions, {got.moves} moves"
                    )
    return rows


__all__ = [
    "MIN_REMAINING",
    "PATIENCE",
    "WINDOW",
    "NvmlRealizer",
    "RoomRow",
    "arrivals",
    "run_ceiling",
    "run_rows",
]
