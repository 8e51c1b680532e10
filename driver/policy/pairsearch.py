"""Exact best node for a two-device pod, visiting nodes in order of a per-node lower bound of their key.

A node's key (see `PackingPolicy` in allocator.py) comes from its greedy scan: the first device takes
the best candidate of some GPU j1 in its current state s1, the second the best candidate of some GPU
j2: j1 again, in the state the first pick left (s1's best candidate's state), or another GPU in its
current state s2. Each GPU's best candidate depends only on its (state, allowed set) group, so the
node's key is the *pair key* of one of the pairs its groups offer:

    same GPU:     (round(0.0 + c1(s1) + c2(after(s1)), 9), free(s1) + free(s1))
    two GPUs:     (round(0.0 + c1(s1) + c2(s2), 9),        free(s1) + free(s2))

(c1, c2: the devices' best losses in a group; free: the group's free memory slices), the cost summed
in the scan's order. With lifetime hints each device's loss gains a term >= 0 on its GPU; float
addition and round are monotone, so the key is then at least that pair key. Hence a node's key is at
least the least pair key over the pairs its GPUs offer, which the greedy order does not enter (the
bound counts pairs the scan would not take; measured on 1,000 nodes x 8 GPUs, that loosens it for
next to no node).

The search takes pairs of groups in ascending pair key (lazily: per first-device group, second-device
groups by ascending c2, with a bound on the rest of that list) and, per pair, the nodes that hold it
(a node index per group: `ClusterState.state_nodes` when the devices have no filter). The first pair
that reaches a node gives its bound (pair key, name); unseen nodes of a pair are scanned by name until
that bound is not below the best key found, and the search stops at the first pair key above it: the
same argument as `PackingPolicy._best_single`'s, with pairs for groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Protocol

from driver.policy.cluster import GpuStateClass
from driver.policy.evaluator import AllowedKey, Candidate, Evaluator
from driver.policy.model import DeviceRequest, GpuRef

_Key = tuple[float, int, str]
_Pick = tuple[int, Candidate]
_Best = tuple[_Key, list[_Pick]]


class NodeKey(Protocol):
    def key(self, node: str) -> _Best | None: ...


def best_pair(ev: Evaluator, scan: NodeKey, first: DeviceRequest, second: DeviceRequest) -> _Best | None:
    """The least node key for `first` then `second` (largest first), or None where no node takes both.

    Both requests must see the same groups: the same filter, or `AllowedTable`s over one table (the
    caller checks; a node a table's `node_ok` refuses is in the groups but fails its scan)."""
    groups = ev.groups(first)
    cluster = ev.cluster
    best_of = ev.best
    # Second-device entries by ascending loss: (c2, free, group, state id); for a first-device group
    # only those whose state shares a node with its state count (`ClusterState.colocated`).
    twos: list[tuple[float, int, int, int]] = []
    ones: list[tuple[float, int, Mapping[int, int]] | None] = []  # per group: (c1, free, colocated)
    heap: list[tuple[tuple[float, int], int, int, int]] = []
    for i, (state, allowed, _) in enumerate(groups):
        hit2 = best_of(state, second, allowed)
        if hit2 is not None:
            twos.append((hit2[0][0], state.free, i, state.sid))
        hit1 = best_of(state, first, allowed)
        if hit1 is None:
            ones.append(None)
            continue
        c1 = hit1[0][0]
        ones.append((c1, state.free, cluster.colocated(state)))
        after = best_of(hit1[1][3], second, allowed)
        if after is not None:  # both devices on one GPU of this group
            heap.append(((round(0.0 + c1 + after[0][0], 9), 2 * state.free), _EXACT, i, _SAME))
    twos.sort(key=lambda t: t[0])
    # least_free[k]: the least free of entries k.., so (c2 of entry k, least_free[k]) bounds them all.
    least_free = [0] * len(twos)
    running: int | None = None
    for k in range(len(twos) - 1, -1, -1):
        running = twos[k][1] if running is None else min(running, twos[k][1])
        least_free[k] = running
    end = len(twos)

    def push_rest(i: int, k: int) -> None:
        """Push group i's entries from k on, skipping those whose state never shares a node with i's."""
        one = ones[i]
        assert one is not None
        c1, free, near = one
        while k < end and twos[k][3] not in near:
            k += 1
        if k < end:
            heappush(heap, ((round(0.0 + c1 + twos[k][0], 9), free + least_free[k]), _REST, i, k))

    heapify(heap)
    for i, one in enumerate(ones):
        if one is not None:
            push_rest(i, 0)
    nodes = _NodeSets(ev, groups, first.device_filter is None)
    best: _Best | None = None
    seen: set[str] = set()
    while heap:
        bound, kind, i, k = heappop(heap)
        if best is not None and bound > best[0][:2]:
            break  # every pair left, hence every node not yet reached, has a key above the best
        if kind == _REST:
            one = ones[i]
            assert one is not None
            c2, free2 = twos[k][:2]
            heappush(heap, ((round(0.0 + one[0] + c2, 9), one[1] + free2), _EXACT, i, k))
            push_rest(i, k + 1)
            continue
        # At the best key's (cost, free) only nodes named before the best can still win.
        limit = best[0][2] if best is not None and bound == best[0][:2] else None
        if k == _SAME:
            names = nodes.holding(i, i, 1, seen, limit)
        else:
            j = twos[k][2]
            names = nodes.holding(i, j, 2 if i == j else 1, seen, limit)
        best = visit_nodes(scan, names, seen, bound, best)
    return best


_EXACT = 0  # heap entry: one pair of groups, its exact pair key
_REST = 1  # heap entry: first-device group i with second-device entries k.., a lower bound of their keys
_SAME = -1  # the pair "both devices on one GPU of group i"


class _NodeSets:
    """Per group, its nodes with how many of their GPUs are in it: the cluster's index for unfiltered
    groups, otherwise counted from the group's GPUs, once per decision and only for groups a pair asks."""

    __slots__ = ("counted", "ev", "groups", "unfiltered")

    def __init__(
        self,
        ev: Evaluator,
        groups: Sequence[tuple[GpuStateClass, AllowedKey, Iterable[GpuRef]]],
        unfiltered: bool,
    ) -> None:
        self.ev = ev
        self.groups = groups
        self.unfiltered = unfiltered
        self.counted: dict[int, Mapping[str, int]] = {}

    def of(self, i: int) -> Mapping[str, int]:
        hit = self.counted.get(i)
        if hit is None:
            state, _, refs = self.groups[i]
            if self.unfiltered:  # the group is every GPU in the state
                hit = self.ev.cluster.state_nodes(state)
            else:
                counts: dict[str, int] = {}
                for ref in refs:
                    counts[ref.node] = counts.get(ref.node, 0) + 1
                hit = counts
            self.counted[i] = hit
        return hit

    def holding(self, i: int, j: int, twice: int, seen: set[str], limit: str | None) -> list[str]:
        """Unseen nodes with a GPU in group i and another in group j (`twice` = 2 when they are one
        group), named below `limit` when given (no other node of the pair can beat the best)."""
        a = self.of(i)
        if i == j:
            found = [n for n, count in a.items() if count >= twice and n not in seen]
        else:
            b = self.of(j)
            small, large = (a, b) if len(a) <= len(b) else (b, a)
            found = [n for n in small if n in large and n not in seen]
        if limit is not None:
            found = [n for n in found if n < limit]
        return found


def visit_nodes(
    scan: NodeKey, names: list[str], seen: set[str], bound: tuple[float, int], best: _Best | None
) -> _Best | None:
    """Scan unseen nodes by name, each with key >= (*bound, name), until that is not below the best
    key (no later node can win). Returns the new best; `names` is consumed."""
    heapify(names)  # popped lazily: usually only the first few are needed
    while names:
        node = heappop(names)
        if best is not None and (*bound, node) >= best[0]:
            break
        seen.add(node)
        result = scan.key(node)
        if result is not None and (best is None or result[0] < best[0]):
            best = result
    return best
