"""Test oracle: PackingPolicy as it was before the state-grouped fast path, scanning every node and GPU.

Kept as it was (renamed) so the fast path can be proven to make identical decisions, plus the lifetime
hint's co-location term, written out plainly: a hinted device's key on a GPU is the GPU's best
candidate key with the term added to its price (the term is the same for every candidate on a GPU).
Without hints the per-GPU minimum then minimum over GPUs is the old single scan's pick (the first
least key in scan order), so unhinted decisions are the old ones.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol
from unittest import mock

from driver.catalog.types import MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy import allocator
from driver.policy.capacity import CapacityVector
from driver.policy.cluster import ClusterState
from driver.policy.explain import explain_failure, free_placements, largest_first, profiles_for, serves
from driver.policy.model import Choice, DeviceRequest, EndHint, GpuRef, GpuState, Placement


class ReferencePackingPolicy:
    """Cheapest placement by cluster-wide capacity loss (scarce classes weigh more) plus memory waste."""

    name = "flexmig-reference"

    def __init__(self, hint_weight: float = 1.0) -> None:
        self.hint_weight = hint_weight

    def colocation(self, hint: EndHint, gpu_end: float | None) -> float:
        """The delay, as a share of the pod's remaining time (at most 1), by which the pod would keep
        a GPU whose hinted instances end at `gpu_end` (an empty GPU: now) from becoming whole; 0 for
        a GPU whose instances carry no hint (None)."""
        if gpu_end is None or hint.end <= gpu_end:
            return 0.0
        return self.hint_weight * min(1.0, (hint.end - gpu_end) / hint.remaining)

    def weights(self, cluster: ClusterState) -> tuple[float, ...]:
        """Per request class: 1 / (1 + placeable capacity left in the cluster). Scarce classes dominate."""
        return tuple(1.0 / (1 + t) for t in cluster.total)

    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float:
        """Memory the instance holds beyond the request, in memory slices of that GPU.

        Capacity loss alone is blind to which model serves a small request; this term sends a 4 GB
        request to an A100-40GB 1g.5gb rather than an H200 1g.18gb. Measured in slices (not MiB) so
        it is comparable with the capacity term across GPU sizes. In `flexmig simulate` runs it
        raised mean acceptance on mixed clusters by about one point over capacity loss alone.
        """
        total = gpu.catalog.gpu.memory_total_mib or 1
        return (profile.memory_mib - request.memory_mib) * gpu.catalog.memory_slices / total

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        if not requests:
            return Placement(())
        weights = self.weights(cluster)
        best: tuple[tuple[float, int, str], tuple[Choice, ...]] | None = None
        for node in cluster.nodes():
            result = self._place_on_node(cluster, cluster.node_gpus(node), requests, weights)
            if result is None:
                continue
            cost, choices = result
            # Among equal costs prefer the fuller node: keeps empty nodes whole for big requests.
            free = sum(cluster.gpu(c.gpu).occupancy.free_memory_slices for c in choices)
            key = (round(cost, 9), free, node)
            if best is None or key < best[0]:
                best = (key, choices)
        if best is None:
            return explain_failure(cluster, requests)
        return Placement(best[1])

    def _place_on_node(
        self,
        cluster: ClusterState,
        gpus: list[GpuState],
        requests: Sequence[DeviceRequest],
        weights: tuple[float, ...],
    ) -> tuple[float, tuple[Choice, ...]] | None:
        occupancies: dict[GpuRef, Occupancy] = {g.ref: g.occupancy for g in gpus}
        vectors: dict[GpuRef, CapacityVector] = {g.ref: cluster.vector(g.ref) for g in gpus}
        ends: dict[GpuRef, float | None] = {g.ref: cluster.latest_end(g.ref) for g in gpus}
        total_cost = 0.0
        choices: list[Choice] = []
        for request in largest_first(requests):
            pick: tuple[tuple[float, int, int, int], Choice, Occupancy, CapacityVector] | None = None
            for gpu in gpus:
                if gpu.whole_gpu_taken or not serves(gpu, request):
                    continue
                occ = occupancies[gpu.ref]
                on_gpu: tuple[tuple[float, int, int, int], Choice, Occupancy, CapacityVector] | None = None
                for rank, profile in enumerate(profiles_for(gpu, request)):
                    for placement in free_placements(gpu, occ, profile, request):
                        after = occ.place(profile, placement.start)
                        vec = cluster.capacity.vector(gpu.catalog, after)
                        loss = sum(
                            w * (b - a) for w, b, a in zip(weights, vectors[gpu.ref], vec, strict=True)
                        )
                        loss += self.waste(gpu, profile, request)
                        key = (loss, rank, occ.free_memory_slices, placement.start)
                        if on_gpu is None or key < on_gpu[0]:
                            choice = Choice(request.name, gpu.ref, profile, placement.start)
                            on_gpu = (key, choice, after, vec)
                if on_gpu is not None:
                    if request.end_hint is not None:
                        end = ends[gpu.ref]
                        if end is None and not occ.instances:
                            end = request.end_hint.end - request.end_hint.remaining  # empty GPU: now
                        term = self.colocation(request.end_hint, end)
                        if term:
                            key = on_gpu[0]
                            on_gpu = ((key[0] + term, key[1], key[2], key[3]), *on_gpu[1:])
                    if pick is None or on_gpu[0] < pick[0]:
                        pick = on_gpu
                if pick is not None and pick[0][1] == 0 and pick[0][0] == 0.0:
                    break  # a free-of-cost exact-profile placement cannot be beaten
            if pick is None:
                return None
            _, choice, after, vec = pick
            occupancies[choice.gpu] = after
            vectors[choice.gpu] = vec
            if request.end_hint is not None:
                end = ends[choice.gpu]
                ends[choice.gpu] = request.end_hint.end if end is None else max(end, request.end_hint.end)
            total_cost += pick[0][0]
            choices.append(choice)
        return total_cost, tuple(choices)


class ReferenceFirstFitPolicy:
    """Baseline: nodes by name, GPUs by index, smallest fitting profile, lowest free start."""

    name = "first-fit-reference"

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        for node in cluster.nodes():
            gpus = cluster.node_gpus(node)
            occupancies = {g.ref: g.occupancy for g in gpus}
            choices: list[Choice] = []
            for request in requests:
                found = self._first(gpus, occupancies, request)
                if found is None:
                    break
                choices.append(found)
                occupancies[found.gpu] = occupancies[found.gpu].place(found.profile, found.start)
            else:
                return Placement(tuple(choices))
        return explain_failure(cluster, requests)

    @staticmethod
    def _first(
        gpus: list[GpuState], occupancies: dict[GpuRef, Occupancy], request: DeviceRequest
    ) -> Choice | None:
        for gpu in gpus:
            if gpu.whole_gpu_taken or not serves(gpu, request):
                continue
            for profile in profiles_for(gpu, request):
                free = free_placements(gpu, occupancies[gpu.ref], profile, request)
                if free:
                    return Choice(request.name, gpu.ref, profile, free[0].start)
        return None


def same(got: Placement, want: Placement) -> None:
    """Equal placements, and each choice's profile is the chosen GPU's own object (not an equal one)."""
    assert got == want
    for x, y in zip(got.choices, want.choices, strict=True):
        assert x.profile is y.profile


class _Placing(Protocol):
    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement: ...


def decide_alike(
    fast: _Placing,
    ref: _Placing,
    fast_cluster: ClusterState,
    ref_cluster: ClusterState,
    requests: Sequence[DeviceRequest],
) -> Placement:
    """Place `requests` with the policy under test and the oracle, assert the same placement, and
    commit it to both clusters (with the first request's hinted end, if any). Returns it."""
    got = fast.place(fast_cluster, requests)
    same(got, ref.place(ref_cluster, requests))
    if got.ok:
        hint = requests[0].end_hint
        for cluster in (fast_cluster, ref_cluster):
            cluster.commit(got.choices, expected_end=None if hint is None else hint.end)
    return got


def twin(gpus: Sequence[GpuState]) -> tuple[ClusterState, ClusterState]:
    """Two independent clusters over the same GPUs: one for the policy under test, one for the oracle."""
    return ClusterState(gpus), ClusterState(dataclasses.replace(g) for g in gpus)


def release_random(rng: random.Random, gpus: Sequence[GpuState], *clusters: ClusterState) -> None:
    """Release one random instance of a random GPU (if it has any) from every cluster alike."""
    ref = rng.choice(gpus).ref
    instances = clusters[0].gpu(ref).occupancy.instances
    if instances:
        inst = rng.choice(instances)
        for cluster in clusters:
            cluster.release(ref, inst.profile, inst.start)


@contextmanager
def scanned_nodes() -> Iterator[list[str]]:
    """The nodes `PackingPolicy` prices with its per-node scan while the block runs, in order."""
    priced: list[str] = []
    original = allocator._NodeScan.key

    def counting(self: allocator._NodeScan, node: str):  # type: ignore[no-untyped-def]
        priced.append(node)
        return original(self, node)

    with mock.patch.object(allocator._NodeScan, "key", counting):
        yield priced
