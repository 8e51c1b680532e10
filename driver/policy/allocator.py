"""Policies that place a pod's device requests: all on one node, all or nothing.

`PackingPolicy` (flexmig's) prices every legal (GPU, profile, start) by the cluster-wide capacity it
destroys (see capacity.py) and takes the cheapest, largest request first; `FirstFitPolicy` is the
baseline kube-scheduler's allocator amounts to (first node, first GPU, smallest profile, lowest free
start). Both read a `ClusterState` and change nothing; the caller commits the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from typing import Protocol

from driver.catalog.types import MigProfile
from driver.nvml.types import Placement as PlacementSpan
from driver.placement.choice import ProfileChoiceError, candidate_profiles
from driver.placement.occupancy import Occupancy
from driver.policy.cluster import ClusterState, GpuStateClass
from driver.policy.model import AllowedTable, Choice, DeviceRequest, GpuRef, GpuState, Placement, ShortReason


class Policy(Protocol):
    name: str

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement: ...


def _serves(gpu: GpuState, request: DeviceRequest) -> bool:
    if request.models and gpu.model not in request.models:
        return False
    allowed = request.allowed(gpu.ref)
    return allowed is None or bool(allowed)


def _profiles_for(gpu: GpuState, request: DeviceRequest) -> tuple[MigProfile, ...]:
    try:
        profiles = candidate_profiles(
            gpu.catalog.profiles,
            request.memory_mib,
            preferred=request.preferred_profile,
            pinned=request.pinned_profile,
        )
    except ProfileChoiceError:
        return ()
    allowed = request.allowed(gpu.ref)
    if allowed is None:
        return profiles
    return tuple(p for p in profiles if any((p.name, pl.start) in allowed for pl in p.placements))


def _free_placements(
    gpu: GpuState, occ: Occupancy, profile: MigProfile, request: DeviceRequest
) -> tuple[PlacementSpan, ...]:
    """Free placements of `profile` on `gpu` that the request's device filter admits."""
    free = occ.free_placements(profile)
    allowed = request.allowed(gpu.ref)
    if allowed is None:
        return free
    return tuple(p for p in free if (profile.name, p.start) in allowed)


def explain_failure(cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
    """The most specific reason why no node can take the whole pod."""
    for request in requests:
        serving = [g for g in cluster.gpus() if _serves(g, request) and _profiles_for(g, request)]
        if not serving:
            return Placement(
                (),
                ShortReason.NO_PROFILE_BIG_ENOUGH,
                f"request {request.name}: no GPU model offers an allowed profile with >= {request.memory_mib} MiB"
                + (f" among models {sorted(request.models)}" if request.models else ""),
            )
        free = [g for g in serving if not g.whole_gpu_taken and _any_free(g, request)]
        if not free:
            enough_slices = [
                g
                for g in serving
                if not g.whole_gpu_taken
                and any(
                    g.occupancy.free_memory_slices >= p.memory_slices
                    and g.occupancy.free_compute_slices >= p.compute_slices
                    for p in _profiles_for(g, request)
                )
            ]
            if enough_slices:
                return Placement(
                    (),
                    ShortReason.FRAGMENTED,
                    f"request {request.name}: {len(enough_slices)} GPU(s) have enough free slices for "
                    f">= {request.memory_mib} MiB, but not at a legal placement",
                )
            return Placement(
                (),
                ShortReason.NO_FREE_PLACEMENT,
                f"request {request.name}: all {len(serving)} GPU(s) that could serve "
                f">= {request.memory_mib} MiB are full",
            )
    return Placement(
        (), ShortReason.NO_SINGLE_NODE, "every request fits somewhere, but no single node takes them all"
    )


def _any_free(gpu: GpuState, request: DeviceRequest) -> bool:
    return any(_free_placements(gpu, gpu.occupancy, p, request) for p in _profiles_for(gpu, request))


def _order(requests: Sequence[DeviceRequest]) -> list[DeviceRequest]:
    # Largest first: the most constrained device picks while the node still has room for it.
    return sorted(requests, key=lambda r: (-r.memory_mib, r.pinned_profile is None, r.name))


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
    state could yield the winning node key; a multi-device pod whose devices share one filter visits
    nodes in order of a lower bound of their cost and stops when no node left can win; any other pod
    runs the per-node greedy pass on states, skipping nodes where some device has no GPU at all.
    `tests/unit/policy/reference_policy.py` keeps the plain scan as the oracle these must equal.
    """

    name = "flexmig"

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
        ev = _Evaluator(self, cluster, self.weights(cluster))
        ordered = _order(requests)
        single = len(ordered) == 1
        best = self._best_single(ev, ordered[0]) if single else self._best_multi(ev, ordered)
        if best is None:
            return explain_failure(cluster, requests)
        return Placement(best[1])

    def _best_single(
        self, ev: _Evaluator, request: DeviceRequest
    ) -> tuple[tuple[float, int, str], tuple[Choice, ...]] | None:
        """Exact best node for one device, visiting only nodes that could hold the winning key.

        A node's key is (round(loss, 9), free, name) of the candidate its scan picks, and that
        candidate is the best of one of its GPUs. So, with groups of GPUs (same state and allowed set)
        taken in order of (round(loss, 9), free) of their best candidate, no node reached only by later
        groups can beat a node already evaluated once that order passes the best key found.
        """
        groups = ev.groups(request)
        ranked: list[tuple[tuple[float, int], int, Iterable[GpuRef]]] = []
        for i, (state, allowed, refs) in enumerate(groups):
            hit = ev.best(state, request, allowed)
            if hit is not None:
                key = hit[0]
                ranked.append(((round(key[0], 9), key[2]), i, refs))
        ranked.sort(key=lambda r: (r[0], r[1]))
        best: tuple[tuple[float, int, str], tuple[Choice, ...]] | None = None
        seen: set[str] = set()
        for bound, _, refs in ranked:
            if best is not None and bound > best[0][:2]:
                break
            for node in sorted({r.node for r in refs} - seen):
                seen.add(node)
                result = self._node(ev, node, (request,))
                if result is not None and (best is None or result[0] < best[0]):
                    best = result
        return best

    def _best_multi(
        self, ev: _Evaluator, ordered: list[DeviceRequest]
    ) -> tuple[tuple[float, int, str], tuple[Choice, ...]] | None:
        bounded = self._best_bounded(ev, ordered)
        if bounded is not None:
            return bounded[0]
        # Whether a GPU serves a request (model, allowed set) does not depend on its state, so a node
        # where some device has no serving GPU fails that device's scan whatever the earlier picks.
        nodes: set[str] | None = None
        for request in ordered:
            served = {
                r.node
                for state, allowed, refs in ev.groups(request)
                if ev.serves(state, request, allowed)
                for r in refs
            }
            nodes = served if nodes is None else nodes & served
        best: tuple[tuple[float, int, str], tuple[Choice, ...]] | None = None
        for node in sorted(nodes or ()):
            result = self._node(ev, node, ordered)
            if result is not None and (best is None or result[0] < best[0]):
                best = result
        return best

    def _best_bounded(
        self, ev: _Evaluator, ordered: list[DeviceRequest]
    ) -> tuple[tuple[tuple[float, int, str], tuple[Choice, ...]] | None] | None:
        """Exact best node for devices sharing one filter, visiting nodes best bound first.

        On any node each device takes the best candidate of one of its GPUs in that GPU's current
        state: for the first device an original state (loss >= m1, the node's least first-device
        loss), for device i an original state or one that picks of devices before i left, i.e. reached
        from an original state through best candidates of earlier devices. So device i's loss is >= g_i,
        the least over all those reachable states, and the node's cost (summed in device order from
        0.0, as the scan does) >= 0.0 + m1 + g_2 + ... (float addition and round are monotone). Groups
        are taken by first-device loss; once that bound, rounded, exceeds the best rounded cost found,
        no node left can win. None (the caller scans) when the filters differ or some g_i is missing.
        """
        filt = ordered[0].device_filter
        if any(r.device_filter is not filt for r in ordered) and not (
            isinstance(filt, AllowedTable)
            and all(
                isinstance(r.device_filter, AllowedTable) and r.device_filter.table is filt.table
                for r in ordered
            )
        ):
            # One table, node_ok aside: groups ignore node_ok; a node some device's node_ok excludes
            # fails as a whole, and on the others every device sees the table's pairs.
            return None
        first = ordered[0]
        ranked: list[tuple[float, int, Iterable[GpuRef]]] = []
        reachable: dict[tuple[GpuStateClass, _AllowedKey], None] = {}
        for i, (state, allowed, refs) in enumerate(ev.groups(first)):
            reachable[(state, allowed)] = None
            hit = ev.best(state, first, allowed)
            if hit is not None:
                ranked.append((hit[0][0], i, refs))
        lower: list[float] = []
        for position, request in enumerate(ordered):
            # States left by this device's picks (from every state reachable before it).
            left: list[tuple[GpuStateClass, _AllowedKey]] = []
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
        best: tuple[tuple[float, int, str], tuple[Choice, ...]] | None = None
        seen: set[str] = set()
        for loss, _, refs in ranked:
            if best is not None:
                bound = 0.0 + loss
                for g in lower:
                    bound += g
                if round(bound, 9) > best[0][0]:
                    break
            for node in sorted({r.node for r in refs} - seen):
                seen.add(node)
                result = self._node(ev, node, ordered)
                if result is not None and (best is None or result[0] < best[0]):
                    best = result
        return (best,)

    def _node(
        self, ev: _Evaluator, node: str, ordered: Sequence[DeviceRequest]
    ) -> tuple[tuple[float, int, str], tuple[Choice, ...]] | None:
        """The per-node greedy scan of the plain implementation, on states."""
        cluster = ev.cluster
        refs = cluster.node_refs(node)
        states = {r: cluster.state_of(r) for r in refs}
        total_cost = 0.0
        choices: list[Choice] = []
        free = 0
        for request in ordered:
            pick: tuple[tuple[float, int, int, int], GpuRef, _Candidate] | None = None
            for ref in refs:
                state = states[ref]
                if state is None:
                    continue
                hit = ev.best(state, request, ev.allowed(request, ref))
                if hit is None:
                    continue
                if pick is None or hit[0] < pick[0]:
                    pick = (hit[0], ref, hit[1])
                if pick[0][1] == 0 and pick[0][0] == 0.0:
                    break  # a free-of-cost exact-profile placement cannot be beaten
            if pick is None:
                return None
            key, ref, cand = pick
            original = cluster.state_of(ref)
            assert original is not None
            free += original.free
            states[ref] = cand[3]
            total_cost += key[0]
            choices.append(Choice(request.name, ref, cluster.gpu(ref).catalog.profiles[cand[1]], cand[2]))
        return (round(total_cost, 9), free, node), tuple(choices)


# (rank, index into catalog.profiles, start, state after placing): independent of weights and policy
_Candidate = tuple[int, int, int, "GpuStateClass"]
_AllowedKey = frozenset[tuple[str, int]] | None
_RequestSig = tuple[int, str | None, str | None, frozenset[str]]
_MAX_MEMO = 65536  # (state, request, allowed) entries, a few hundred bytes each


class _Evaluator:
    """One decision's view: allowed sets per GPU and best candidate per (state, request, allowed)."""

    def __init__(
        self, policy: PackingPolicy | None, cluster: ClusterState, weights: tuple[float, ...] = ()
    ) -> None:
        self.policy = policy
        self.cluster = cluster
        self.weights = weights
        if len(cluster.memo) >= _MAX_MEMO:
            cluster.memo.clear()
        self._allowed: dict[int, dict[GpuRef, _AllowedKey]] = {}
        self._groups: dict[int, list[tuple[GpuStateClass, _AllowedKey, Iterable[GpuRef]]]] = {}
        self._waste: dict[tuple[int, int, _RequestSig], float] = {}
        self._best: dict[
            tuple[GpuStateClass, _RequestSig, _AllowedKey],
            tuple[tuple[float, int, int, int], _Candidate] | None,
        ] = {}

    @staticmethod
    def _sig(request: DeviceRequest) -> _RequestSig:
        return (request.memory_mib, request.preferred_profile, request.pinned_profile, request.models)

    def allowed(self, request: DeviceRequest, ref: GpuRef) -> _AllowedKey:
        filt = request.device_filter
        if filt is None:
            return None
        cache = self._allowed.setdefault(id(filt), {})
        hit = cache.get(ref, _MISSING)
        if hit is _MISSING:
            hit = cache[ref] = _freeze(filt(ref))
        return hit  # type: ignore[return-value]

    def groups(self, request: DeviceRequest) -> list[tuple[GpuStateClass, _AllowedKey, Iterable[GpuRef]]]:
        """Every (state, allowed set) some GPU is in for `request`, with those GPUs.

        GPUs whose allowed set is certainly empty may be left out (they serve nothing). For an
        `AllowedTable` filter the grouping is the cluster's, kept current across decisions; its
        `node_ok` is not applied here (`allowed`, hence the per-node scan, applies it).
        """
        filt = request.device_filter
        key = 0 if filt is None else id(filt)
        hit = self._groups.get(key)
        if hit is not None:
            return hit
        out: list[tuple[GpuStateClass, _AllowedKey, Iterable[GpuRef]]] = []
        if isinstance(filt, AllowedTable):
            out.extend(
                (state, allowed, refs)
                for (state, allowed), refs in self.cluster.table_groups(filt.table).items()
            )
        else:
            for state, refs in self.cluster.live_states():
                if filt is None:
                    out.append((state, None, list(refs)))
                    continue
                split: dict[_AllowedKey, list[GpuRef]] = {}
                for ref in refs:
                    split.setdefault(self.allowed(request, ref), []).append(ref)
                out.extend((state, allowed, members) for allowed, members in split.items())
        self._groups[key] = out
        return out

    def serves(self, state: GpuStateClass, request: DeviceRequest, allowed: _AllowedKey) -> bool:
        if request.models and state.catalog.model not in request.models:
            return False
        return allowed is None or bool(allowed)

    def candidates(
        self, state: GpuStateClass, request: DeviceRequest, allowed: _AllowedKey
    ) -> tuple[_Candidate, ...]:
        """Weight-independent: every legal (profile, start) the request may take on a GPU in `state`."""
        key = (state, self._sig(request), allowed)
        memo = self.cluster.memo
        hit: tuple[_Candidate, ...] | None = memo.get(key)
        if hit is not None:
            return hit
        out: list[_Candidate] = []
        if self.serves(state, request, allowed):
            occ = state.occupancy
            index = {id(p): i for i, p in enumerate(state.catalog.profiles)}
            for rank, profile in enumerate(_profiles_in(state.catalog.profiles, request, allowed)):
                for placement in occ.free_placements(profile):
                    if allowed is not None and (profile.name, placement.start) not in allowed:
                        continue
                    after = self.cluster.intern(state.cid, state.catalog, occ.place(profile, placement.start))
                    out.append((rank, index[id(profile)], placement.start, after))
        result = tuple(out)
        memo[key] = result
        return result

    def best(
        self, state: GpuStateClass, request: DeviceRequest, allowed: _AllowedKey
    ) -> tuple[tuple[float, int, int, int], _Candidate] | None:
        """The cheapest (loss, rank, free slices, start) candidate on a GPU in `state`, or None."""
        key = (state, self._sig(request), allowed)
        if key in self._best:
            return self._best[key]
        assert self.policy is not None
        weights = self.weights
        before = state.vector
        free = state.free
        sig = key[1]
        pick: tuple[tuple[float, int, int, int], _Candidate] | None = None
        for cand in self.candidates(state, request, allowed):
            vec = cand[3].vector
            # Same expression (and summation order) as the plain scan, so costs are bit-identical.
            loss = sum(w * (b - a) for w, b, a in zip(weights, before, vec, strict=True))
            wkey = (state.cid, cand[1], sig)
            waste = self._waste.get(wkey)
            if waste is None:
                rep = GpuState(_REP, state.catalog, state.occupancy)
                waste = self._waste[wkey] = self.policy.waste(rep, state.catalog.profiles[cand[1]], request)
            loss += waste
            ck = (loss, cand[0], free, cand[2])
            if pick is None or ck < pick[0]:
                pick = (ck, cand)
        self._best[key] = pick
        return pick


_MISSING: object = object()
_REP = GpuRef("", -1)


def _freeze(allowed: Set[tuple[str, int]] | None) -> _AllowedKey:
    if allowed is None or isinstance(allowed, frozenset):
        return allowed
    return frozenset(allowed)


def _profiles_in(
    profiles: Sequence[MigProfile], request: DeviceRequest, allowed: _AllowedKey
) -> tuple[MigProfile, ...]:
    """`_profiles_for` on a catalog's profiles and an already-fetched allowed set."""
    try:
        out = candidate_profiles(
            profiles, request.memory_mib, preferred=request.preferred_profile, pinned=request.pinned_profile
        )
    except ProfileChoiceError:
        return ()
    if allowed is None:
        return out
    return tuple(p for p in out if any((p.name, pl.start) in allowed for pl in p.placements))


class FirstFitPolicy:
    """Baseline: nodes by name, GPUs by index, smallest fitting profile, lowest free start.

    Computed on states like `PackingPolicy`: a GPU's first fit is the first of its state's candidates
    (they are listed in profile order, then placement order). Nodes where some device has no GPU with
    a free placement are skipped: placing earlier devices only takes placements away.
    """

    name = "first-fit"

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        if not requests:
            return Placement(()) if cluster.nodes() else explain_failure(cluster, requests)
        ev = _Evaluator(None, cluster)
        nodes: set[str] | None = None
        for request in requests:
            fits = {
                r.node
                for state, allowed, refs in ev.groups(request)
                if ev.candidates(state, request, allowed)
                for r in refs
            }
            nodes = fits if nodes is None else nodes & fits
        for node in sorted(nodes or ()):
            refs = cluster.node_refs(node)
            states = {r: cluster.state_of(r) for r in refs}
            choices: list[Choice] = []
            for request in requests:
                found = self._first(ev, refs, states, request)
                if found is None:
                    break
                ref, (_, index, start, after) = found
                choices.append(Choice(request.name, ref, cluster.gpu(ref).catalog.profiles[index], start))
                states[ref] = after
            else:
                return Placement(tuple(choices))
        return explain_failure(cluster, requests)

    @staticmethod
    def _first(
        ev: _Evaluator,
        refs: list[GpuRef],
        states: dict[GpuRef, GpuStateClass | None],
        request: DeviceRequest,
    ) -> tuple[GpuRef, _Candidate] | None:
        for ref in refs:
            state = states[ref]
            if state is None:
                continue
            cands = ev.candidates(state, request, ev.allowed(request, ref))
            if cands:
                return ref, cands[0]
        return None
