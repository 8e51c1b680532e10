"""The data of whole-GPU placement: idle GPUs with their price, whole-GPU requests and picks.

Types only, no decision: the controller's ledger lists the idle GPUs (`IdleGpus`) and its decision
builds `WholeRequest`s, while the rule that picks the GPUs is driver/policy/whole.py, reached from the
controller only through driver/policy/placer.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

from driver.policy.model import GpuRef, PlacementOf


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """A GPU whose whole device may be allocated now, and what MIG placements lose if it is."""

    ref: GpuRef
    cost: float  # weighted MIG capacity destroyed (0.0: the GPU publishes no MIG device)


@dataclass(frozen=True, slots=True)
class WholeRequest:
    """One whole GPU a pod needs: the GPUs whose whole device its selectors admit (idle or not)."""

    name: str
    gpus: Set[GpuRef]


@dataclass(frozen=True, slots=True)
class WholePick:
    request: str
    gpu: GpuRef


@dataclass(frozen=True, slots=True)
class WholePlacement(PlacementOf[WholePick]):
    """One idle GPU per whole-GPU request."""


NodeKey = tuple[float, int, str]


class IdleGpus:
    """The idle GPUs of the cluster, per node, each node's in preference order (cost, index)."""

    def __init__(self, gpus: Iterable[IdleGpu]) -> None:
        by_node: dict[str, list[IdleGpu]] = defaultdict(list)
        for gpu in gpus:
            by_node[gpu.ref.node].append(gpu)
        for node_gpus in by_node.values():
            node_gpus.sort(key=lambda g: (g.cost, g.ref.gpu_index))
        self.by_node: dict[str, list[IdleGpu]] = dict(by_node)
        self.refs: frozenset[GpuRef] = frozenset(g.ref for gs in by_node.values() for g in gs)

    def candidate_nodes(self, requests: Sequence[WholeRequest]) -> set[str]:
        """Nodes holding an idle admitted GPU for every request (a necessary condition only)."""
        nodes: set[str] | None = None
        for req in requests:
            mine = {ref.node for ref in req.gpus if ref in self.refs}
            nodes = mine if nodes is None else nodes & mine
        return nodes or set()
