"""The state-grouped PackingPolicy makes exactly the decisions of the plain scan (reference_policy.py)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Set

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_policy import ReferenceFirstFitPolicy, ReferencePackingPolicy, decide_alike, same

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.choice import size_key
from driver.placement.occupancy import Occupancy
from driver.policy.allocator import FirstFitPolicy, PackingPolicy, Policy
from driver.policy.cluster import ClusterState
from driver.policy.model import AllowedTable, DeviceFilter, DeviceRequest, GpuRef, GpuState

MODELS = ("A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")


def _catalog(model: str, index: int, everything: bool) -> GpuCatalog:
    base = simulated_catalog(model)
    if everything:  # +me / +me.all profiles allowed too: exclusivity rules and capacity fall-through
        base = dataclasses.replace(base, profiles=tuple(sorted(base.all_profiles, key=size_key)))
    # One catalog object per GPU, as discovery produces: states must be shared by value, not identity.
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, index=index, uuid=f"GPU-{index}"))


def _random_cluster(rng: random.Random) -> ClusterState:
    gpus = []
    everything = rng.random() < 0.3
    for n in range(rng.randint(1, 6)):
        node_models = rng.sample(MODELS, rng.randint(1, 2))
        for i in range(rng.randint(1, 4)):
            cat = _catalog(rng.choice(node_models), i, everything)
            occ = Occupancy.for_catalog(cat)
            for _ in range(rng.randint(0, 4)):
                profile = rng.choice(cat.profiles)
                free = occ.free_placements(profile)
                if free:
                    occ = occ.place(profile, rng.choice(free).start)
            gpus.append(GpuState(GpuRef(f"node-{n:02d}", i), cat, occ, whole_gpu_taken=rng.random() < 0.05))
    rng.shuffle(gpus)
    return ClusterState(gpus)


def _random_filter(rng: random.Random, cluster: ClusterState) -> dict[GpuRef, Set[tuple[str, int]]]:
    table: dict[GpuRef, Set[tuple[str, int]]] = {}
    shared: list[Set[tuple[str, int]]] = []
    for gpu in cluster.gpus():
        pairs = [(p.name, pl.start) for p in gpu.catalog.profiles for pl in p.placements]
        roll = rng.random()
        if roll < 0.1:
            continue  # not listed: empty
        if roll < 0.4 and shared:
            table[gpu.ref] = rng.choice(shared)
        elif roll < 0.7:
            table[gpu.ref] = frozenset(pairs)
        else:
            chosen = set(rng.sample(pairs, rng.randint(0, len(pairs))))
            table[gpu.ref] = chosen if rng.random() < 0.5 else frozenset(chosen)  # mutable sets too
            shared.append(table[gpu.ref])
    return table


def _random_requests(
    rng: random.Random, cluster: ClusterState, tables: list[dict[GpuRef, frozenset[tuple[str, int]]]]
) -> list[DeviceRequest]:
    sizes = sorted({p.memory_mib for g in cluster.gpus() for p in g.catalog.profiles})
    names = sorted({p.name for g in cluster.gpus() for p in g.catalog.profiles})
    out = []
    filt: DeviceFilter | None = None
    per_device: list[AllowedTable] = []
    roll = rng.random()
    if roll < 0.3:
        table = _random_filter(rng, cluster)
        empty: frozenset[tuple[str, int]] = frozenset()

        def plain(ref: GpuRef) -> Set[tuple[str, int]]:
            return table.get(ref, empty)

        filt = plain
    elif roll < 0.8:
        # Tables live across decisions (as the controller's candidate sets do): cached groupings.
        nodes = sorted({g.ref.node for g in cluster.gpus()})
        banned = set(rng.sample(nodes, rng.randint(0, len(nodes)))) if rng.random() < 0.3 else None
        filt = AllowedTable(rng.choice(tables), None if banned is None else (lambda n: n not in banned))
        if rng.random() < 0.5:  # a filter object (and node_ok) per device, mostly one table
            per_device = [
                AllowedTable(
                    filt.table if rng.random() < 0.8 else rng.choice(tables),
                    None if rng.random() < 0.5 else _ban(rng, nodes),
                )
                for _ in range(3)
            ]

    for k in range(rng.choice((1, 1, 1, 2, 3))):
        memory = rng.choice(sizes) - rng.choice((0, 0, 1, 1000))
        preferred = pinned = None
        roll = rng.random()
        if roll < 0.1:
            preferred = rng.choice(names)
        elif roll < 0.2:
            pinned = rng.choice(names)
        models = frozenset(rng.sample(MODELS, 2)) if rng.random() < 0.15 else frozenset()
        own = filt if rng.random() < 0.8 else None
        if per_device and own is not None:
            own = per_device[k]
        out.append(DeviceRequest(f"r{k}", max(0, memory), preferred, pinned, models, own))
    return out


def _ban(rng: random.Random, nodes: list[str]) -> Callable[[str], bool]:
    banned = set(rng.sample(nodes, rng.randint(0, len(nodes) // 2)))
    return lambda n: n not in banned


def _frozen(table: dict[GpuRef, Set[tuple[str, int]]]) -> dict[GpuRef, frozenset[tuple[str, int]]]:
    return {ref: frozenset(pairs) for ref, pairs in table.items()}


class _FlatPolicy(PackingPolicy):
    """Every loss 0.0 (or a few values): ties everywhere, and the free-of-cost early stop decides."""

    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return (0.0,) * len(cluster.total)

    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float:
        return float(profile.memory_slices > 2)


class _FlatReference(ReferencePackingPolicy):
    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        return (0.0,) * len(cluster.total)

    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float:
        return float(profile.memory_slices > 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(["real", "real", "flat"]))
def test_fast_path_decides_exactly_like_the_plain_scan(seed: int, pricing: str) -> None:
    if pricing == "real":
        _run(seed, PackingPolicy(), ReferencePackingPolicy())
    else:
        _run(seed, _FlatPolicy(), _FlatReference())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_first_fit_decides_exactly_like_the_plain_scan(seed: int) -> None:
    _run(seed, FirstFitPolicy(), ReferenceFirstFitPolicy())


def _run(seed: int, fast: Policy, ref: Policy) -> None:
    rng = random.Random(seed)
    fast_cluster = _random_cluster(random.Random(seed))
    ref_cluster = _random_cluster(random.Random(seed))
    live: list[tuple[GpuRef, str, int]] = []
    tables = [_frozen(_random_filter(rng, fast_cluster)) for _ in range(2)]
    for _ in range(12):
        requests = _random_requests(rng, fast_cluster, tables)
        got = fast.place(fast_cluster, requests)
        want = ref.place(ref_cluster, requests)
        same(got, want)
        if got.ok:
            for cluster in (fast_cluster, ref_cluster):
                cluster.commit(got.choices)
            live.extend((c.gpu, c.profile.name, c.start) for c in got.choices)
        if live and rng.random() < 0.4:
            gpu, name, start = live.pop(rng.randrange(len(live)))
            for cluster in (fast_cluster, ref_cluster):
                profile = cluster.gpu(gpu).catalog.profile(name)
                assert profile is not None
                cluster.release(gpu, profile, start)
        if rng.random() < 0.1:
            gpu = rng.choice(fast_cluster.gpus()).ref
            flag = not fast_cluster.gpu(gpu).whole_gpu_taken
            for cluster in (fast_cluster, ref_cluster):
                cluster.set_occupancy(gpu, cluster.gpu(gpu).occupancy, whole_gpu_taken=flag)


def test_many_identical_gpus_ties_break_by_node_name_and_index() -> None:
    gpus = []
    for n in range(30):
        for i in range(8):
            cat = _catalog("A100-40GB", i, False)
            gpus.append(GpuState(GpuRef(f"n{n:02d}", i), cat, Occupancy.for_catalog(cat)))
    fast_cluster, ref_cluster = ClusterState(gpus), ClusterState([dataclasses.replace(g) for g in gpus])
    fast, ref = PackingPolicy(), ReferencePackingPolicy()
    rng = random.Random(7)
    for _ in range(150):
        requests = [
            DeviceRequest(f"r{k}", rng.choice((4000, 9000, 19000, 39000))) for k in range(rng.randint(1, 2))
        ]
        decide_alike(fast, ref, fast_cluster, ref_cluster, requests)


def test_state_memo_is_bounded_and_survives_a_reset(monkeypatch: object) -> None:
    import driver.policy.cluster as cluster_module

    setattr(cluster_module, "_MAX_STATES", 8)  # noqa: B010
    try:
        rng = random.Random(3)
        fast_cluster = _random_cluster(random.Random(3))
        ref_cluster = _random_cluster(random.Random(3))
        tables = [_frozen(_random_filter(rng, fast_cluster)) for _ in range(2)]
        for _ in range(30):
            requests = _random_requests(rng, fast_cluster, tables)
            decide_alike(PackingPolicy(), ReferencePackingPolicy(), fast_cluster, ref_cluster, requests)
    finally:
        setattr(cluster_module, "_MAX_STATES", 32768)  # noqa: B010
