"""Lifetime hints, online: flexmig with each pod's expected end (true or noisy) against no hint.

Every pod of the seeded streams of online.py tells the policy when it is expected to end: `exact`
is its true lifetime, `noisy` its lifetime times a log-normal factor (median 1, `NOISE_SIGMA`), drawn
from a seed of its own so every weight sees the same noise. Besides acceptance it reports how many
GPUs were empty (whole) when pods arrived, the resource hints are meant to free.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from driver.policy.allocator import PackingPolicy
from driver.policy.model import DeviceRequest, EndHint

from .online import Outcome, Pod, Scenario, build_cluster, generate, stream

MODES = ("none", "exact", "noisy")
NOISE_SIGMA = 0.75  # log-normal sigma: a quarter of noisy hints are off by more than 1.66x


@dataclass(slots=True)
class HintOutcome:
    outcome: Outcome
    empty_samples: int = 0  # GPUs empty at an arrival (after warm-up), summed over arrivals
    gpu_samples: int = 0

    @property
    def empty_share(self) -> float:
        return self.empty_samples / self.gpu_samples if self.gpu_samples else 0.0

    def add(self, other: HintOutcome) -> None:
        self.outcome.add(other.outcome)
        self.empty_samples += other.empty_samples
        self.gpu_samples += other.gpu_samples


def hinted_lifetimes(pods: Sequence[Pod], mode: str, seed: int) -> list[float | None]:
    """The lifetime each pod announces under `mode` (None: no hint)."""
    if mode == "none":
        return [None] * len(pods)
    if mode == "exact":
        return [p.lifetime for p in pods]
    if mode == "noisy":
        rng = random.Random(f"noise/{seed}")
        return [p.lifetime * math.exp(rng.gauss(0.0, NOISE_SIGMA)) for p in pods]
    raise ValueError(f"unknown hint mode {mode!r}; allowed: {', '.join(MODES)}")


def run_hinted(
    policy: PackingPolicy,
    scenario: Scenario,
    pods: Sequence[Pod],
    lifetimes: Sequence[float | None],
    warmup: float = 0.2,
) -> HintOutcome:
    cluster = build_cluster(scenario)
    refs = [g.ref for g in cluster.gpus()]
    skip = int(len(pods) * warmup)
    result = HintOutcome(Outcome(policy.name))
    index = {p.name: i for i, p in enumerate(pods)}

    def admit(pod: Pod) -> object:
        i = index[pod.name]
        if i >= skip:
            result.gpu_samples += len(refs)
            result.empty_samples += sum(1 for r in refs if not cluster.gpu(r).occupancy.instances)
        life = lifetimes[i]
        # The hint's clock is the stream's: expected end = arrival + announced lifetime.
        hint = None if life is None else EndHint(pod.arrival + life, max(life, 1e-9))
        requests = [DeviceRequest(f"d{k}", s, end_hint=hint) for k, s in enumerate(pod.sizes)]
        placement = policy.place(cluster, requests)
        if not placement.ok:
            return None
        cluster.commit(placement.choices, expected_end=None if hint is None else hint.end)
        return placement.choices

    def release(token: object) -> None:
        for c in token:  # type: ignore[attr-defined]
            cluster.release(c.gpu, c.profile, c.start)

    result.outcome = stream(pods, admit, release, policy.name, warmup)
    return result


def hint_table(
    seeds: int,
    pods: int,
    scenarios: Sequence[Scenario],
    loads: Sequence[float],
    modes: Sequence[str],
    weights: Sequence[float],
) -> str:
    """One row per scenario, load, hint mode and weight (mode none: one row), summed over seeds."""
    lines = [
        "| scenario | load | hints | weight | pod acceptance % | MiB-weighted acceptance % | "
        "largest size refused % | GPUs empty at arrival % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    configs = [(m, w) for m in modes for w in (weights if m != "none" else (0.0,))]
    for scenario in scenarios:
        for load in loads:
            totals: dict[tuple[str, float], HintOutcome] = {}
            for seed in range(seeds):
                stream_pods = generate(scenario, load, pods, seed)
                for mode, weight in configs:
                    lifetimes = hinted_lifetimes(stream_pods, mode, seed)
                    out = run_hinted(PackingPolicy(hint_weight=weight), scenario, stream_pods, lifetimes)
                    key = (mode, weight)
                    if key in totals:
                        totals[key].add(out)
                    else:
                        totals[key] = out
            for (mode, weight), h in totals.items():
                o = h.outcome
                largest = max(o.asked_by_size)
                refused = 100 * o.refused_by_size[largest] / o.asked_by_size[largest]
                lines.append(
                    f"| {scenario.name} | {100 * load:.0f} % | {mode} | "
                    f"{'-' if mode == 'none' else f'{weight:g}'} | {100 * o.acceptance:.1f} | "
                    f"{100 * o.weighted:.1f} | {largest}: {refused:.1f} | {100 * h.empty_share:.1f} |"
                )
            print(f"  hints: {scenario.name} at {100 * load:.0f} % done", file=sys.stderr, flush=True)
    return "\n".join(lines)
