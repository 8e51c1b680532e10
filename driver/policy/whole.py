"""Placement of whole-GPU devices (`gpu-<i>`): which node and which idle GPUs serve a pod's whole GPUs.

Pure logic, like the MIG policy: the controller hands in every *idle* GPU (its whole device published
and not allocated, no MIG instance on it, whoever allocated them) with the MIG capacity its loss would
destroy, and the whole GPUs a pod needs, each with the GPUs its selectors admit. The answer puts every
whole GPU on one node or none.

Rule (documented in docs and README): a whole GPU goes to the idle GPU whose loss costs future MIG
placements the least. That cost is the GPU's MIG capacity vector priced with the packing policy's own
scarcity weights (driver/policy/capacity.py, `PackingPolicy.weights`): a GPU that publishes no MIG
device costs nothing, and a GPU of a model whose MIG classes are plentiful costs less than one whose
classes are scarce. Among nodes where every whole GPU fits, the node with the least summed cost wins,
ties to the node left with the fewest idle GPUs (best fit: nodes already busy are filled first, keeping
whole empty nodes for large pods), then the node name; on a node, GPUs are taken by (cost, index).
Requests admitting different GPUs are matched exactly (augmenting paths), so a feasible node is never
missed because an earlier request took the only GPU a later one could use.

The types (`IdleGpus`, `WholeRequest`, `WholePick`, ...) live in driver/policy/wholemodel.py and are
re-exported here; the controller calls these functions only through driver/policy/placer.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set

from driver.policy.cluster import ClusterState
from driver.policy.model import GpuRef, ShortReason
from driver.policy.wholemodel import IdleGpu, IdleGpus, NodeKey, WholePick, WholePlacement, WholeRequest


def mig_cost(cluster: ClusterState, refs: Iterable[GpuRef]) -> dict[GpuRef, float]:
    """Per GPU, its MIG capacity priced by scarcity (1 / (1 + cluster-wide capacity) per class).

    The same weights the packing policy prices a MIG placement with, so "what a whole GPU destroys"
    and "what a MIG instance destroys" are measured alike. GPUs outside the MIG state cost 0.0.
    """
    weights = tuple(1.0 / (1 + t) for t in cluster.total)
    out: dict[GpuRef, float] = {}
    for ref in refs:
        if not cluster.has(ref):
            out[ref] = 0.0
            continue
        out[ref] = round(sum(w * v for w, v in zip(weights, cluster.vector(ref), strict=True)), 9)
    return out


def place_on_node(
    idle: IdleGpus, requests: Sequence[WholeRequest], node: str, exclude: Set[GpuRef] = frozenset()
) -> tuple[NodeKey, tuple[WholePick, ...]] | None:
    """Every request on an idle GPU of `node` not in `exclude` (see the module rule), or None."""
    gpus = [g for g in idle.by_node.get(node, ()) if g.ref not in exclude]
    if len(gpus) < len(requests):
        return None
    # Most constrained first, so the cheapest GPUs go to requests that have a choice only when it is free.
    options = [[g for g in gpus if g.ref in req.gpus] for req in requests]
    order = sorted(range(len(requests)), key=lambda i: len(options[i]))
    owner: dict[GpuRef, int] = {}

    def assign(i: int, seen: set[GpuRef]) -> bool:
        for g in options[i]:
            if g.ref in seen:
                continue
            seen.add(g.ref)
            other = owner.get(g.ref)
            if other is None or assign(other, seen):
                owner[g.ref] = i
                return True
        return False

    for i in order:
        if not assign(i, set()):
            return None
    by_request = {i: ref for ref, i in owner.items()}
    cost = round(sum(g.cost for g in gpus if g.ref in owner), 9)
    left = len(idle.by_node.get(node, ())) - len(owner)
    picks = tuple(WholePick(requests[i].name, by_request[i]) for i in range(len(requests)))
    return (cost, left, node), picks


def feasible_nodes(
    idle: IdleGpus, requests: Sequence[WholeRequest], node_ok: Callable[[str], bool] | None = None
) -> dict[str, tuple[NodeKey, tuple[WholePick, ...]]]:
    """Every node that takes all `requests`, with its ranking key and picks."""
    out = {}
    for node in sorted(idle.candidate_nodes(requests)):
        if node_ok is not None and not node_ok(node):
            continue
        hit = place_on_node(idle, requests, node)
        if hit is not None:
            out[node] = hit
    return out


def place_whole(
    idle: IdleGpus, requests: Sequence[WholeRequest], node_ok: Callable[[str], bool] | None = None
) -> WholePlacement:
    """The best node for all `requests` (see the module rule), or the most specific reason why none."""
    if not requests:
        return WholePlacement(())
    feasible = feasible_nodes(idle, requests, node_ok)
    if feasible:
        return WholePlacement(min(feasible.values())[1])
    return explain_whole(idle, requests, node_ok)


def explain_whole(
    idle: IdleGpus, requests: Sequence[WholeRequest], node_ok: Callable[[str], bool] | None = None
) -> WholePlacement:
    """Why no node takes them all: the first request with no idle GPU at all, else NoSingleNode."""
    for req in requests:
        allowed = [r for r in req.gpus if node_ok is None or node_ok(r.node)]
        if not any(r in idle.refs for r in allowed):
            return WholePlacement(
                (),
                ShortReason.NO_FREE_PLACEMENT,
                f"whole GPU {req.name}: none of the {len(allowed)} GPUs it admits is idle (a whole GPU "
                "needs no MIG instance and no other allocation on it)",
            )
    return WholePlacement(
        (),
        ShortReason.NO_SINGLE_NODE,
        f"each of the {len(requests)} whole GPUs has an idle GPU somewhere, but no single node has "
        "enough idle GPUs for all of them",
    )


__all__ = [
    "IdleGpu",
    "IdleGpus",
    "NodeKey",
    "WholePick",
    "WholePlacement",
    "WholeRequest",
    "explain_whole",
    "feasible_nodes",
    "mig_cost",
    "place_on_node",
    "place_whole",
]
