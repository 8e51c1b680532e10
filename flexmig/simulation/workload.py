"""A deterministic stream of pods arriving and leaving, for the simulated cluster."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Memory requests (MiB) and their share of pods: a mix of small inference pods and a few big training
# pods, sized like the HAMi guide's examples (8000 MiB) and the A100/H100 profile ladder.
DEFAULT_MIX: tuple[tuple[int, float], ...] = (
    (4000, 0.30),
    (8000, 0.25),
    (16000, 0.15),
    (19000, 0.10),
    (30000, 0.08),
    (39000, 0.07),
    (70000, 0.05),
)


MEAN_DURATION = 40.0  # a pod's mean lifetime, in the stream's time units (mean gap between arrivals: 1)


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    arrival: float
    duration: float
    memory_mib: int
    devices: int  # nvidia.com/gpu: N, each device with memory_mib


def generate(count: int, seed: int, mix: tuple[tuple[int, float], ...] = DEFAULT_MIX) -> list[PodSpec]:
    """`count` pods with Poisson arrivals and exponential lifetimes; same seed, same pods."""
    if count < 0:
        raise ValueError(f"pods: must be >= 0, got {count}")
    if not mix or any(m <= 0 or w <= 0 for m, w in mix):
        raise ValueError("mix: every entry needs a positive memory size and weight")
    rng = random.Random(seed)
    sizes = [m for m, _ in mix]
    weights = [w for _, w in mix]
    pods: list[PodSpec] = []
    now = 0.0
    for i in range(count):
        now += rng.expovariate(1.0)
        memory = rng.choices(sizes, weights)[0]
        # One pod in ten asks for two devices (the guide's `nvidia.com/gpu: 2` example).
        devices = 2 if rng.random() < 0.1 and memory <= 20000 else 1
        pods.append(PodSpec(f"pod-{i:05d}", now, rng.expovariate(1.0 / MEAN_DURATION), memory, devices))
    return pods
