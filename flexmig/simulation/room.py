"""Making room in a pod stream: priority preemption and moves of movable pods, with the controller's rules.

One engine for `flexmig simulate --priority-mix/--movable-share` and the packing benchmark's priority
and movable-share tables (benchmarks/packing/priority.py, moves.py), so both measure the same thing.
Placement is flexmig's `PackingPolicy` on a `ClusterState`; the searches are the controller's own:

- **preemption** (docs/preemption.md): a pod that fits nowhere evicts lower-priority running pods on
  one node, the set chosen by `controller/allocation/preemptsearch.py` `victim_sets` (fewest pods,
  lowest priorities), each set tested by the policy on that node's GPUs without the victims. An
  evicted pod restarts from the beginning: it waits again, then runs its whole lifetime again.
- **moves** (docs/moves.md), tried when preemption found nothing: `controller/allocation/moveplan.py`
  `plan_moves` (fewest moves, the youngest pods first), each test made by the policy on a copy of the
  cluster, so only legal MIG placements count. A moved pod restarts at once at its destination and
  runs its whole lifetime again. A pod expected to end within `min_remaining` is not moved (the
  lifetimes are exact hints here), nor one moved within `window`.

A pod that fits nowhere waits up to `patience` (0: refused at once, as the plain stream runs do),
retried whenever a pod leaves, highest priority first, then by arrival. Every start and stop goes
through an optional `Realizer` (flexmig simulate creates and destroys the instances in NVML there),
stops before starts, as a node would do them. Not modelled: grace periods, the controller's rate
limits on moves and its search backoff (controller/allocation/searchbudget.py), the time a restart takes.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.allocation.moveplan import MAX_MOVES, Destination, MovePlan, plan_moves
from controller.allocation.preemptpods import Candidate
from controller.allocation.preemptsearch import victim_sets
from controller.state.ledger import Held
from driver.policy.allocator import PackingPolicy, Policy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuState

HIGH, LOW = 1000, 0


@dataclass(frozen=True, slots=True)
class Arrival:
    name: str
    arrival: float
    lifetime: float
    sizes: tuple[int, ...]  # MiB per device
    priority: int = LOW
    movable: bool = False


def draw(
    pods: Iterable[tuple[str, float, float, tuple[int, ...]]],
    seed: int,
    movable_share: float,
    high_share: float,
) -> list[Arrival]:
    """Arrivals from (name, arrival, lifetime, sizes), `movable_share` of them movable and `high_share`
    high priority: one seeded draw per pod and kind, in arrival order, so one share's movable pods are
    the same in every run of a seed (the ceiling's, the movable table's, the priority table's)."""
    movable = random.Random(f"moves/{movable_share}/{seed}")
    high = random.Random(f"priority/{high_share}/{seed}")
    return [
        Arrival(
            name,
            arrival,
            lifetime,
            sizes,
            priority=HIGH if high.random() < high_share else LOW,
            movable=movable.random() < movable_share,
        )
        for name, arrival, lifetime, sizes in pods
    ]


@dataclass(frozen=True, slots=True)
class RoomRules:
    preemption: bool = False
    moves: bool = False
    patience: float = 0.0  # how long a pod that fits nowhere waits; 0: refused at once
    min_remaining: float = 0.0  # a pod expected to end sooner is not moved
    window: float = 0.0  # a pod moved within this is not moved again
    max_moves: int = MAX_MOVES
    resume: bool = False  # a moved pod goes on where it stopped (a workload that checkpoints)

    @classmethod
    def scaled(
        cls, mean_lifetime: float, *, preemption: bool = False, moves: bool = False, wait: bool = False
    ) -> RoomRules:
        """The controller's rules in a stream's time units: a pod expected to end within a quarter of a
        mean lifetime is not moved (the controller's 600 s), nor one moved within a lifetime; with
        `wait`, a pod that fits nowhere waits up to half a lifetime."""
        return cls(
            preemption, moves, 0.5 * mean_lifetime if wait else 0.0, 0.25 * mean_lifetime, mean_lifetime
        )


class Realizer(Protocol):
    """What the nodes do with each decision (create or destroy the pod's instances)."""

    def started(self, name: str, choices: Sequence[Choice]) -> None: ...

    def stopped(self, name: str, choices: Sequence[Choice]) -> None: ...


_SUMMED = (
    "pods",
    "placed",
    "mib_asked",
    "mib_placed",
    "high",
    "high_placed",
    "low",
    "low_placed",
    "moves",
    "plans",
    "evictions",
    "evictions_all",
)


@dataclass(slots=True)
class RoomOutcome:
    """Counted pods are those arriving after the warm-up; a restart is not a new pod."""

    pods: int = 0
    placed: int = 0
    mib_asked: int = 0
    mib_placed: int = 0
    asked_by_size: Counter[int] = field(default_factory=Counter)  # by the first device's size
    refused_by_size: Counter[int] = field(default_factory=Counter)  # never placed
    high: int = 0
    high_placed: int = 0
    low: int = 0
    low_placed: int = 0
    high_waits: list[float] = field(default_factory=list)  # arrival -> first start, placed high pods
    moves: int = 0  # after the warm-up
    plans: int = 0  # pods placed by a move plan, after the warm-up
    evictions: int = 0  # after the warm-up
    evictions_all: int = 0  # the warm-up's included

    @property
    def acceptance(self) -> float:
        return self.placed / self.pods if self.pods else 0.0

    @property
    def weighted(self) -> float:
        return self.mib_placed / self.mib_asked if self.mib_asked else 0.0

    def add(self, other: RoomOutcome) -> None:
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.asked_by_size.update(other.asked_by_size)
        self.refused_by_size.update(other.refused_by_size)
        self.high_waits += other.high_waits


@dataclass(slots=True)
class _Job:
    pod: Arrival
    waiting_since: float
    counted: bool
    remaining: float  # lifetime still to run (all of it after a restart)
    choices: tuple[Choice, ...] = ()
    started: float = 0.0
    end: float = 0.0
    moved_at: float = -1e18
    placed: bool = False


def _key(c: Choice) -> Held:
    return (str(c.gpu), f"{c.profile.name}@{c.start}")


def _requests(pod: Arrival) -> list[DeviceRequest]:
    return [DeviceRequest(f"d{i}", s) for i, s in enumerate(pod.sizes)]


class RoomSim:
    def __init__(
        self,
        cluster: ClusterState,
        rules: RoomRules,
        policy: Policy | None = None,
        realizer: Realizer | None = None,
    ) -> None:
        self.cluster = cluster
        self.rules = rules
        self.policy = policy if policy is not None else PackingPolicy()
        self.realizer = realizer
        self.running: dict[str, _Job] = {}
        self.leaving: list[tuple[float, str]] = []
        self.waiting: list[_Job] = []
        self.out = RoomOutcome()
        self.counting = False  # past the warm-up
        self._unplaced: dict[str, _Job] = {}  # counted pods not placed (yet)
        self._choices: dict[Held, Choice] = {}

    # -- the stream -------------------------------------------------------------------------------

    def arrive(self, pod: Arrival, counted: bool) -> None:
        self.drain(pod.arrival)
        self.counting = self.counting or counted
        job = _Job(pod, pod.arrival, counted, pod.lifetime)
        if counted:
            self.out.pods += 1
            self.out.mib_asked += sum(pod.sizes)
            self.out.asked_by_size[pod.sizes[0]] += 1
            if pod.priority >= HIGH:
                self.out.high += 1
            else:
                self.out.low += 1
            self._unplaced[pod.name] = job
        if not self.try_place(job, pod.arrival) and self.rules.patience > 0:
            self.waiting.append(job)

    def drain(self, now: float) -> None:
        """Departures up to `now`, each followed by a retry of the waiting pods."""
        while self.leaving and self.leaving[0][0] <= now:
            end, name = heapq.heappop(self.leaving)
            job = self.running.get(name)
            if job is None or job.end != end:
                continue  # evicted or moved meanwhile: it ends later, or not at all
            self._stop(name)
            self.retry(end)

    def retry(self, now: float) -> None:
        queue = sorted(
            (j for j in self.waiting if now - j.waiting_since <= self.rules.patience),
            key=lambda j: (-j.pod.priority, j.waiting_since),
        )
        self.waiting = []  # pods evicted meanwhile are added here
        still = [job for job in queue if not self.try_place(job, now)]
        self.waiting = still + self.waiting

    def finish(self) -> None:
        """Every pod leaves (through the realizer), so a leak shows in what the nodes still hold."""
        for name in list(self.running):
            self._stop(name)
        for job in self._unplaced.values():
            self.out.refused_by_size[job.pod.sizes[0]] += 1
        self._unplaced.clear()

    # -- one pod ----------------------------------------------------------------------------------

    def try_place(self, job: _Job, now: float) -> bool:
        placement = self.policy.place(self.cluster, _requests(job.pod))
        if placement.ok:
            self._start(job, now, tuple(placement.choices))
            return True
        if self.rules.preemption and self._preempt(job, now):
            return True
        return self.rules.moves and self._move(job, now)

    def _start(self, job: _Job, now: float, choices: tuple[Choice, ...]) -> None:
        self.cluster.commit(choices)
        if self.realizer is not None:
            self.realizer.started(job.pod.name, choices)
        job.choices, job.started, job.end = choices, now, now + job.remaining
        self.running[job.pod.name] = job
        heapq.heappush(self.leaving, (job.end, job.pod.name))
        if job.counted and not job.placed:
            pod = job.pod
            self.out.placed += 1
            self.out.mib_placed += sum(pod.sizes)
            del self._unplaced[pod.name]
            if pod.priority >= HIGH:
                self.out.high_placed += 1
                self.out.high_waits.append(now - job.waiting_since)
            else:
                self.out.low_placed += 1
        job.placed = True

    def _release(self, job: _Job) -> None:
        for c in job.choices:
            self.cluster.release(c.gpu, c.profile, c.start)
        if self.realizer is not None:
            self.realizer.stopped(job.pod.name, job.choices)

    def _stop(self, name: str) -> _Job:
        job = self.running.pop(name)
        self._release(job)
        return job

    # -- priority preemption ----------------------------------------------------------------------

    def _fits_without(self, job: _Job, node: str, gone: Sequence[Candidate]) -> bool:
        freed = {c.key for c in gone}
        gpus = []
        for state in self.cluster.node_gpus(node):
            occ = state.occupancy
            for name in freed:
                for c in self.running[name].choices:
                    if c.gpu == state.ref:
                        occ = occ.remove(c.profile, c.start)
            gpus.append(GpuState(state.ref, state.catalog, occ))
        return self.policy.place(ClusterState(gpus), _requests(job.pod)).ok

    def _preempt(self, job: _Job, now: float) -> bool:
        by_node: dict[str, list[Candidate]] = {}
        for name, other in self.running.items():
            if other.pod.priority >= job.pod.priority:
                continue
            node = other.choices[0].gpu.node
            started = f"{other.started:020.6f}"
            by_node.setdefault(node, []).append(
                Candidate(name, name, node, other.pod.priority, started, (name,))
            )
        if not by_node:
            return False
        sets = victim_sets(by_node, job.pod.priority, lambda node, gone: self._fits_without(job, node, gone))
        if not sets:
            return False
        for victim in sets[0].victims:
            evicted = self._stop(victim.key)
            evicted.remaining = evicted.pod.lifetime  # restarted from the beginning: its work is lost
            evicted.waiting_since = now
            self.waiting.append(evicted)
            self.out.evictions_all += 1
            if self.counting:
                self.out.evictions += 1
        placement = self.policy.place(self.cluster, _requests(job.pod))
        assert placement.ok, "the victims' devices made room on the chosen node"
        self._start(job, now, tuple(placement.choices))
        return True

    # -- moves ------------------------------------------------------------------------------------

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

    def _movable(self, now: float) -> tuple[dict[str, list[Candidate]], dict[str, float]]:
        by_node: dict[str, list[Candidate]] = {}
        ages: dict[str, float] = {}
        for name, r in self.running.items():
            if not r.pod.movable or r.end - now < self.rules.min_remaining:
                continue
            if now - r.moved_at < self.rules.window:
                continue
            node = r.choices[0].gpu.node
            if any(c.gpu.node != node for c in r.choices):
                continue  # a pod over two nodes is never moved
            by_node.setdefault(node, []).append(Candidate(name, name, node, 0, "", (name,)))
            ages[name] = now - r.started
        return by_node, ages

    def _plan(self, job: _Job, now: float) -> MovePlan | None:
        by_node, ages = self._movable(now)
        if not by_node:
            return None
        self._choices.clear()

        def room(node: str, gone: Sequence[Candidate]) -> frozenset[Held] | None:
            refs: set[object] = {s.ref for s in self.cluster.node_gpus(node)}
            placed = self.policy.place(self._copy(refs, gone, ()), _requests(job.pod))
            if not placed.ok:
                return None
            self._choices.update({_key(c): c for c in placed.choices})
            return frozenset(_key(c) for c in placed.choices)

        def homes(target: frozenset[Held], gone: Sequence[Candidate]) -> tuple[Destination, ...] | None:
            taken = [self._choices[k] for k in target]
            found = []
            for g in gone:
                placed = self.policy.place(self._copy(None, gone, taken), _requests(self.running[g.key].pod))
                if not placed.ok:
                    return None
                taken += placed.choices
                self._choices.update({_key(c): c for c in placed.choices})
                found.append(
                    Destination(placed.choices[0].gpu.node, frozenset(_key(c) for c in placed.choices))
                )
            return tuple(found)

        return plan_moves(by_node, ages, room, homes, max_moves=self.rules.max_moves)

    def _move(self, job: _Job, now: float) -> bool:
        plan = self._plan(job, now)
        if plan is None:
            return False
        for cand, _ in plan.moves:  # every moved pod's instances go before anything is created
            self._release(self.running[cand.key])
        self._start(job, now, tuple(self._choices[k] for k in plan.target))
        for cand, dest in plan.moves:
            moved = self.running[cand.key]
            moved.moved_at = now
            # Restarts at its destination, its work lost; with `resume`, it goes on where it stopped.
            moved.remaining = max(0.0, moved.end - now) if self.rules.resume else moved.pod.lifetime
            self._start(moved, now, tuple(self._choices[k] for k in dest.devices))
            if self.counting:
                self.out.moves += 1
        if self.counting:
            self.out.plans += 1
        return True


def run_room(
    cluster: ClusterState,
    pods: Sequence[Arrival],
    rules: RoomRules,
    *,
    policy: Policy | None = None,
    realizer: Realizer | None = None,
    warmup: float = 0.2,
    progress: Callable[[int], None] | None = None,
) -> RoomOutcome:
    """The stream through `RoomSim`; pods arriving in the first `warmup` share are not counted."""
    sim = RoomSim(cluster, rules, policy, realizer)
    skip = int(len(pods) * warmup)
    for n, pod in enumerate(pods):
        sim.arrive(pod, counted=n >= skip)
        if progress is not None:
            progress(n + 1)
    sim.finish()
    return sim.out


__all__ = ["HIGH", "LOW", "Arrival", "Realizer", "RoomOutcome", "RoomRules", "RoomSim", "draw", "run_room"]
