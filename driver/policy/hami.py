"""A reference policy: HAMi v2.10's dynamic-MIG heuristic, as its scheduler extender applies it.

Used only to compare against (`flexmig simulate`, benchmarks/packing); the controller never runs it.
The rule, from the public description of HAMi v2.10 (`selectMigCandidate`, `orderedMigPlacements`,
`Fit` under the default binpack node policy):
- nodes most used first, then on the node GPUs most used first ("used" = share of memory and compute
  slices taken), and a GPU is tried again for the next device of the same pod;
- on a GPU, the smallest allowed profile (memory, then slices) with memory >= the request that has a
  free placement; if the smallest has none, fall through to a larger one on the same GPU;
- placements of 1g and 3g profiles are tried from the highest start down, others from the lowest up.
It looks at no capacity, scarcity or fragmentation: that is what it stands for here. HAMi's newer
per-card placement (its pull request 2855) keeps this node and GPU walk: driver/policy/hami_scored.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from driver.catalog.types import MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy.cluster import ClusterState
from driver.policy.explain import explain_failure, free_placements, profiles_for, serves
from driver.policy.model import Choice, DeviceRequest, GpuState, Placement


def used_share(occ: Occupancy) -> float:
    """HAMi's "how used" of one GPU: share of memory slices plus share of compute slices taken."""
    memory = occ.used_memory_slices / occ.memory_slices if occ.memory_slices else 1.0
    compute = occ.used_compute_slices / occ.compute_slices if occ.compute_slices else 1.0
    return memory + compute


def _descending_start(profile: MigProfile) -> bool:
    return profile.name.startswith(("1g.", "3g."))


def busiest_nodes(cluster: ClusterState) -> list[str]:
    """Nodes most used first (HAMi's default binpack node policy), by name on a tie."""
    usage = {
        node: sum(used_share(g.occupancy) for g in cluster.node_gpus(node) if not g.whole_gpu_taken)
        for node in cluster.nodes()
    }
    return sorted(usage, key=lambda n: (-usage[n], n))


def busiest_gpus(gpus: list[GpuState]) -> list[GpuState]:
    """A node's GPUs that can take a MIG instance, most used first, by index on a tie."""
    free = [g for g in gpus if not g.whole_gpu_taken]
    return sorted(free, key=lambda g: (-used_share(g.occupancy), g.ref.gpu_index))


def place_busiest_node_first(
    cluster: ClusterState,
    requests: Sequence[DeviceRequest],
    on_node: Callable[[list[GpuState], Sequence[DeviceRequest]], tuple[Choice, ...] | None],
) -> Placement:
    """HAMi's walk, kept by every HAMi version: the first node, most used first, on which `on_node`
    places every request of the pod."""
    if not requests:
        return Placement(())
    for node in busiest_nodes(cluster):
        found = on_node(cluster.node_gpus(node), requests)
        if found is not None:
            return Placement(found)
    return explain_failure(cluster, requests)


class HamiPolicy:
    """HAMi v2.10's heuristic on flexmig's cluster state (reference only)."""

    name = "hami"

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        return place_busiest_node_first(cluster, requests, self._on_node)

    @staticmethod
    def _on_node(gpus: list[GpuState], requests: Sequence[DeviceRequest]) -> tuple[Choice, ...] | None:
        ordered = busiest_gpus(gpus)
        occupancy = {g.ref: g.occupancy for g in ordered}
        choices: list[Choice] = []
        for request in requests:
            pick: Choice | None = None
            for gpu in ordered:
                if not serves(gpu, request):
                    continue
                occ = occupancy[gpu.ref]
                for profile in sorted(
                    profiles_for(gpu, request), key=lambda p: (p.memory_mib, p.memory_slices)
                ):
                    free = free_placements(gpu, occ, profile, request)
                    if free:
                        starts = sorted((p.start for p in free), reverse=_descending_start(profile))
                        pick = Choice(request.name, gpu.ref, profile, starts[0])
                        break
                if pick is not None:
                    occupancy[gpu.ref] = occ.place(pick.profile, pick.start)
                    break
            if pick is None:
                return None
            choices.append(pick)
        return tuple(choices)
