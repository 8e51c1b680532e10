"""What the catalog hands to the rest of flexmig: the MIG profiles one GPU offers (after the allowlist)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from driver.nvml.types import GpuInfo, Placement


class CatalogWarningKind(StrEnum):
    UNKNOWN_MODEL = "unknown-model"  # NVML name not in driver/catalog/models.py; NVML facts still used
    NO_ALLOWLIST_ENTRY = "no-allowlist-entry"  # no allowlist entry matches: whole GPU only
    PROFILE_NOT_OFFERED = "profile-not-offered"  # allowlisted name the GPU does not offer
    PROFILE_NAME_ROUNDED = "profile-name-rounded"  # allowlisted name read as the GPU's name (7g.79gb)
    DUPLICATE_PROFILE_NAME = "duplicate-profile-name"  # two NVML profiles get the same name
    MIG_UNAVAILABLE = "mig-unavailable"  # the profile query failed (e.g. Ampere with MIG off)
    PROFILES_FROM_BUILTIN = "profiles-from-builtin"  # NVML refused with MIG off: built-in table used


class ProfileOrigin(StrEnum):
    """Where a catalog's profiles came from, and so whether the plugin must ask NVML again later."""

    NVML = "nvml"  # NVML answered (or the GPU has no MIG at all): final
    BUILTIN = "builtin"  # NVML refused while MIG was off; built-in facts for this exact model
    REFUSED = "refused"  # NVML refused while MIG was off and the model is unknown: no profiles yet


@dataclass(frozen=True, slots=True)
class CatalogWarning:
    """Something an admin should fix or know about a GPU's catalog (also logged when discovered)."""

    kind: CatalogWarningKind
    gpu_index: int
    gpu_name: str
    message: str
    profile: str | None = None

    def __str__(self) -> str:
        return f"GPU {self.gpu_index} ({self.gpu_name}): {self.message}"


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU-instance profile of one GPU model, named by NVIDIA's rule (e.g. "3g.20gb", "1g.10gb+me")."""

    name: str
    gi_profile_id: int  # device-specific NVML profile id
    enum_index: int  # NVML_GPU_INSTANCE_PROFILE_* value
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    instance_count: int
    placements: tuple[Placement, ...]

    def placement_at(self, start: int) -> Placement | None:
        return next((p for p in self.placements if p.start == start), None)


@dataclass(frozen=True, slots=True)
class GpuCatalog:
    """One GPU and the MIG profiles flexmig may use on it (allowlisted, discovered through NVML)."""

    gpu: GpuInfo
    model: str  # canonical model key, e.g. "A100-40GB"
    memory_slices: int  # memory-slice axis length (8 on A100-style GPUs, 4 on A30, 12 on RTX PRO 6000)
    compute_slices: int  # compute slices of the whole GPU (7, or 4 on A30 / RTX PRO 6000)
    profiles: tuple[MigProfile, ...]  # allowed profiles, smallest memory first
    all_profiles: tuple[MigProfile, ...]  # every profile the GPU offers, allowed or not
    warnings: tuple[CatalogWarning, ...] = ()  # what discovery found wrong (see CatalogWarningKind)
    origin: ProfileOrigin = ProfileOrigin.NVML

    @property
    def awaits_nvml(self) -> bool:
        """NVML refused the profile query with MIG off: re-read (and compare) once MIG is on."""
        return self.origin is not ProfileOrigin.NVML

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.all_profiles if p.name == name), None)
