"""Cluster-wide placeable capacity, per request class.

A *request class* is a memory size that some allowed profile has exactly; a future request of that
size is served on a GPU by the smallest allowed profile with at least that much memory (the same rule
`choose_profile` applies). The capacity of a GPU for a class is how many more such requests it can
still take, using `reachable_instances` (placement rules included, not just free memory).

The policy prices a candidate placement by the capacity it destroys, each class weighted by how
scarce it is cluster-wide, so taking the last place where a 7g or 4g can go costs far more than
filling a hole only 1g instances fit in. Capacities depend only on (catalog, occupancy), and in a
real cluster many GPUs share both, so results are memoised by that signature.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.choice import size_key
from driver.placement.fragmentation import reachable_instances
from driver.placement.occupancy import Occupancy

CapacityVector = tuple[int, ...]


def request_classes(catalogs: Iterable[GpuCatalog]) -> tuple[int, ...]:
    """Distinct memory sizes (MiB) of every allowed profile, ascending."""
    return tuple(sorted({p.memory_mib for c in catalogs for p in c.profiles}))


def _serving_profiles(catalog: GpuCatalog, memory_mib: int) -> tuple[MigProfile, ...]:
    return tuple(sorted((p for p in catalog.profiles if p.memory_mib >= memory_mib), key=size_key))


def occupancy_signature(occ: Occupancy) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((i.profile.gi_profile_id, i.start) for i in occ.instances))


def catalog_signature(catalog: GpuCatalog) -> tuple[str, tuple[int, ...]]:
    return (catalog.model, tuple(p.gi_profile_id for p in catalog.profiles))


class CapacityModel:
    """Computes capacity vectors (one entry per request class) with memoisation."""

    def __init__(self, classes: Sequence[int]) -> None:
        self.classes = tuple(classes)
        # Keyed by (catalog, occupancy) signatures only: an lru_cache over (key, signature, occ) would
        # also hash `occ` by identity, so every new Occupancy object (one per candidate) missed.
        self._memo: dict[tuple[tuple[str, tuple[int, ...]], tuple[tuple[int, int], ...]], CapacityVector] = {}
        self._catalogs: dict[tuple[str, tuple[int, ...]], GpuCatalog] = {}
        # Per catalog signature, per class: the profiles that serve it, smallest first.
        self._serving: dict[tuple[str, tuple[int, ...]], tuple[tuple[MigProfile, ...], ...]] = {}

    def vector(self, catalog: GpuCatalog, occ: Occupancy, whole_gpu_taken: bool = False) -> CapacityVector:
        if whole_gpu_taken:
            return (0,) * len(self.classes)
        key = catalog_signature(catalog)
        self._catalogs.setdefault(key, catalog)
        sig = occupancy_signature(occ)
        hit = self._memo.get((key, sig))
        if hit is None:
            if len(self._memo) >= 65536:
                self._memo.clear()
            hit = self._memo[(key, sig)] = self._compute(key, sig, occ)
        return hit

    def _compute(
        self,
        catalog_key: tuple[str, tuple[int, ...]],
        _signature: tuple[tuple[int, int], ...],
        occ: Occupancy,
    ) -> CapacityVector:
        # `occ` is not part of the cache key (Occupancy is unhashable); the signature stands for it.
        serving = self._serving.get(catalog_key)
        if serving is None:
            catalog = self._catalogs[catalog_key]
            serving = self._serving[catalog_key] = tuple(_serving_profiles(catalog, m) for m in self.classes)
        # Several classes fall through the same profiles: count each profile's instances once.
        reach_of: dict[int, int] = {}
        out: list[int] = []
        for profiles in serving:
            reach = 0
            # A request falls through to a larger profile when the smallest one has no room.
            for profile in profiles:
                reach = reach_of.get(profile.gi_profile_id, -1)
                if reach < 0:
                    reach = reach_of[profile.gi_profile_id] = reachable_instances(occ, profile)
                if reach:
                    break
            out.append(reach)
        return tuple(out)


def add(a: CapacityVector, b: CapacityVector) -> CapacityVector:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: CapacityVector, b: CapacityVector) -> CapacityVector:
    return tuple(x - y for x, y in zip(a, b, strict=True))
