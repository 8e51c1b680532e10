"""Occupancy of one GPU in memory-slice and compute-slice space, and the MIG placement rules.

Rules, all enforced by NVML on real hardware (checked on A100 layouts by tests/unit/test_oracle.py):
- a GPU instance sits on one of its profile's legal placements: memory slices [start, start + size);
- GPU instances never share a memory slice (NVML answers INSUFFICIENT_RESOURCES);
- the compute slices of all instances add up to at most the GPU's (7 on A100-style GPUs; this is why
  3g@0 + 3g@4 leaves one compute slice idle and 7 x 1g strands memory slice 7);
- a profile has at most `instance_count` instances (one "+me" instance owns the media engines);
- a "+me.all" instance takes every media engine, so it only coexists with "-me" instances.

`Occupancy` is immutable: `place`/`remove` return a new value, so search code (layout enumeration, the
allocation policy trying candidates) can branch without undo bookkeeping. Pure: no I/O, no NVML calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from driver.catalog.naming import GiProfileEnum
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.types import GpuInstance, Placement

_ALL_ME = frozenset({GiProfileEnum.SLICE_1_ALL_ME, GiProfileEnum.SLICE_2_ALL_ME})
_NO_ME = frozenset({GiProfileEnum.SLICE_1_NO_ME, GiProfileEnum.SLICE_2_NO_ME})


class OccupancyError(ValueError):
    """An instance cannot be placed or removed; the message says which rule was broken."""


def is_all_me(profile: MigProfile) -> bool:
    return profile.enum_index in _ALL_ME


def is_no_me(profile: MigProfile) -> bool:
    return profile.enum_index in _NO_ME


def slice_mask(start: int, size: int) -> int:
    """Bitmask of memory slices [start, start + size)."""
    return ((1 << size) - 1) << start


@dataclass(frozen=True, slots=True)
class PlacedProfile:
    """A GPU instance of `profile` at memory-slice `start` (placed or planned)."""

    profile: MigProfile
    start: int

    @property
    def placement(self) -> Placement:
        return self.profile.placement_at(self.start) or Placement(self.start, self.profile.memory_slices)

    @property
    def mask(self) -> int:
        p = self.placement
        return slice_mask(p.start, p.size)

    def sort_key(self) -> tuple[int, int, int, str]:
        """Largest instance first, then by start: the order layouts are printed and compared in."""
        return (-self.profile.memory_slices, -self.profile.compute_slices, self.start, self.profile.name)

    def __str__(self) -> str:
        return f"{self.profile.name}@{self.start}"


class Occupancy:
    """What is placed on one GPU, and what still fits.

    `profiles` are the candidates `placeable_profiles()` considers (normally the GPU's allowed
    profiles); placed instances may be of any profile the GPU offers.
    """

    __slots__ = (
        "_compute_used",
        "_counts",
        "_instances",
        "_mask",
        "compute_slices",
        "memory_slices",
        "profiles",
    )

    def __init__(
        self,
        memory_slices: int,
        compute_slices: int,
        profiles: Sequence[MigProfile] = (),
        instances: Iterable[PlacedProfile] = (),
    ) -> None:
        if memory_slices < 0 or compute_slices < 0:
            raise ValueError("slice counts must not be negative")
        self.memory_slices = memory_slices
        self.compute_slices = compute_slices
        self.profiles: tuple[MigProfile, ...] = tuple(profiles)
        self._instances: tuple[PlacedProfile, ...] = ()
        self._mask = 0
        self._compute_used = 0
        self._counts: dict[int, int] = {}
        for inst in instances:
            self._add(inst)

    @classmethod
    def for_catalog(cls, catalog: GpuCatalog, instances: Iterable[PlacedProfile] = ()) -> Occupancy:
        return cls(catalog.memory_slices, catalog.compute_slices, catalog.profiles, instances)

    @classmethod
    def from_gpu_instances(cls, catalog: GpuCatalog, gpu_instances: Iterable[GpuInstance]) -> Occupancy:
        """Occupancy of the instances NVML reports, whoever created them (all of them take space)."""
        by_id = {p.gi_profile_id: p for p in catalog.all_profiles}
        placed: list[PlacedProfile] = []
        for gi in gpu_instances:
            profile = by_id.get(gi.profile_id)
            if profile is None:
                raise OccupancyError(
                    f"GPU instance {gi.gi_id} uses profile id {gi.profile_id}, which "
                    f"{catalog.gpu.name} does not offer (offered: {sorted(by_id)})"
                )
            placed.append(PlacedProfile(profile, gi.placement.start))
        return cls.for_catalog(catalog, placed)

    # --- state -------------------------------------------------------------------------------------

    @property
    def instances(self) -> tuple[PlacedProfile, ...]:
        return self._instances

    @property
    def used_memory_mask(self) -> int:
        return self._mask

    @property
    def used_memory_slices(self) -> int:
        return self._mask.bit_count()

    @property
    def free_memory_slices(self) -> int:
        return self.memory_slices - self.used_memory_slices

    @property
    def used_compute_slices(self) -> int:
        return self._compute_used

    @property
    def free_compute_slices(self) -> int:
        return self.compute_slices - self._compute_used

    @property
    def is_empty(self) -> bool:
        return not self._instances

    def count(self, profile: MigProfile) -> int:
        """Instances of `profile` (by NVML profile id) currently placed."""
        return self._counts.get(profile.gi_profile_id, 0)

    def is_free(self, start: int, size: int) -> bool:
        return self._mask & slice_mask(start, size) == 0

    # --- rules -------------------------------------------------------------------------------------

    def exclusivity_allows(self, profile: MigProfile) -> bool:
        """The "+me.all" rule alone: may `profile` join the instances already placed?"""
        if is_all_me(profile):
            return all(is_no_me(i.profile) for i in self._instances)
        return is_no_me(profile) or not any(is_all_me(i.profile) for i in self._instances)

    def why_not(self, profile: MigProfile, start: int) -> str | None:
        """Why `profile` cannot be placed at `start` (None if it can)."""
        placement = profile.placement_at(start)
        if placement is None:
            legal = ",".join(str(p.start) for p in profile.placements) or "none"
            return f"{start} is not a legal start of {profile.name} (legal starts: {legal})"
        if placement.end > self.memory_slices:
            return f"{profile.name}@{start} ends past the GPU's {self.memory_slices} memory slices"
        mask = slice_mask(placement.start, placement.size)
        if self._mask & mask:
            clash = ", ".join(str(i) for i in self._instances if i.mask & mask)
            return f"memory slices {placement.start}-{placement.end - 1} of {profile.name}@{start} overlap {clash}"
        if profile.compute_slices > self.free_compute_slices:
            return (
                f"{profile.name} needs {profile.compute_slices} compute slices, "
                f"{self.free_compute_slices} of {self.compute_slices} are free"
            )
        if self.count(profile) >= profile.instance_count:
            return f"{profile.name} already has its maximum of {profile.instance_count} instance(s)"
        if not self.exclusivity_allows(profile):
            if is_all_me(profile):
                return f"{profile.name} takes every media engine and only coexists with -me instances"
            holder = next(str(i) for i in self._instances if is_all_me(i.profile))
            return f"{holder} takes every media engine; only -me profiles may join it"
        return None

    def can_place(self, profile: MigProfile, start: int) -> bool:
        placement = profile.placement_at(start)
        return placement is not None and self._fits(profile, placement)

    def _fits(self, profile: MigProfile, placement: Placement) -> bool:
        """`why_not(profile, placement.start) is None` for one of the profile's own placements, without
        building the refusal message (the allocator asks this for every candidate of every state)."""
        return (
            placement.end <= self.memory_slices
            and not self._mask & slice_mask(placement.start, placement.size)
            and profile.compute_slices <= self.compute_slices - self._compute_used
            and self._counts.get(profile.gi_profile_id, 0) < profile.instance_count
            and self.exclusivity_allows(profile)
        )

    def free_placements(self, profile: MigProfile) -> tuple[Placement, ...]:
        """Legal placements of `profile` that can be created now, in NVML order."""
        return tuple(p for p in profile.placements if self._fits(profile, p))

    def placeable_profiles(self) -> tuple[MigProfile, ...]:
        """The candidate profiles with at least one free placement now."""
        return tuple(p for p in self.profiles if self.free_placements(p))

    @property
    def is_maximal(self) -> bool:
        """True when no candidate profile fits anywhere any more."""
        return not self.placeable_profiles()

    # --- transitions -------------------------------------------------------------------------------

    def place(self, profile: MigProfile, start: int) -> Occupancy:
        """A new occupancy with `profile@start` added; OccupancyError if a rule forbids it."""
        new = self._copy()
        new._add(PlacedProfile(profile, start))
        return new

    def remove(self, profile: MigProfile, start: int) -> Occupancy:
        target = PlacedProfile(profile, start)
        if target not in self._instances:
            raise OccupancyError(f"{target} is not placed on this GPU")
        remaining = list(self._instances)
        remaining.remove(target)
        return Occupancy(self.memory_slices, self.compute_slices, self.profiles, remaining)

    def _copy(self) -> Occupancy:
        new = Occupancy(self.memory_slices, self.compute_slices, self.profiles)
        new._instances = self._instances
        new._mask = self._mask
        new._compute_used = self._compute_used
        new._counts = dict(self._counts)
        return new

    def _add(self, inst: PlacedProfile) -> None:
        reason = self.why_not(inst.profile, inst.start)
        if reason is not None:
            raise OccupancyError(f"cannot place {inst}: {reason}")
        self._instances = (*self._instances, inst)
        self._mask |= inst.mask
        self._compute_used += inst.profile.compute_slices
        pid = inst.profile.gi_profile_id
        self._counts[pid] = self._counts.get(pid, 0) + 1

    def __repr__(self) -> str:
        inner = " + ".join(str(i) for i in sorted(self._instances, key=PlacedProfile.sort_key)) or "empty"
        return (
            f"Occupancy({inner}; memory {self.used_memory_slices}/{self.memory_slices}, "
            f"compute {self._compute_used}/{self.compute_slices})"
        )
