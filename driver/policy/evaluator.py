"""Prices candidates per GPU *state* instead of per GPU (see `ClusterState.live_states`).

A GPU's candidates for a request depend only on its state (catalog + occupancy), the request and the
(profile, start) pairs the request allows there, so each distinct combination is evaluated once per
decision, and the weight-independent part (candidates, capacity after placement) is memoised across
decisions in `ClusterState.memo`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
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
_MAX_MEMO = 65536  # (state, request, allowed) entries, a few hundred bytes each


class Evaluator:
    """One decision's view: allowed sets per GPU and best candidate per (state, request, allowed)."""

    def __init__(
        self, policy: WastePricer | None, cluster: ClusterState, weights: tuple[float, ...] = ()
    ) -> None:
        self.policy = policy
        self.cluster = cluster
        self.weights = weights
        if len(cluster.memo) >= _MAX_MEMO:
            cluster.memo.clear()
        self._allowed: dict[int, dict[GpuRef, AllowedKey]] = {}
        self._groups: dict[int, list[tuple[GpuStateClass, AllowedKey, Iterable[GpuRef]]]] = {}
        self._waste: dict[tuple[int, int, _RequestSig], float] = {}
        self._best: dict[
            tuple[GpuStateClass, _RequestSig, AllowedKey],
            tuple[tuple[float, int, int, int], Candidate] | None,
        ] = {}

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
                    out.append((state, None, list(refs)))
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
        self, state: GpuStateClass, request: DeviceRequest, allowed: AllowedKey
    ) -> tuple[tuple[float, int, int, int], Candidate] | None:
        """The cheapest (loss, rank, free slices, start) candidate on a GPU in `state`, or None."""
        key = (state, self._sig(request), allowed)
        if key in self._best:
            return self._best[key]
        assert self.policy is not None
        weights = self.weights
        before = state.vector
        free = state.free
        sig = key[1]
        pick: tuple[tuple[float, int, int, int], Candidate] | None = None
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
