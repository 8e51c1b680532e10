"""PackingPolicy's shortcuts make exactly the plain scan's decisions on large, repetitive clusters.

The shortcuts this targets: a single-device pod scans only the first nodes by name among those whose
GPUs share the best state (`PackingPolicy._best_single`), and a candidate whose waste alone exceeds
the cheapest loss so far is not priced (`Evaluator.best`, valid only when no capacity class grows and
no weight is negative). Clusters here have many nodes with identical GPUs (few models, small
instances), so hundreds of GPUs fall into one state, as in a real fleet; pricing variants make the
waste negative, weights negative, and capacity grow after a placement, where the pruning must hold
back. The reference is the plain scan kept in reference_policy.py.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Set
from contextlib import AbstractContextManager, contextmanager, nullcontext
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_policy import ReferencePackingPolicy, decide_alike, release_random, twin

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import PackingPolicy
from driver.policy.capacity import CapacityModel, CapacityVector
from driver.policy.cluster import ClusterState
from driver.policy.evaluator import Evaluator
from driver.policy.model import AllowedTable, DeviceFilter, DeviceRequest, GpuRef, GpuState

MODELS = ("A30-24GB", "A100-40GB", "H100-80GB", "H200-141GB")


def _catalog(model: str, index: int) -> GpuCatalog:
    base = simulated_catalog(model)
    # One catalog object per GPU, as discovery produces: equal catalogs must share states by value.
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, index=index, uuid=f"GPU-{index}"))


def _gpus(rng: random.Random) -> list[GpuState]:
    models = rng.sample(MODELS, rng.randint(1, 2))
    per_node = rng.randint(2, 8)
    gpus = [
        GpuState(GpuRef(f"node-{n:03d}", i), cat, Occupancy.for_catalog(cat))
        for n in range(rng.randint(10, 40))
        for i in range(per_node)
        for cat in [_catalog(models[(n + (i if rng.random() < 0.3 else 0)) % len(models)], i)]
    ]
    total = sum(g.catalog.memory_slices for g in gpus)
    target, used = rng.uniform(0.0, 0.9) * total, 0
    for _ in range(20 * len(gpus)):
        if used >= target:
            break
        gpu = rng.choice(gpus)
        # Small profiles at their first free start: few distinct states, each on many GPUs.
        profile = rng.choice(gpu.catalog.profiles[:2])
        free = gpu.occupancy.free_placements(profile)
        if free:
            gpu.occupancy = gpu.occupancy.place(
                profile, free[0].start if rng.random() < 0.8 else free[-1].start
            )
            used += profile.memory_slices
    for gpu in rng.sample(gpus, len(gpus) // 20):
        gpu.whole_gpu_taken = True
    return gpus


def _table(rng: random.Random, gpus: list[GpuState]) -> dict[GpuRef, frozenset[tuple[str, int]]]:
    """Allowed pairs per GPU: mostly everything (one shared set per model), some GPUs restricted."""
    table: dict[GpuRef, frozenset[tuple[str, int]]] = {}
    everything: dict[str, frozenset[tuple[str, int]]] = {}
    for gpu in gpus:
        pairs = frozenset((p.name, pl.start) for p in gpu.catalog.profiles for pl in p.placements)
        roll = rng.random()
        if roll < 0.8:
            table[gpu.ref] = everything.setdefault(gpu.model, pairs)
        elif roll < 0.95:
            table[gpu.ref] = frozenset(rng.sample(sorted(pairs), rng.randint(1, len(pairs))))
    return table


def _requests(
    rng: random.Random, cluster: ClusterState, table: dict[GpuRef, frozenset[tuple[str, int]]]
) -> list[DeviceRequest]:
    sizes = sorted({p.memory_mib for g in cluster.gpus() for p in g.catalog.profiles})
    nodes = cluster.nodes()
    filt: DeviceFilter | None = None
    roll = rng.random()
    if roll < 0.3:
        banned = set(rng.sample(nodes, rng.randint(0, len(nodes) // 2)))
        filt = AllowedTable(table, None if rng.random() < 0.5 else (lambda n: n not in banned))
    elif roll < 0.45:
        empty: frozenset[tuple[str, int]] = frozenset()

        def plain(ref: GpuRef) -> Set[tuple[str, int]]:
            return table.get(ref, empty)

        filt = plain
    models = frozenset(rng.sample(MODELS, 2)) if rng.random() < 0.1 else frozenset()
    return [
        DeviceRequest(
            f"r{k}", max(0, rng.choice(sizes) - rng.choice((0, 0, 1, 700))), None, None, models, filt
        )
        for k in range(1 if rng.random() < 0.75 else 2)
    ]


class _NegativeWaste(PackingPolicy):
    """Waste below zero, falling with size: the pruning bound (loss >= waste) must still hold."""

    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float:
        return 0.25 * super().waste(gpu, profile, request) - 0.1 * profile.memory_slices


class _NegativeWasteReference(ReferencePackingPolicy):
    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float:
        return 0.25 * super().waste(gpu, profile, request) - 0.1 * profile.memory_slices


def _signed(weights: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(-w if i % 3 == 1 else w for i, w in enumerate(weights))


class _NegativeWeights(PackingPolicy):
    """A class whose loss counts as a gain: pruning by waste must switch off."""

    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return _signed(super().weights(cluster))


class _NegativeWeightsReference(ReferencePackingPolicy):
    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return _signed(super().weights(cluster))


@contextmanager
def _growing_capacity() -> Iterator[None]:
    """Capacity of the smallest class that grows after some placements and not others (a fall-through
    to a larger profile can make it grow): candidates with a negative loss term, which the pruning
    by waste must never skip."""
    original = CapacityModel._compute

    def bumped(
        self: CapacityModel, key: object, signature: tuple[tuple[int, int], ...], occ: Occupancy
    ) -> CapacityVector:
        out = original(self, key, signature, occ)  # type: ignore[arg-type]
        mix = sum((pid * 31 + start) * (i + 1) for i, (pid, start) in enumerate(signature))
        return (out[0] + 3 * (mix % 4 == 1), *out[1:])

    with mock.patch.object(CapacityModel, "_compute", bumped):
        yield


def _heavy_first(weights: tuple[float, ...]) -> tuple[float, ...]:
    # The grown class weighs more than any waste, so a grown candidate beats a cheaper-looking one.
    return (10.0, *weights[1:])


class _HeavyFirst(PackingPolicy):
    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return _heavy_first(super().weights(cluster))


class _HeavyFirstReference(ReferencePackingPolicy):
    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return _heavy_first(super().weights(cluster))


PRICING: dict[
    str,
    tuple[
        Callable[[], PackingPolicy],
        Callable[[], ReferencePackingPolicy],
        Callable[[], AbstractContextManager[None]],
    ],
] = {
    "real": (PackingPolicy, ReferencePackingPolicy, nullcontext),
    "negative-waste": (_NegativeWaste, _NegativeWasteReference, nullcontext),
    "negative-weights": (_NegativeWeights, _NegativeWeightsReference, nullcontext),
    "growing-capacity": (_HeavyFirst, _HeavyFirstReference, _growing_capacity),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["real", "real", "negative-waste", "negative-weights", "growing-capacity"]),
)
def test_large_repetitive_clusters_decide_like_the_plain_scan(seed: int, pricing: str) -> None:
    make_fast, make_ref, context = PRICING[pricing]
    with context():
        rng = random.Random(seed)
        gpus = _gpus(rng)
        fast_cluster, ref_cluster = twin(gpus)
        table = _table(rng, gpus)
        fast, ref = make_fast(), make_ref()
        for _ in range(10):
            requests = _requests(rng, fast_cluster, table)
            decide_alike(fast, ref, fast_cluster, ref_cluster, requests)
            # Releases (from the fill too) bring GPUs back into states other GPUs are in.
            for _ in range(rng.randint(0, 2)):
                release_random(rng, gpus, fast_cluster, ref_cluster)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(sorted(PRICING)))
def test_best_candidate_per_state_equals_the_unpruned_minimum(seed: int, pricing: str) -> None:
    """`Evaluator.best` (which skips candidates by waste) against the minimum over every candidate."""
    make_fast, _, context = PRICING[pricing]
    with context():
        rng = random.Random(seed)
        cluster = ClusterState(_gpus(rng))
        policy = make_fast()
        weights = policy.weights(cluster)
        ev = Evaluator(policy, cluster, weights)
        sizes = sorted({p.memory_mib for g in cluster.gpus() for p in g.catalog.profiles})
        for memory in rng.sample(sizes, min(4, len(sizes))):
            request = DeviceRequest("r", memory)
            for state, _ in cluster.live_states():
                want: tuple[float, int, int, int] | None = None
                for rank, index, start, after in ev.candidates(state, request, None):
                    gpu = GpuState(GpuRef("", -1), state.catalog, state.occupancy)
                    loss = sum(
                        w * (b - a) for w, b, a in zip(weights, state.vector, after.vector, strict=True)
                    )
                    loss += policy.waste(gpu, state.catalog.profiles[index], request)
                    key = (loss, rank, state.free, start)
                    if want is None or key < want:
                        want = key
                got = ev.best(state, request, None)
                assert (got and got[0]) == want
