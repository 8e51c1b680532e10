"""A reference policy: HAMi v2.10's dynamic-MIG heuristic, as its scheduler extender applies it.

Used only to compare against (`flexmig simulate`, benchmarks/packing); the controller never runs it.
The rule, from the public description of HAMi v2.10 (`selectMigCandidate`, `orderedMigPlacements`,
`Fit` under the default binpack node policy):
- nodes most used first, then on the node GPUs most used first ("used" = share of memory and compute
  slices taken), and a GPU is tried again for the next device of the same pod;
- on a GPU, the smallest allowed profile (memory, then slices) with memory >= the request that has a
  free placement; if the smallest has none, fall through to a larger one on the same GPU;
- placements of 1g and 3g profiles are tried from the highest start down, others from the lowest up.
It looks at no capacity, scarcity or fragmentation: that is what it stands for here.
"""

from __future__ import annotations

from collections.abc import Sequence

from driver.catalog.types import MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy.cluster import ClusterState
from driver.policy.explain import explain_failure, free_placements, profiles_for, serves
from driver.policy.model import Choice, DeviceRequest, GpuState, Placement


def _used(occ: Occupancy) -> float:
    memory = occ.used_memory_slices / occ.memory_slices if occ.memory_slices else 1.0
    compute = occ.used_compute_slices / occ.compute_slices if occ.compute_slices else 1.0
    return memory + compute


def _descending_start(profile: MigProfile) -> bool:
    return profile.name.startswith(("1g.", "3g."))


class HamiPolicy:
    """HAMi v2.10's heuristic on flexmig's cluster state (reference only)."""

    name = "hami"

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        if not requests:
            return Placement(())
        nodes = cluster.nodes()
        usage = {
            node: sum(_used(g.occupancy) for g in cluster.node_gpus(node) if not g.whole_gpu_taken)
            for node in nodes
        }
        for node in sorted(nodes, key=lambda n: (-usage[n], n)):
            found = self._on_node(cluster.node_gpus(node), requests)
            if found is not None:
                return Placement(found)
        return explain_failure(cluster, requests)

    @staticmethod
    def _on_node(gpus: list[GpuState], requests: Sequence[DeviceRequest]) -> tuple[Choice, ...] | None:
        occupancy = {g.ref: g.occupancy for g in gpus if not g.whole_gpu_taken}
        ordered = sorted(
            (g for g in gpus if g.ref in occupancy), key=lambda g: (-_used(g.occupancy), g.ref.gpu_index)
        )
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
