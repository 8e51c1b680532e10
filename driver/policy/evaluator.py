"""Prices candidates per GPU *state* instead of per GPU (see `ClusterState.live_states`).

A GPU's candidates for a request depend only on its state (catalog + occupancy), the request and the
(profile, start) pairs the request allows there, so each distinct combination is evaluated once per
decision, and the weight-independent part (candidates, capacity after placement) is memoised across
decisions in `ClusterState.memo`. Within a state, a candidate whose waste alone already exceeds the
cheapest loss found is skipped when that provably cannot change the pick (see `Evaluator._price`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Protocol

from driver.catalog.types import MigProfile
from driver.placement.choice import ProfileChoiceError, candidate_profiles
from driver.policy.cluster import ClusterState, GpuStateClass
from driver.policy.model import AllowedTable, DeviceRequest, GpuRef, GpuState


class WastePricer(Protocol):
    def waste(self, gpu: GpuState, profile: MigProfile, request: DeviceRequest) -> float: ...


Candidate = tuple[int, int, int, "GpuStateClass"]
AllowedKey = frozenset[tuple[str, int]] | None
_RequestSig = tuple[int, str | None, str | None, frozenset[str]]
_Best = tuple[tuple[float, int, int, int], Candidate] | None
# (index into catalog.profiles, all monotone, ((candidate, capacity loss per class, monotone), ...))
_Priced = tuple[int, bool, tuple[tuple[Candidate, tuple[int, ...], bool], ...]]
_MAX_MEMO = 65536  # (state, request, allowed) entries, a few hundred bytes each


class Evaluator:
    """One decision's view: allowed sets per GPU and best candidate per (state, request, allowed)."""

    def __init__(
        self, policy: WastePricer | None, cluster: ClusterState, weights: tuple[float, ...] = ()
    ) -> None:
        self.policy = policy
        self.cluster = cluster
        self.weights = weights
        # Pruning by waste (see `best`) needs every weight non-negative; NaN weights disable it too.
        self._prune = all(w >= 0 for w in weights)
        if len(cluster.memo) >= _MAX_MEMO:
            cluster.memo.clear()
        self._allowed: dict[int, dict[GpuRef, AllowedKey]] = {}
        self._groups: dict[int, list[tuple[GpuStateClass, AllowedKey, Iterable[GpuRef]]]] = {}
        self._waste: dict[tuple[int, int, _RequestSig], float] = {}
        # Per request signature: (state, allowed) -> best candidate (see `best`).
        self._best: dict[_RequestSig, dict[tuple[GpuStateClass, AllowedKey], _Best]] = {}

    @staticmethod
    def _sig(request: DeviceRequest) -> _RequestSig:
        return (request.memory_mib, request.preferred_profile, request.pinned_profile, request.models)

    def allowed(self, request: DeviceRequest, ref: GpuRef) -> AllowedKey:
        filt = request.device_filter
        if filt is None:
            return None
        cache = self._allowed.setdefault(id(filt), {})
        hit = cache.get(ref, _MISSING)
        if hit is _MISSING:
            hit = cache[ref] = _freeze(filt(ref))
        return hit  # type: ignore[return-value]

    def allowed_on(self, request: DeviceRequest, refs: Sequence[GpuRef]) -> Sequence[AllowedKey]:
        """`allowed` for each of `refs`, in order."""
        if request.device_filter is None:
            return (None,) * len(refs)
        return [self.allowed(request, ref) for ref in refs]

    def groups(self, request: DeviceRequest) -> list[tuple[GpuStateClass, AllowedKey, Iterable[GpuRef]]]:
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
        out: list[tuple[GpuStateClass, AllowedKey, Iterable[GpuRef]]] = []
        if isinstance(filt, AllowedTable):
            out.extend(
                (state, allowed, refs)
                for (state, allowed), refs in self.cluster.table_groups(filt.table).items()
            )
        else:
            for state, refs in self.cluster.live_states():
                if filt is None:
                    out.append((state, None, refs))  # the cluster's own member set: no copy per decision
                    continue
                split: dict[AllowedKey, list[GpuRef]] = {}
                for ref in refs:
                    split.setdefault(self.allowed(request, ref), []).append(ref)
                out.extend((state, allowed, members) for allowed, members in split.items())
        self._groups[key] = out
        return out

    def serves(self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey) -> bool:
        if request.models and state.catalog.model not in request.models:
            return False
        return allowed is None or bool(allowed)

    def candidates(
        self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey
    ) -> tuple[Candidate, ...]:
        """Weight-independent: every legal (profile, start) the request may take on a GPU in `state`."""
        key = (state, self._sig(request), allowed)
        memo = self.cluster.memo
        hit: tuple[Candidate, ...] | None = memo.get(key)
        if hit is not None:
            return hit
        out: list[Candidate] = []
        if self.serves(state, request, allowed):
            occ = state.occupancy
            profiles = state.catalog.profiles
            for rank, i in enumerate(self._profile_indices(state, request, allowed)):
                profile = profiles[i]
                for placement in occ.free_placements(profile):
                    if allowed is not None and (profile.name, placement.start) not in allowed:
                        continue
                    after = self.cluster.intern_placed(state, profile, placement.start)
                    out.append((rank, i, placement.start, after))
        result = tuple(out)
        memo[key] = result
        return result

    def _profile_indices(
        self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey
    ) -> tuple[int, ...]:
        """`_profiles_in` as indices into the catalog's profiles, the profile choice memoised per catalog.

        Indices, not profile objects: GPUs of one catalog id may carry equal but distinct catalogs.
        """
        key = (_PROFILES, state.cid, self._sig(request))
        memo = self.cluster.memo
        chosen: tuple[int, ...] | None = memo.get(key)
        if chosen is None:
            profiles = state.catalog.profiles
            index = {id(p): i for i, p in enumerate(profiles)}
            chosen = memo[key] = tuple(index[id(p)] for p in _profiles_in(profiles, request, None))
        if allowed is None:
            return chosen
        profiles = state.catalog.profiles
        return tuple(
            i for i in chosen if any((profiles[i].name, pl.start) in allowed for pl in profiles[i].placements)
        )

    def _priced(
        self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey
    ) -> tuple[_Priced, ...]:
        """Weight-independent: the candidates by profile (they come profile by profile), each with its
        capacity loss per class (before - after) and whether none of those is negative (then its
        priced loss is at least its waste), and whether that holds for all of the profile's."""
        key = (_PRICED, state, self._sig(request), allowed)
        memo = self.cluster.memo
        hit: tuple[_Priced, ...] | None = memo.get(key)
        if hit is None:
            before = state.vector
            by_profile: dict[int, list[tuple[Candidate, tuple[int, ...], bool]]] = {}
            for cand in self.candidates(state, request, allowed):
                deltas = tuple(b - a for b, a in zip(before, cand[3].vector, strict=True))
                by_profile.setdefault(cand[1], []).append((cand, deltas, all(d >= 0 for d in deltas)))
            hit = memo[key] = tuple(
                (index, all(m for _, _, m in members), tuple(members))
                for index, members in by_profile.items()
            )
        return hit

    def best(self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey) -> _Best:
        """The cheapest (loss, rank, free slices, start) candidate on a GPU in `state`, or None."""
        sig = self._sig(request)
        table = self._best.get(sig)
        if table is None:
            table = self._best[sig] = {}
        hit = table.get((state, allowed), _MISSING)
        if hit is _MISSING:
            hit = table[(state, allowed)] = self._price(state, request, sig, allowed)
        return hit  # type: ignore[return-value]

    def best_for(self, request: DeviceRequest) -> Callable[[GpuStateClass, AllowedKey], _Best]:
        """`best` for one request, as a function of (state, allowed): for scans over many GPUs."""
        sig = self._sig(request)
        table = self._best.get(sig)
        if table is None:
            table = self._best[sig] = {}

        def lookup(state: GpuStateClass, allowed: AllowedKey) -> _Best:
            hit = table.get((state, allowed), _MISSING)
            if hit is _MISSING:
                hit = table[(state, allowed)] = self._price(state, request, sig, allowed)
            return hit  # type: ignore[return-value]

        return lookup

    def best_table(
        self, request: DeviceRequest
    ) -> tuple[
        Mapping[tuple[GpuStateClass, AllowedKey], _Best], Callable[[GpuStateClass, AllowedKey], _Best]
    ]:
        """`best_for(request)` with the table it fills: a hot loop reads the table directly and calls
        the function only for a (state, allowed) pair the table lacks."""
        lookup = self.best_for(request)
        return self._best[self._sig(request)], lookup

    def _price(
        self, state: GpuStateClass, request: DeviceRequest, sig: _RequestSig, allowed: AllowedKey
    ) -> _Best:
        """`best` computed. A candidate whose capacity loss has no negative class, under non-negative
        weights, costs at least its waste (a sum of non-negative terms added to it, and float rounding
        is monotone), so one whose waste alone exceeds the cheapest loss so far cannot win and is not
        priced."""
        assert self.policy is not None
        weights = self.weights
        prune = self._prune
        free = state.free
        pick: _Best = None
        for index, all_monotone, members in self._priced(state, request, allowed):
            wkey = (state.cid, index, sig)
            waste = self._waste.get(wkey)
            if waste is None:
                rep = GpuState(_REP, state.catalog, state.occupancy)
                waste = self._waste[wkey] = self.policy.waste(rep, state.catalog.profiles[index], request)
            if prune and all_monotone and pick is not None and waste > pick[0][0]:
                continue  # the whole profile
            for cand, deltas, monotone in members:
                if prune and monotone and pick is not None and waste > pick[0][0]:
                    continue
                # Same products and summation order as the plain scan (w * (before - after) per
                # class, the difference an exact integer), so costs are bit-identical.
                loss = sum(w * d for w, d in zip(weights, deltas, strict=True))
                loss += waste
                ck = (loss, cand[0], free, cand[2])
                if pick is None or ck < pick[0]:
                    pick = (ck, cand)
        return pick

    def nodes_where(
        self,
        requests: Sequence[DeviceRequest],
        keep: Callable[[GpuStateClass, DeviceRequest, AllowedKey], object],
    ) -> set[str]:
        """Nodes where every request has some GPU whose (state, allowed set) passes `keep`."""
        nodes: set[str] | None = None
        for request in requests:
            found = {
                r.node
                for state, allowed, refs in self.groups(request)
                if keep(state, request, allowed)
                for r in refs
            }
            nodes = found if nodes is None else nodes & found
        return nodes or set()


_MISSING: object = object()
_PROFILES = "profiles"  # memo tags: keys of other memoised evaluations never start with a str
_PRICED = "priced"
_REP = GpuRef("", -1)


def _freeze(allowed: Set[tuple[str, int]] | None) -> AllowedKey:
    if allowed is None or isinstance(allowed, frozenset):
        return allowed
    return frozenset(allowed)


def _profiles_in(
    profiles: Sequence[MigProfile], request: DeviceRequest, allowed: AllowedKey
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
