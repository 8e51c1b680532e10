"""Policies that place a pod's device requests: all on one node, all or nothing.

`PackingPolicy` (flexmig's) prices every legal (GPU, profile, start) by the cluster-wide capacity it
destroys (see capacity.py) and takes the cheapest, largest request first; `FirstFitPolicy` is the
baseline kube-scheduler's allocator amounts to (first node, first GPU, smallest profile, lowest free
start, in firstfit.py). Both read a `ClusterState` and change nothing; the caller commits the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from driver.catalog.types import MigProfile
from driver.policy.cluster import ClusterState, GpuStateClass
from driver.policy.evaluator import AllowedKey, Candidate, Evaluator
from driver.policy.explain import explain_failure, largest_first
from driver.policy.firstfit import FirstFitPolicy
from driver.policy.model import AllowedTable, Choice, DeviceRequest, EndHint, GpuRef, GpuState, Placement
from driver.policy.pairsearch import best_pair, visit_nodes

# `PackingPolicy.hint_weight`'s default: the weight of a full lifetime's delay of a GPU becoming whole.
# Chosen coarsely from three values in benchmarks/packing (see benchmarks/RESULTS.md, "Lifetime hint").
HINT_WEIGHT = 0.1


class Policy(Protocol):
    name: str

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement: ...


class PackingPolicy:
    """Cheapest placement by cluster-wide capacity loss (scarce classes weigh more) plus memory waste.

    The decision is the one a plain scan makes: for every node (by name), devices largest first, each
    taking the node's cheapest (loss, rank, free slices, start) candidate over its GPUs in index order
    (stopping at the first free-of-cost exact-profile one), and the node with the least
    (round(cost, 9), free slices of the chosen GPUs, name) wins. It is computed on *states* instead of
    GPUs (see `ClusterState.live_states`): a GPU's best candidate depends only on its state, the
    request and the (profile, start) pairs the request allows there, so each distinct combination is
    priced once per decision, and its weight-independent part (candidates, capacity after placement)
    is memoised across decisions. A single-device pod then only looks at nodes holding a GPU whose
    state could yield the winning node key, and among those only the first by name that still could
    win (with hundreds of equally good GPUs, the first few); a multi-device pod whose devices share one filter visits
    nodes in order of a lower bound of their cost (by name within one bound, with a lower bound of their
    free slices) and stops when no node left can win (two devices: a bound per node, from the pairs of
    GPU states it holds, in pairsearch.py); any other pod
    runs the per-node greedy pass on states, skipping nodes where some device has no GPU at all.
    `tests/unit/policy/reference_policy.py` keeps the plain scan as the oracle these must equal.

    Lifetime hints (`DeviceRequest.end_hint`): a hinted device's price on a GPU is the GPU's best
    candidate price plus `colocation` of the GPU's latest hinted end (`ClusterState.latest_end`). The
    term is the same for every candidate on a GPU, so it is added per GPU in the node scan and never
    enters the per-state memo; it is >= 0, so the per-state prices the shortcuts bound nodes with stay
    lower bounds (they only scan more nodes when hints are in play). Unhinted devices get no term.
    """

    name = "flexmig"

    def __init__(self, hint_weight: float = HINT_WEIGHT) -> None:
        if not hint_weight >= 0:  # the shortcuts' bounds need a non-negative term (NaN refused too)
            raise ValueError(f"hint_weight must be >= 0, got {hint_weight}")
        self.hint_weight = hint_weight

    def colocation(self, hint: EndHint, gpu_end: float | None) -> float:
        """What placing a pod expected to end at `hint.end` on a GPU costs in whole-GPU time.

        A GPU becomes whole when its last instance ends. A pod ending after every hinted instance of
        its GPU delays that by `hint.end - gpu_end`; one ending earlier delays nothing. The delay is
        counted as a share of the pod's own remaining time (capped at 1) times `hint_weight`. The
        caller passes an empty GPU's end as now (`hint.end - hint.remaining`: it is whole now, so the
        pod delays it by its whole remaining time, the full weight; pricing it 0 sent long pods to
        empty GPUs and measurably cut the GPUs left whole), and None for a GPU whose instances carry no
        hint (their end is unknown): 0.
        """
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
        cluster.trim()
        ev = Evaluator(self, cluster, self.weights(cluster))
        ordered = largest_first(requests)
        single = len(ordered) == 1
        best = self._best_single(ev, ordered[0]) if single else self._best_multi(ev, ordered)
        if best is None:
            return explain_failure(cluster, requests)
        return Placement(best[1])

    def _best_single(
        self, ev: Evaluator, request: DeviceRequest
    ) -> tuple[tuple[float, int, str], tuple[Choice, ...]] | None:
        """Exact best node for one device, visiting only nodes that could hold the winning key.

        A node's key is (round(loss, 9), free, name) of the candidate its scan picks, and that
        candidate is the best of one of its GPUs, so the key is at least (k, name) where k is the
        least (round(loss, 9), free) over the groups (GPUs of one state and allowed set) the node has
        a GPU in. Groups are taken in order of k, each group's nodes by name: the first group that
        reaches a node gives that node's bound (k, name); once it is not below the best key found,
        neither is any later node of the group (same k, larger name) nor any node a later group
        reaches first. So among hundreds of nodes with equally good GPUs only the first few by name
        are scanned.
        """
        groups = ev.groups(request)
        ranked: list[tuple[tuple[float, int], int, Iterable[GpuRef]]] = []
        for i, (state, allowed, refs) in enumerate(groups):
            hit = ev.best(state, request, allowed)
            if hit is not None:
                key = hit[0]
                ranked.append(((round(key[0], 9), key[2]), i, refs))
        ranked.sort(key=lambda r: (r[0], r[1]))
        scan = _NodeScan(self, ev, (request,))
        best: tuple[tuple[float, int, str], list[_Pick]] | None = None
        seen: set[str] = set()
        for (loss, free), _, refs in ranked:
            if best is not None and (loss, free) > best[0][:2]:
                break
            best = _visit_group(scan, refs, seen, (loss, free), best)
        return None if best is None else (best[0], scan.choices(best[0][2], best[1]))

    def _best_multi(
        self, ev: Evaluator, ordered: list[DeviceRequest]
    ) -> tuple[tuple[float, int, str], tuple[Choice, ...]] | None:
        bounded = self._best_bounded(ev, ordered)
        if bounded is not None:
            return bounded[0]
        # Whether a GPU serves a request (model, allowed set) does not depend on its state, so a node
        # where some device has no serving GPU fails that device's scan whatever the earlier picks.
        nodes = ev.nodes_where(ordered, ev.serves)
        scan = _NodeScan(self, ev, ordered)
        best: tuple[tuple[float, int, str], list[_Pick]] | None = None
        for node in sorted(nodes):
            result = scan.key(node)
            if result is not None and (best is None or result[0] < best[0]):
                best = result
        return None if best is None else (best[0], scan.choices(best[0][2], best[1]))

    def _best_bounded(
        self, ev: Evaluator, ordered: list[DeviceRequest]
    ) -> tuple[tuple[tuple[float, int, str], tuple[Choice, ...]] | None] | None:
        """Exact best node for devices sharing one filter, visiting nodes best bound first.

        On any node each device takes the best candidate of one of its GPUs in that GPU's current
        state: for the first device an original state (loss >= m1, the node's least first-device
        loss), for device i an original state or one that picks of devices before i left, i.e. reached
        from an original state through best candidates of earlier devices. So device i's loss is >= g_i,
        the least over all those reachable states, and the node's cost (summed in device order from
        0.0, as the scan does) >= 0.0 + m1 + g_2 + ... (float addition and round are monotone). Groups
        are taken by first-device loss; once that bound, rounded, exceeds the best rounded cost found,
        no node left can win. Within a group, nodes go by name with the key bound (cost bound, least
        free, name): device i's GPU was first taken, from its original state, by some device j <= i,
        so its original free is at least the least free of the groups serving some j <= i; once the
        bound is not below the best key, no later node of the group (larger name) can win.
        None (the caller scans) when the filters differ or some g_i is missing. Two devices go to
        pairsearch.py instead: with per-node bounds it visits far fewer nodes when many tie.
        """
        if not _shared_filter(ordered):
            return None
        if len(ordered) == 2:
            scan = _NodeScan(self, ev, ordered)
            found = best_pair(ev, scan, ordered[0], ordered[1])
            return (None if found is None else (found[0], scan.choices(found[0][2], found[1])),)
        first = ordered[0]
        groups = ev.groups(first)
        ranked: list[tuple[float, int, Iterable[GpuRef]]] = []
        reachable: dict[tuple[GpuStateClass, AllowedKey], None] = {}
        for i, (state, allowed, refs) in enumerate(groups):
            reachable[(state, allowed)] = None
            hit = ev.best(state, first, allowed)
            if hit is not None:
                ranked.append((hit[0][0], i, refs))
        # The node's free slices: device i's GPU was first taken (from its original state) by some
        # device j <= i, so its original free is at least the least free of a group serving j.
        least_free = 0
        serving: int | None = None
        for request in ordered:
            for state, allowed, _ in groups:
                if (serving is None or state.free < serving) and ev.best(state, request, allowed) is not None:
                    serving = state.free
            if serving is None:
                return None
            least_free += serving
        lower: list[float] = []
        for position, request in enumerate(ordered):
            # States left by this device's picks (from every state reachable before it).
            left: list[tuple[GpuStateClass, AllowedKey]] = []
            least: float | None = None
            for state, allowed in reachable:
                hit = ev.best(state, request, allowed)
                if hit is None:
                    continue
                if least is None or hit[0][0] < least:
                    least = hit[0][0]
                left.append((hit[1][3], allowed))
            if least is None:
                return None
            if position:
                lower.append(least)
            for pair in left:
                reachable[pair] = None
        ranked.sort(key=lambda r: (r[0], r[1]))
        scan = _NodeScan(self, ev, ordered)
        best: tuple[tuple[float, int, str], list[_Pick]] | None = None
        seen: set[str] = set()
        for loss, _, refs in ranked:
            bound = 0.0 + loss
            for g in lower:
                bound += g
            cost = round(bound, 9)
            if best is not None and cost > best[0][0]:
                break
            # Each of this group's nodes has key >= (cost, least_free, name).
            best = _visit_group(scan, refs, seen, (cost, least_free), best)
        return (None if best is None else (best[0], scan.choices(best[0][2], best[1])),)


def _shared_filter(ordered: Sequence[DeviceRequest]) -> bool:
    """Whether every device sees the same groups: one filter, or one `AllowedTable`'s table (node_ok
    aside: groups ignore it; a node some device's node_ok excludes fails as a whole, and on the others
    every device sees the table's pairs)."""
    filt = ordered[0].device_filter
    return all(r.device_filter is filt for r in ordered) or (
        isinstance(filt, AllowedTable)
        and all(
            isinstance(r.device_filter, AllowedTable) and r.device_filter.table is filt.table for r in ordered
        )
    )


_Pick = tuple[int, Candidate]  # (slot in the node, candidate taken there)
_Best = tuple[tuple[float, int, str], list[_Pick]]


def _visit_group(
    scan: _NodeScan, refs: Iterable[GpuRef], seen: set[str], bound: tuple[float, int], best: _Best | None
) -> _Best | None:
    """Scan a group's unseen nodes by name, each with key >= (*bound, name); stop once that bound
    is not below the best key (no later node of the group can win). Returns the new best."""
    return visit_nodes(scan, list({r.node for r in refs} - seen), seen, bound, best)


class _NodeScan:
    """The per-node greedy scan of the plain implementation, on states, for one decision's devices.

    Split in two so that the nodes a search visits are only priced (`key`) and `Choice`s are built
    (`choices`) for the winner only; what does not depend on the node (each device's table of best
    candidates, whether hints are in play) is fetched once per decision.
    """

    __slots__ = ("cluster", "ev", "hinted", "lookups", "policy")

    def __init__(self, policy: PackingPolicy, ev: Evaluator, ordered: Sequence[DeviceRequest]) -> None:
        self.policy = policy
        self.ev = ev
        self.cluster = ev.cluster
        self.lookups = [(request, *ev.best_table(request)) for request in ordered]
        self.hinted = any(r.end_hint is not None for r in ordered)

    def key(self, node: str) -> tuple[tuple[float, int, str], list[_Pick]] | None:
        """The node's (round(cost, 9), free slices, name) and its picks, or None where a device fails."""
        cluster = self.cluster
        ev = self.ev
        refs = cluster.node_refs(node)
        originals = cluster.node_state_classes(node)
        states = list(originals)
        total_cost = 0.0
        picks: list[_Pick] = []
        free = 0
        # Latest hinted end per GPU, kept current as this pod's hinted devices are placed.
        ends = [cluster.latest_end(r) for r in refs] if self.hinted else []
        colocation = self.policy.colocation
        for request, table, best in self.lookups:
            allowed = ev.allowed_on(request, refs)
            hint = request.end_hint
            pick: tuple[tuple[float, int, int, int], int, Candidate] | None = None
            for slot, state in enumerate(states):
                if state is None:
                    continue
                pair = (state, allowed[slot])
                try:
                    hit = table[pair]
                except KeyError:  # first time this decision: priced (and stored) by `best`
                    hit = best(*pair)
                if hit is None:
                    continue
                key = hit[0]
                if hint is not None:
                    end = ends[slot]
                    if end is None and not state.occupancy.instances:
                        end = hint.end - hint.remaining  # empty: whole until now
                    term = colocation(hint, end)
                    if term:
                        key = (key[0] + term, key[1], key[2], key[3])
                if pick is None or key < pick[0]:
                    pick = (key, slot, hit[1])
                if pick[0][1] == 0 and pick[0][0] == 0.0:
                    break  # a free-of-cost exact-profile placement cannot be beaten
            if pick is None:
                return None
            key, slot, cand = pick
            original = originals[slot]
            assert original is not None
            free += original.free
            states[slot] = cand[3]
            if hint is not None:
                end = ends[slot]
                ends[slot] = hint.end if end is None else max(end, hint.end)
            total_cost += key[0]
            picks.append((slot, cand))
        return (round(total_cost, 9), free, node), picks

    def choices(self, node: str, picks: list[_Pick]) -> tuple[Choice, ...]:
        refs = self.cluster.node_refs(node)
        gpu = self.cluster.gpu
        return tuple(
            Choice(request.name, refs[slot], gpu(refs[slot]).catalog.profiles[cand[1]], cand[2])
            for (request, _, _), (slot, cand) in zip(self.lookups, picks, strict=True)
        )


# (rank, index into catalog.profiles, start, state after placing): independent of weights and policy


__all__ = ["HINT_WEIGHT", "FirstFitPolicy", "PackingPolicy", "Policy", "explain_failure"]
