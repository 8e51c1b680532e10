"""Placement of HAMi-core shares: which node and which shareable GPUs serve a pod's shared requests.

Pure logic, like the MIG policy: the controller hands in every shareable GPU's capacity and current use
(summed over all claims, whoever allocated them) and the shares a pod needs, with what each share would
consume on each GPU that may serve it (a percentage request consumes a different number of MiB on
GPUs of different sizes). The answer puts every share on one node or none, and never exceeds a GPU's
memory, cores (100 per GPU) or split count.

Rule (documented in docs and README): shares are placed largest first; each goes to the GPU that is left
with the least free memory after it (best fit), ties to the GPU left with fewer free split slots, then
the lower index. Best fit keeps whole, empty GPUs free for large requests and fills partially used
GPUs first. Among nodes where every share fits, the node whose touched GPUs are left with the least
free memory wins (ties: fewer previously empty GPUs touched, then the node name), so shares pile onto
nodes already sharing before opening new ones. Shares of one group (one claim) never land on the same
GPU: HAMi-core enforces one memory limit per visible GPU, so two shares of one GPU in one claim would
be one share with extra steps. When the greedy order fails on a node, a bounded backtracking search
tries the remaining assignments (count is at most 32 per request, GPUs per node a handful).

The types (`ShareAmount`, `SharedGpuState`, `ShareRequest`, `SharePick`, ...) live in
driver/policy/sharemodel.py and are re-exported here; the controller calls these functions only
through driver/policy/placer.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from driver.policy.model import GpuRef, ShortReason
from driver.policy.sharemodel import (
    ZERO,
    NodeOptions,
    ShareAmount,
    SharedGpuState,
    ShareOptions,
    SharePick,
    SharePlacement,
    ShareRequest,
)

MAX_SEARCH_STEPS = 4096
"""Backtracking budget per node; the greedy first path is always tried in full."""

NodeKey = tuple[int, int, str]


def place_on_node(
    gpus: Mapping[GpuRef, SharedGpuState], requests: Sequence[ShareRequest], node: str
) -> tuple[NodeKey, tuple[SharePick, ...]] | None:
    """Every request on `node` (best fit, largest first), with the node's ranking key; None if not."""
    ordered = sorted(requests, key=lambda r: -r.largest())
    state: dict[GpuRef, SharedGpuState] = {}
    options: list[list[tuple[GpuRef, ShareAmount]]] = []
    for req in ordered:
        mine = [(ref, amount) for ref, amount in req.options.on(node) if ref in gpus]
        if not mine:
            return None
        options.append(mine)
        for ref, _ in mine:
            state[ref] = gpus[ref]
    picks: list[SharePick] = []
    taken: set[tuple[str, GpuRef]] = set()
    steps = [0]

    def search(i: int) -> bool:
        if i == len(ordered):
            return True
        steps[0] += 1
        if steps[0] > MAX_SEARCH_STEPS:
            return False
        req = ordered[i]
        ranked = sorted(
            (
                (free.memory_mib - amount.memory_mib, free.shares - amount.shares, ref.gpu_index),
                ref,
                amount,
            )
            for ref, amount in options[i]
            # `free` once per GPU: this runs for every GPU of every candidate node.
            if (req.group, ref) not in taken and (free := state[ref].free).covers(amount)
        )
        for _, ref, amount in ranked:
            before = state[ref]
            picks.append(SharePick(req.name, ref, amount, before.stranded_after(amount)))
            state[ref] = SharedGpuState(ref, before.capacity, before.used + amount)
            taken.add((req.group, ref))
            if search(i + 1):
                return True
            taken.discard((req.group, ref))
            state[ref] = before
            picks.pop()
        return False

    if not search(0):
        return None
    touched = {p.gpu for p in picks}
    left = sum(state[ref].free.memory_mib for ref in touched)
    opened = sum(1 for ref in touched if gpus[ref].used.shares == 0)
    by_name = {r.name: i for i, r in enumerate(requests)}
    return (left, opened, node), tuple(sorted(picks, key=lambda p: by_name[p.request]))


def place_shares(
    gpus: Mapping[GpuRef, SharedGpuState],
    requests: Sequence[ShareRequest],
    node_ok: Callable[[str], bool] | None = None,
) -> SharePlacement:
    """The best node for all `requests` (see the module rule), or the most specific reason why none."""
    if not requests:
        return SharePlacement(())
    nodes: set[str] | None = None
    for req in requests:
        mine = {ref.node for ref in req.amounts if ref in gpus}
        nodes = mine if nodes is None else nodes & mine
    best: tuple[NodeKey, tuple[SharePick, ...]] | None = None
    for node in sorted(nodes or ()):
        if node_ok is not None and not node_ok(node):
            continue
        hit = place_on_node(gpus, requests, node)
        if hit is not None and (best is None or hit[0] < best[0]):
            best = hit
    if best is not None:
        return SharePlacement(best[1])
    return explain_shares(gpus, requests, node_ok)


def feasible_nodes(
    gpus: Mapping[GpuRef, SharedGpuState],
    requests: Sequence[ShareRequest],
    nodes: Iterable[str],
) -> set[str]:
    return {n for n in nodes if place_on_node(gpus, requests, n) is not None}


def explain_shares(
    gpus: Mapping[GpuRef, SharedGpuState],
    requests: Sequence[ShareRequest],
    node_ok: Callable[[str], bool] | None = None,
) -> SharePlacement:
    """Why no node takes them all: the first share no GPU can hold (and what is short), else NoSingleNode."""
    for req in requests:
        short = {"memory": 0, "cores": 0, "split slots": 0}
        fits = False
        for ref, amount in req.amounts.items():
            st = gpus.get(ref)
            if st is None or (node_ok is not None and not node_ok(ref.node)):
                continue
            if st.fits(amount):
                fits = True
                break
            free = st.free
            short["memory"] += free.memory_mib < amount.memory_mib
            short["cores"] += free.cores < amount.cores
            short["split slots"] += free.shares < amount.shares
        if not fits:
            what = ", ".join(f"{n} on {c}" for n, c in short.items() if c) or "no eligible node"
            return SharePlacement(
                (),
                ShortReason.NO_FREE_PLACEMENT,
                f"share {req.name}: no shareable GPU has room ({what} of {len(req.amounts)} GPUs short)",
            )
    return SharePlacement(
        (),
        ShortReason.NO_SINGLE_NODE,
        "every share fits on some GPU, but no single node takes all of them (one share per GPU per claim)",
    )


__all__ = [
    "MAX_SEARCH_STEPS",
    "ZERO",
    "NodeKey",
    "NodeOptions",
    "ShareAmount",
    "ShareOptions",
    "SharePick",
    "SharePlacement",
    "ShareRequest",
    "SharedGpuState",
    "explain_shares",
    "feasible_nodes",
    "place_on_node",
    "place_shares",
]
