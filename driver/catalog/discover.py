"""Build a GPU's MIG catalog from NVML facts and the allowlist.

Everything about a profile (memory, slices, engines, instance limit, placements) is read through the
NVML port; only the *name* is computed (NVIDIA's rule, naming.py) because names are what admins write
in the allowlist. Problems are never dropped silently: each becomes a `CatalogWarning` on the returned
catalog and a structlog warning, so `flexmig profiles` and the node logs show what an admin must fix.

One exception to "read through NVML": a Hopper-or-newer GPU with MIG off may refuse profile queries
(nvml.h documents NOT_SUPPORTED then), yet such a GPU publishes MIG devices before MIG is on. Its
profiles then come from the built-in facts for its exact model (builtin.py), and the catalog says so
(`origin`), so the plugin re-reads NVML once MIG is on. An unknown model in that state publishes the
whole GPU only, with a warning saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import structlog

from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist
from driver.catalog.builtin import builtin_profile_infos, builtin_sku
from driver.catalog.models import model_for_nvml_name
from driver.catalog.naming import profile_name, rounded_name_match
from driver.catalog.types import CatalogWarning, CatalogWarningKind, GpuCatalog, MigProfile, ProfileOrigin
from driver.nvml.types import GiProfileInfo, GpuInfo, MigMode, NvmlError

log = structlog.get_logger(__name__)


class ProfileSource(Protocol):
    """The part of the NVML port discovery needs (driver.nvml.port.Nvml satisfies it)."""

    def gpus(self) -> list[GpuInfo]: ...

    def gpu(self, index: int) -> GpuInfo: ...

    def gi_profiles(self, index: int) -> list[GiProfileInfo]: ...

    def mig_mode(self, index: int) -> MigMode: ...


def profile_order(profile: MigProfile) -> tuple[int, int, int, str]:
    """Smallest first: memory, then compute slices, then memory slices, then name."""
    return (profile.memory_mib, profile.compute_slices, profile.memory_slices, profile.name)


def mig_profile(info: GiProfileInfo, total_mib: int) -> MigProfile:
    """A catalog profile from one NVML GI profile of a GPU with `total_mib` MiB of memory."""
    return MigProfile(
        name=profile_name(info.compute_slices, info.memory_mib, total_mib, info.enum_index),
        gi_profile_id=info.profile_id,
        enum_index=info.enum_index,
        compute_slices=info.compute_slices,
        memory_slices=info.memory_slices,
        memory_mib=info.memory_mib,
        multiprocessors=info.multiprocessors,
        copy_engines=info.copy_engines,
        decoders=info.decoders,
        encoders=info.encoders,
        jpegs=info.jpegs,
        ofas=info.ofas,
        instance_count=info.instance_count,
        placements=tuple(sorted(info.placements, key=lambda p: p.start)),
    )


class _Warnings:
    def __init__(self, gpu: GpuInfo, model: str) -> None:
        self.gpu = gpu
        self.model = model
        self.items: list[CatalogWarning] = []

    def add(self, kind: CatalogWarningKind, message: str, profile: str | None = None) -> None:
        warning = CatalogWarning(kind, self.gpu.index, self.gpu.name, message, profile)
        self.items.append(warning)
        log.warning(
            message,
            kind=kind.value,
            gpu=self.gpu.index,
            gpu_name=self.gpu.name,
            model=self.model,
            profile=profile,
        )


def discover(
    nvml: ProfileSource, gpu_index: int, allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
) -> GpuCatalog:
    """The catalog of one GPU: every profile NVML offers, and those the allowlist lets flexmig use."""
    return _discover_gpu(nvml, nvml.gpu(gpu_index), allowlist)


def discover_all(
    nvml: ProfileSource, allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
) -> list[GpuCatalog]:
    return [_discover_gpu(nvml, gpu, allowlist) for gpu in nvml.gpus()]


def _discover_gpu(nvml: ProfileSource, gpu: GpuInfo, allowlist: MigProfileAllowlist) -> GpuCatalog:
    model = model_for_nvml_name(gpu.name)
    model_key = model.key if model is not None else gpu.name
    warnings = _Warnings(gpu, model_key)
    if model is None:
        warnings.add(
            CatalogWarningKind.UNKNOWN_MODEL,
            "GPU model is not in flexmig's model list; using NVML's profile facts as reported",
        )
    if not gpu.mig_capable:
        return _catalog(gpu, model_key, (), (), warnings)
    try:
        infos = nvml.gi_profiles(gpu.index)
    except NvmlError as exc:
        warnings.add(
            CatalogWarningKind.MIG_UNAVAILABLE,
            f"cannot read MIG profiles ({exc}); publishing the whole GPU only",
        )
        return _catalog(gpu, model_key, (), (), warnings)
    origin = ProfileOrigin.NVML
    if not infos and _refused_with_mig_off(nvml, gpu):
        builtin = builtin_profile_infos(gpu.name)
        if builtin is None:
            warnings.add(
                CatalogWarningKind.MIG_UNAVAILABLE,
                "NVML refuses MIG profile queries while MIG mode is off and this exact GPU model is not "
                "in flexmig's built-in profile table; publishing the whole GPU only until MIG mode is on",
            )
            return _catalog(gpu, model_key, (), (), warnings, ProfileOrigin.REFUSED)
        sku = builtin_sku(gpu.name)
        warnings.add(
            CatalogWarningKind.PROFILES_FROM_BUILTIN,
            f"NVML refuses MIG profile queries while MIG mode is off; using flexmig's built-in profile "
            f"table for {sku.key if sku is not None else gpu.name}, to be checked against NVML once MIG "
            f"mode is on",
        )
        infos, origin = list(builtin), ProfileOrigin.BUILTIN
    offered = tuple(sorted((mig_profile(i, gpu.memory_total_mib) for i in infos), key=profile_order))
    if not offered:
        # NVML answers "not supported" for every profile while MIG is off on GPUs that only report
        # profiles in MIG mode (Ampere); one warning says so instead of one per allowlisted name.
        warnings.add(
            CatalogWarningKind.MIG_UNAVAILABLE,
            "the GPU reports no MIG profiles (MIG mode off?); publishing the whole GPU only",
        )
        return _catalog(gpu, model_key, (), (), warnings)
    _check_names(offered, warnings)
    allowed = _allowed(gpu, offered, allowlist, warnings)
    return _catalog(gpu, model_key, allowed, offered, warnings, origin)


def _refused_with_mig_off(nvml: ProfileSource, gpu: GpuInfo) -> bool:
    """No profiles because a GPU that switches MIG mode without a reset has MIG off right now.

    Only such GPUs (Hopper and newer) publish MIG devices while MIG is off, so only they need profiles
    before NVML will give them; an Ampere GPU with MIG off publishes the whole GPU whatever we know.
    """
    if gpu.architecture.mig_toggle_needs_reset:
        return False
    try:
        return not nvml.mig_mode(gpu.index).current
    except NvmlError as exc:
        log.warning("cannot read MIG mode", gpu=gpu.index, gpu_name=gpu.name, error=str(exc))
        return False


def _check_names(offered: Sequence[MigProfile], warnings: _Warnings) -> None:
    seen: dict[str, MigProfile] = {}
    for p in offered:
        first = seen.setdefault(p.name, p)
        if first is not p:
            warnings.add(
                CatalogWarningKind.DUPLICATE_PROFILE_NAME,
                f"NVML profiles {first.gi_profile_id} and {p.gi_profile_id} are both named {p.name}; "
                f"an allowlist entry for that name selects both",
                p.name,
            )


def _allowed(
    gpu: GpuInfo, offered: Sequence[MigProfile], allowlist: MigProfileAllowlist, warnings: _Warnings
) -> tuple[MigProfile, ...]:
    entry = allowlist.entry_for(gpu.name)
    if entry is None:
        warnings.add(
            CatalogWarningKind.NO_ALLOWLIST_ENTRY,
            "no migProfileAllowlist entry matches this GPU model; only the whole GPU is published",
        )
        return ()
    offered_names = sorted({p.name for p in offered})
    wanted: set[str] = set()
    for name in entry.profiles:
        match = rounded_name_match(name, offered_names)
        if match is None:
            warnings.add(
                CatalogWarningKind.PROFILE_NOT_OFFERED,
                f"allowlisted profile {name} is not offered by {warnings.model}; it offers: "
                f"{', '.join(p.name for p in offered) or 'nothing'}",
                name,
            )
            continue
        if match != name:
            # HAMi's own guide and example config write 7g.79gb for the A100-80GB's full profile;
            # dropping it would silently take the whole-GPU instance away from a HAMi user.
            warnings.add(
                CatalogWarningKind.PROFILE_NAME_ROUNDED,
                f"allowlisted profile {name} is read as {match}, the name {warnings.model} gives it",
                name,
            )
        wanted.add(match)
    return tuple(p for p in offered if p.name in wanted)


def _catalog(
    gpu: GpuInfo,
    model_key: str,
    allowed: tuple[MigProfile, ...],
    offered: tuple[MigProfile, ...],
    warnings: _Warnings,
    origin: ProfileOrigin = ProfileOrigin.NVML,
) -> GpuCatalog:
    # The axes come from the profiles themselves, so a GPU with an unfamiliar geometry still works:
    # the placement axis ends where the furthest placement ends, and the largest profile holds every
    # compute slice of the GPU.
    memory_slices = max((pl.end for p in offered for pl in p.placements), default=0)
    memory_slices = max(memory_slices, max((p.memory_slices for p in offered), default=0))
    compute_slices = max((p.compute_slices for p in offered), default=0)
    return GpuCatalog(
        gpu=gpu,
        model=model_key,
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        profiles=allowed,
        all_profiles=offered,
        warnings=tuple(warnings.items),
        origin=origin,
    )
