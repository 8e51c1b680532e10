"""`allocationMode: All`: every device the request's selectors admit on the chosen node, as upstream.

Upstream allocates, for an All request, every matching device of the pools the node sees, and fails
when any of them is in use (a request for all devices cannot take fewer). flexmig's pools are
node-local, so for each node that may take the pod the request becomes "exactly the N matching
devices of this node" and the pod is decided on that node alone; the first node where everything
fits wins (nodes by name: All leaves no placement choice within a node).

Only whole GPUs can be allocated all at once: the MIG devices of one GPU overlap (no set of them is
"all"), and a share's size is the request's own, not a device's. All on MIG devices or shares is
refused, naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import replace

from controller.claims.requests import Alternative, ClaimRequest
from controller.shared.shares import AltKind
from driver.policy.model import GpuRef

Picked = list[tuple[tuple[int, ClaimRequest], Alternative]]


def refusal(req: ClaimRequest, alt: Alternative, kind: AltKind) -> str:
    what = "MIG devices (those of one GPU overlap)" if kind is AltKind.MIG else "shares (sized per request)"
    return (
        f"claim {req.claim} spec.devices.requests[{alt.result_name}].allocationMode All: its selectors "
        f"admit {what}; only whole GPUs (class gpu.flexmig.dev) can be allocated all at once: use "
        "allocationMode ExactCount with a count, or select whole GPUs"
    )


def variants(
    picked: Sequence[tuple[tuple[int, ClaimRequest], Alternative]],
    wholes: Mapping[int, Set[GpuRef]],
    node_ok: Callable[[str], bool] | None,
    idle: Set[GpuRef],
) -> Iterator[tuple[str, Picked]]:
    """Per node holding matching devices of every All request, all of them idle: the pick with each
    All request's count set to the number of its matching whole GPUs there. Nodes where one of them
    is in use are skipped before any placement is tried (a large cluster costs one scan)."""
    nodes = set.intersection(*({ref.node for ref in refs} for refs in wholes.values()))
    for ref in (ref for refs in wholes.values() for ref in refs if ref not in idle):
        nodes.discard(ref.node)
    for node in sorted(nodes):
        if node_ok is not None and not node_ok(node):
            continue
        expanded = list(picked)
        for i, refs in wholes.items():
            where, alt = picked[i]
            expanded[i] = (where, replace(alt, count=sum(1 for ref in refs if ref.node == node)))
        yield node, expanded
