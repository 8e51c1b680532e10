"""Two-device pods: pairsearch.py's search makes exactly the plain scan's decisions.

The search bounds each node's key by the pairs of (state, allowed) groups its GPUs offer and visits
nodes pair by pair, skipping pairs of states no node holds together (`ClusterState.colocated`). Ties on
cost are broken by free slices then name, so the clusters here repeat a few states over many nodes
(thousands of equal costs at scale), mix models within some nodes, pair a 4000 MiB device with other
sizes, release instances between decisions, and turn lifetime hints, device filters and the pricing
variants of test_policy_scale_equivalence.py on and off. The oracle is reference_policy.py's scan.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Set
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_policy import ReferencePackingPolicy, decide_alike, release_random, same, scanned_nodes, twin
from test_policy_scale_equivalence import PRICING

from driver.catalog.simulated import simulated_catalog
from driver.placement.occupancy import Occupancy
from driver.policy import allocator
from driver.policy import cluster as cluster_module
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState
from driver.policy.model import AllowedTable, DeviceFilter, DeviceRequest, EndHint, GpuRef, GpuState

MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
SIZES = (4000, 8000, 16000, 19000, 30000, 39000, 70000)  # benchmarks/packing/scale.py's


def _gpus(rng: random.Random) -> list[GpuState]:
    models = rng.sample(MODELS, rng.randint(1, 3))
    per_node = rng.randint(2, 8)
    mixed = rng.random() < 0.3  # some nodes carry two models
    gpus = []
    for n in range(rng.randint(30, 90)):
        for i in range(per_node):
            cat = simulated_catalog(models[(n + (i % 2 if mixed else 0)) % len(models)])
            occ = Occupancy.for_catalog(cat)
            # Few fills of small profiles from the lowest start: each state recurs on many nodes.
            for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 5))):
                profile = cat.profiles[rng.choice((0, 0, 1, 2))]
                free = occ.free_placements(profile)
                if free:
                    occ = occ.place(profile, free[0].start)
            gpus.append(GpuState(GpuRef(f"node-{n:03d}", i), cat, occ, whole_gpu_taken=rng.random() < 0.02))
    return gpus


def _filter(rng: random.Random, gpus: list[GpuState]) -> DeviceFilter | None:
    roll = rng.random()
    if roll < 0.6:
        return None
    table = {
        g.ref: frozenset(
            (p.name, pl.start)
            for p in g.catalog.profiles
            for pl in p.placements
            if rng.random() < 0.9 or g.ref.gpu_index % 2
        )
        for g in gpus
        if rng.random() < 0.95
    }
    if roll < 0.85:
        banned = {g.ref.node for g in gpus if rng.random() < 0.1}
        return AllowedTable(table, None if rng.random() < 0.5 else (lambda n: n not in banned))
    empty: frozenset[tuple[str, int]] = frozenset()

    def plain(ref: GpuRef) -> Set[tuple[str, int]]:
        return table.get(ref, empty)

    return plain


def _pod(rng: random.Random, filt: DeviceFilter | None, hint: EndHint | None) -> list[DeviceRequest]:
    first = 4000 if rng.random() < 0.5 else rng.choice(SIZES)
    sizes = [first, rng.choice(SIZES)]
    rng.shuffle(sizes)
    return [
        DeviceRequest(f"d{k}", s, None, None, frozenset(), filt, end_hint=hint) for k, s in enumerate(sizes)
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["real", "real", "real", "negative-waste", "negative-weights", "growing-capacity"]),
)
def test_two_device_pods_decide_like_the_plain_scan(seed: int, pricing: str) -> None:
    make_fast, make_ref, context = PRICING[pricing]
    with context():
        rng = random.Random(seed)
        gpus = _gpus(rng)
        fast_cluster, ref_cluster = twin(gpus)
        fast, ref = make_fast(), make_ref()
        hinted = rng.random() < 0.3
        fast.hint_weight = ref.hint_weight = 0.3
        searched = mock.patch.object(allocator, "best_pair", wraps=allocator.best_pair)
        now = 0.0
        with searched as spy:
            for decision in range(12):
                now += 5.0
                end = now + rng.choice((5.0, 20.0, 80.0))
                hint = EndHint(end, end - now) if hinted and rng.random() < 0.7 else None
                requests = _pod(rng, _filter(rng, gpus) if decision % 3 == 0 else None, hint)
                decide_alike(fast, ref, fast_cluster, ref_cluster, requests)
                for _ in range(rng.randint(0, 3)):
                    release_random(rng, gpus, fast_cluster, ref_cluster)
        assert spy.call_count == 12  # every decision went through the pair search


def test_identical_nodes_but_one_late_tighter_gpu_win_there_scanning_few() -> None:
    """Sixty identical nodes (one 1g per GPU) and, on node-047, one GPU holding a second 1g: that GPU
    takes the 8000 MiB device best and the 4000 MiB one goes to another GPU of the node (a pair of two
    groups, only on that node), as in the plain scan; the search prices a handful of nodes, not sixty."""
    cat = simulated_catalog("A100-40GB")
    small = cat.profiles[0]
    gpus = []
    for n in range(60):
        for i in range(4):
            occ = Occupancy.for_catalog(cat).place(small, 0)
            if n == 47 and i == 2:
                occ = occ.place(small, 1)
            gpus.append(GpuState(GpuRef(f"node-{n:03d}", i), cat, occ))
    requests = [DeviceRequest("a", 8000), DeviceRequest("b", 4000)]
    with scanned_nodes() as priced:
        got = PackingPolicy().place(ClusterState(gpus), requests)
    want = ReferencePackingPolicy().place(ClusterState(dataclasses.replace(g) for g in gpus), requests)
    same(got, want)
    assert [(c.gpu.node, c.gpu.gpu_index) for c in got.choices] == [("node-047", 2), ("node-047", 0)]
    assert len(priced) <= 3, priced


def _recount(cluster: ClusterState) -> tuple[dict[int, dict[str, int]], dict[int, dict[int, int]]]:
    nodes: dict[int, dict[str, int]] = {}
    pairs: dict[int, dict[int, int]] = {}
    for node in cluster.nodes():
        states = [s for s in cluster.node_state_classes(node) if s is not None]
        for k, s in enumerate(states):
            nodes.setdefault(s.sid, {})[node] = nodes.get(s.sid, {}).get(node, 0) + 1
            for m, t in enumerate(states):
                if m != k:
                    pairs.setdefault(s.sid, {})[t.sid] = pairs.get(s.sid, {}).get(t.sid, 0) + 1
    return nodes, pairs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_state_node_and_colocation_index_follow_commits_releases_and_resets(seed: int) -> None:
    rng = random.Random(seed)
    gpus = _gpus(rng)
    # A low state cap: re-interning (`ClusterState.trim`, and mid-update) happens along the way.
    with mock.patch.object(cluster_module, "_MAX_STATES", rng.choice((40, 80, 32768))):
        cluster = ClusterState(gpus)
        policy = PackingPolicy()
        for _ in range(30):
            roll = rng.random()
            if roll < 0.5:
                placed = policy.place(cluster, _pod(rng, None, None))
                if placed.ok:
                    cluster.commit(placed.choices)
            elif roll < 0.9:
                release_random(rng, gpus, cluster)
            else:
                ref = rng.choice(gpus).ref
                gpu = cluster.gpu(ref)
                cluster.set_occupancy(ref, gpu.occupancy, whole_gpu_taken=not gpu.whole_gpu_taken)
            nodes, pairs = _recount(cluster)
            for state, _ in cluster.live_states():
                assert dict(cluster.state_nodes(state)) == nodes.get(state.sid, {})
                assert dict(cluster.colocated(state)) == pairs.get(state.sid, {})
            # No entry outlives its state (ids are reused after a reset).
            assert set(cluster._state_nodes) == set(nodes)
            assert set(cluster._pairs) == set(pairs)
