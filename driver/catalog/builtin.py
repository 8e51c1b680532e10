"""flexmig's built-in MIG profile facts, per exact GPU model, for when NVML will not say.

On Hopper and newer, NVML may refuse GPU-instance profile queries while MIG mode is off, yet those
GPUs publish MIG devices before MIG is on (the plugin switches it on at the first MIG prepare). For a
model whose NVML name is exactly one of ours, the catalog then comes from these facts, which are the
hardware tables in `driver/nvml/sim/hardware.py` (the same numbers the simulator reports), turned into
the `GiProfileInfo` values NVML would have returned. The plugin checks them against NVML once MIG is on.

Lookup is by exact NVML product name, never by model family: an H100 PCIe and an H100 SXM5 share
profile names but not SM counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.catalog.models import normalize_model_name
from driver.nvml.sim.hardware import SKUS, GiProfileRow, Sku
from driver.nvml.types import GiProfileInfo, Placement


@dataclass(frozen=True, slots=True)
class RowConfidence:
    """Whether every fact of one built-in profile row is confirmed by a public capture."""

    confirmed: bool
    note: str  # which fields are uncertain; empty when confirmed


_BY_NVML_NAME: dict[str, Sku] = {normalize_model_name(s.product_name): s for s in SKUS.values()}


def builtin_sku(nvml_name: str) -> Sku | None:
    """The built-in table of the GPU NVML calls `nvml_name` (with or without "NVIDIA "); exact only."""
    return _BY_NVML_NAME.get(normalize_model_name(nvml_name))


def _info(row: GiProfileRow) -> GiProfileInfo:
    return GiProfileInfo(
        enum_index=row.enum_index,
        profile_id=row.profile_id,
        compute_slices=row.compute_slices,
        memory_slices=row.memory_slices,
        instance_count=row.max_instances,
        memory_mib=row.memory_mib,
        multiprocessors=row.sms,
        copy_engines=row.ce,
        decoders=row.dec,
        encoders=row.enc,
        jpegs=row.jpeg,
        ofas=row.ofa,
        placements=tuple(Placement(start, row.memory_slices) for start in row.starts),
        nvml_name=row.nvml_name,
    )


def builtin_profile_infos(nvml_name: str) -> tuple[GiProfileInfo, ...] | None:
    """Every GI profile of that exact model as NVML would report it; None for a model we do not know."""
    sku = builtin_sku(nvml_name)
    return None if sku is None else tuple(_info(r) for r in sku.profiles)


def row_confidence(sku_key: str, profile_id: int) -> RowConfidence | None:
    """How sure the built-in facts of one profile are; None when the SKU or profile is unknown."""
    sku = SKUS.get(sku_key)
    row = sku.profile_by_id(profile_id) if sku is not None else None
    if row is None:
        return None
    return RowConfidence(row.confirmed, "" if row.confirmed else row.note)
