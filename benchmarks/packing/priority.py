"""Priority mix, online: what preemption does for high-priority pods, and what it costs the others.

The streams of online.py, with a share of the pods high priority (`HIGH_SHARE`s, its own seed). Unlike
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

import heapq
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.allocation.preemptpods import Candidate
from controller.allocation.preemptsearch import victim_sets
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuState

from .online import Pod, Scenario, build_cluster, generate

HIGH_SHARES = (0.1, 0.25)
PATIENCE = 20.0
HIGH, LOW = 1000, 0


@dataclass(slots=True)
class PriorityOutcome:
    high: int = 0
    high_placed: int = 0
    low: int = 0
    low_placed: int = 0
    evictions: int = 0
    high_waits: list[float] = field(default_factory=list)

    def add(self, other: PriorityOutcome) -> None:
        self.high += other.high
        self.high_placed += other.high_placed
        self.low += other.low
        self.low_placed += other.low_placed
        self.evictions += other.evictions
        self.high_waits += other.high_waits

    def row(self) -> tuple[str, str, str, str, str]:
        waits = sorted(self.high_waits)
        p95 = waits[int(0.95 * (len(waits) - 1))] if waits else 0.0
        return (
            f"{100 * self.high_placed / max(1, self.high):.1f}",
            f"{100 * self.low_placed / max(1, self.low):.1f}",
            f"{statistics.fmean(waits) if waits else 0.0:.2f}",
            f"{p95:.2f}",
            f"{100 * self.evictions / max(1, self.high):.1f}",
        )


@dataclass(slots=True)
class _Job:
    pod: Pod
    high: bool
    remaining: float  # lifetime still to run
    waiting_since: float
    counted: bool  # first arrival after warm-up (restarts are not new pods)
    choices: tuple[Choice, ...] = ()
    started_at: float = 0.0


class _Sim:
    def __init__(self, scenario: Scenario, preemption: bool) -> None:
        self.cluster = build_cluster(scenario)
        self.policy = PackingPolicy()
        self.preemption = preemption
        self.running: dict[str, tuple[_Job, float]] = {}  # name -> (job, end)
        self.leaving: list[tuple[float, str]] = []
        self.waiting: list[_Job] = []
        self.out = PriorityOutcome()

    def _requests(self, job: _Job) -> list[DeviceRequest]:
        return [DeviceRequest(f"d{i}", s) for i, s in enumerate(job.pod.sizes)]

    def _start(self, job: _Job, now: float, choices: tuple[Choice, ...]) -> None:
        self.cluster.commit(choices)
        job.choices = choices
        job.started_at = now
        end = now + job.remaining
        self.running[job.pod.name] = (job, end)
        heapq.heappush(self.leaving, (end, job.pod.name))
        if job.counted and job.high:
            self.out.high_placed += 1
            self.out.high_waits.append(now - job.waiting_since)
        elif job.counted:
            self.out.low_placed += 1
        job.counted = False

    def _stop(self, name: str) -> _Job:
        job, _ = self.running.pop(name)
        for c in job.choices:
            self.cluster.release(c.gpu, c.profile, c.start)
        return job

    def try_place(self, job: _Job, now: float) -> bool:
        placement = self.policy.place(self.cluster, self._requests(job))
        if placement.ok:
            self._start(job, now, tuple(placement.choices))
            return True
        if not (self.preemption and job.high):
            return False
        return self._preempt(job, now)

    def _fits(self, job: _Job, node: str, gone: Sequence[Candidate]) -> bool:
        freed = {c.key for c in gone}
        gpus = []
        for state in self.cluster.node_gpus(node):
            occ = state.occupancy
            for name in freed:
                for c in self.running[name][0].choices:
                    if c.gpu == state.ref:
                        occ = occ.remove(c.profile, c.start)
            gpus.append(GpuState(state.ref, state.catalog, occ))
        return self.policy.place(ClusterState(gpus), self._requests(job)).ok

    def _preempt(self, job: _Job, now: float) -> bool:
        by_node: dict[str, list[Candidate]] = {}
        for name, (other, _end) in self.running.items():
            if other.high:
                continue
            node = other.choices[0].gpu.node
            started = f"{other.started_at:020.6f}"
            by_node.setdefault(node, []).append(Candidate(name, name, node, LOW, started, (name,)))
        sets = victim_sets(by_node, HIGH, lambda node, gone: self._fits(job, node, gone))
        if not sets:
            return False
        for victim in sets[0].victims:
            evicted = self._stop(victim.key)
            evicted.remaining = evicted.pod.lifetime  # restarted from the beginning: its work is lost
            evicted.waiting_since = now
            self.waiting.append(evicted)
            self.out.evictions += 1
        placement = self.policy.place(self.cluster, self._requests(job))
        assert placement.ok, "the victims' devices made room on the chosen node"
        self._start(job, now, tuple(placement.choices))
        return True

    def drain(self, now: float) -> None:
        """Departures up to `now`, each followed by a retry of the waiting pods, high first."""
        while self.leaving and self.leaving[0][0] <= now:
            end, name = heapq.heappop(self.leaving)
            if name not in self.running or self.running[name][1] != end:
                continue  # evicted (and maybe restarted with another end)
            self._stop(name)
            self.retry(end)

    def retry(self, now: float) -> None:
        queue = sorted(
            (j for j in self.waiting if now - j.waiting_since <= PATIENCE),
            key=lambda j: (not j.high, j.waiting_since),
        )
        self.waiting = []  # pods evicted meanwhile are added here
        still = [job for job in queue if not self.try_place(job, now)]
        self.waiting = still + self.waiting


def run_priority(
    scenario: Scenario,
    pods: Sequence[Pod],
    high_share: float,
    seed: int,
    preemption: bool,
    warmup: float = 0.2,
) -> PriorityOutcome:
    rng = random.Random(f"priority/{high_share}/{seed}")
    sim = _Sim(scenario, preemption)
    skip = int(len(pods) * warmup)
    for n, pod in enumerate(pods):
        high = rng.random() < high_share
        sim.drain(pod.arrival)
        job = _Job(pod, high, pod.lifetime, pod.arrival, counted=n >= skip)
        if job.counted:
            if high:
                sim.out.high += 1
            else:
                sim.out.low += 1
        if not sim.try_place(job, pod.arrival):
            sim.waiting.append(job)
    return sim.out


def priority_table(
    seeds: int,
    pods: int,
    scenarios: Sequence[Scenario],
    loads: Sequence[float],
    high_shares: Sequence[float] = HIGH_SHARES,
) -> str:
    lines = [
        "| scenario | load | high share | preemption | high placed % | low placed % | high wait mean | "
        "high wait p95 | evictions per 100 high |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for load in loads:
            for share in high_shares:
                for preemption in (False, True):
                    total = PriorityOutcome()
                    for seed in range(seeds):
                        stream = generate(scenario, load, pods, seed)
                        total.add(run_priority(scenario, stream, share, seed, preemption))
                    cells = " | ".join(total.row())
                    on = "on" if preemption else "off"
                    lines.append(f"| {scenario.name} | {load} | {share:.0%} | {on} | {cells} |")
    return "\n".join(lines)


__all__ = ["HIGH_SHARES", "PATIENCE", "PriorityOutcome", "priority_table", "run_priority"]
