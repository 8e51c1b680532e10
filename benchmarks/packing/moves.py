"""Movable share, online: what moving movable pods (docs/moves.md) does for acceptance.

The streams of online.py, flexmig's packing policy, a seeded share of the pods movable (`SHARES`). A pod
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

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from controller.allocation.moveplan import Destination, MovePlan, plan_moves
from controller.allocation.preemptpods import Candidate
from controller.state.ledger import Held
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuState

from .ceiling import run_ceiling
from .online import MEAN_LIFETIME, Outcome, Pod, Scenario, build_cluster, generate, run_bound

SHARES = (0.0, 0.25, 0.5, 1.0)
MIN_REMAINING = 0.25 * MEAN_LIFETIME  # the controller's 600 s, in the streams' time units
WINDOW = MEAN_LIFETIME


@dataclass(slots=True)
class _Running:
    pod: Pod
    movable: bool
    choices: tuple[Choice, ...]
    started: float
    end: float
    moved_at: float = -1e18


def _key(c: Choice) -> Held:
    return (str(c.gpu), f"{c.profile.name}@{c.start}")


class MoveSim:
    def __init__(self, scenario: Scenario, share: float, seed: int) -> None:
        self.cluster = build_cluster(scenario)
        self.policy = PackingPolicy()
        self.rng = random.Random(f"moves/{share}/{seed}")
        self.share = share
        self.running: dict[str, _Running] = {}
        self.leaving: list[tuple[float, str]] = []
        self.moves = 0
        self.plans = 0  # pods placed by a plan: accepted thanks to moves
        self.choices: dict[Held, Choice] = {}

    def _requests(self, pod: Pod) -> list[DeviceRequest]:
        return [DeviceRequest(f"d{i}", s) for i, s in enumerate(pod.sizes)]

    def _copy(
        self, refs: set[object] | None, gone: Sequence[Candidate], taken: Sequence[Choice]
    ) -> ClusterState:
        gpus = []
        for state in self.cluster.gpus():
            if refs is not None and state.ref not in refs:
                continue
            occ = state.occupancy
            for c in (c for g in gone for c in self.running[g.key].choices if c.gpu == state.ref):
                occ = occ.remove(c.profile, c.start)
            for c in (c for c in taken if c.gpu == state.ref):
                occ = occ.place(c.profile, c.start)
            gpus.append(GpuState(state.ref, state.catalog, occ))
        return ClusterState(gpus)

    def _run(self, run: _Running, now: float, choices: tuple[Choice, ...]) -> None:
        self.cluster.commit(choices)
        run.choices, run.started, run.end = choices, now, now + run.pod.lifetime
        self.running[run.pod.name] = run
        heapq.heappush(self.leaving, (run.end, run.pod.name))

    def drain(self, now: float) -> None:
        while self.leaving and self.leaving[0][0] <= now:
            end, name = heapq.heappop(self.leaving)
            run = self.running.get(name)
            if run is None or run.end != end:
                continue  # moved meanwhile: it ends later
            del self.running[name]
            for c in run.choices:
                self.cluster.release(c.gpu, c.profile, c.start)

    def admit(self, pod: Pod, now: float) -> bool:
        run = _Running(pod, self.rng.random() < self.share, (), now, now)
        placement = self.policy.place(self.cluster, self._requests(pod))
        if placement.ok:
            self._run(run, now, tuple(placement.choices))
            return True
        plan = self._plan(pod, now)
        if plan is None:
            return False
        return self._carry_out(run, plan, now)

    def _plan(self, pod: Pod, now: float) -> MovePlan | None:
        by_node: dict[str, list[Candidate]] = {}
        ages: dict[str, float] = {}
        for name, r in self.running.items():
            if not r.movable or r.end - now < MIN_REMAINING or now - r.moved_at < WINDOW:
                continue
            node = r.choices[0].gpu.node
            if any(c.gpu.node != node for c in r.choices):
                continue
            by_node.setdefault(node, []).append(Candidate(name, name, node, 0, "", (name,)))
            ages[name] = now - r.started

        def room(node: str, gone: Sequence[Candidate]) -> frozenset[Held] | None:
            refs: set[object] = {s.ref for s in self.cluster.node_gpus(node)}
            placed = self.policy.place(self._copy(refs, gone, ()), self._requests(pod))
            if not placed.ok:
                return None
            self.choices.update({_key(c): c for c in placed.choices})
            return frozenset(_key(c) for c in placed.choices)

        def homes(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
            taken = [self.choices[k] for k in target]
            found = []
            for g in gone:
                cluster = self._copy(None, gone, taken)
                placed = self.policy.place(cluster, self._requests(self.running[g.key].pod))
                if not placed.ok:
                    return None
                taken += placed.choices
                self.choices.update({_key(c): c for c in placed.choices})
                found.append(
                    Destination(placed.choices[0].gpu.node, frozenset(_key(c) for c in placed.choices))
                )
            return tuple(found)

        return plan_moves(by_node, ages, room, homes)

    def _carry_out(self, run: _Running, plan: MovePlan, now: float) -> bool:
        for cand, _ in plan.moves:
            for c in self.running[cand.key].choices:
                self.cluster.release(c.gpu, c.profile, c.start)
        self._run(run, now, tuple(self.choices[k] for k in plan.target))
        for cand, dest in plan.moves:
            moved = self.running[cand.key]
            moved.moved_at = now
            self._run(moved, now, tuple(self.choices[k] for k in dest.devices))  # restarts: work lost
            self.moves += 1
        self.plans += 1
        self.choices.clear()
        return True


def run_moves(
    scenario: Scenario, pods: Sequence[Pod], share: float, seed: int, warmup: float = 0.2
) -> tuple[Outcome, int, int]:
    """flexmig with `share` of the pods movable: the outcome, the moves made after warm-up, and the pods
    placed by a plan after warm-up (each of them fit nowhere without its moves)."""
    sim = MoveSim(scenario, share, seed)
    out = Outcome(f"flexmig, {share:.0%} movable")
    skip = int(len(pods) * warmup)
    moves_before = plans_before = 0
    for n, pod in enumerate(pods):
        sim.drain(pod.arrival)
        if n == skip:
            moves_before, plans_before = sim.moves, sim.plans
        ok = sim.admit(pod, pod.arrival)
        if n < skip:
            continue
        mib = sum(pod.sizes)
        out.pods += 1
        out.mib_asked += mib
        out.asked_by_size[pod.sizes[0]] += 1
        if ok:
            out.accepted += 1
            out.mib_accepted += mib
        else:
            out.refused_by_size[pod.sizes[0]] += 1
    return out, sim.moves - moves_before, sim.plans - plans_before


def _refused(out: Outcome, sizes: Sequence[int]) -> float:
    return 100 * sum(out.refused_by_size[s] for s in sizes) / max(1, sum(out.asked_by_size[s] for s in sizes))


def moves_table(
    seeds: int,
    pods: int,
    scenarios: Sequence[Scenario],
    loads: Sequence[float],
    shares: Sequence[float] = SHARES,
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
                    got, made, planned = run_moves(scenario, stream, share, seed)
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


__all__ = ["MIN_REMAINING", "SHARES", "WINDOW", "MoveSim", "moves_table", "run_moves"]
