"""NVIDIA's MIG profile naming rule, as implemented by go-nvlib (and therefore mig-parted, the GPU
operator and the k8s device plugin).

A GPU-instance profile is named "<G>g.<GB>gb[suffix]" and a compute-instance profile inside a larger GI
"<C>c.<G>g.<GB>gb[suffix]". The GB figure is *not* the NVML memory size rounded: NVML reports a little
less than the nominal fraction (4864 MiB for the A100-40GB "1g.5gb"), so the rule first rounds the
memory fraction up to the next eighth of the GPU and only then scales it by the GPU's whole-GiB size.
We compute names ourselves instead of trusting NVML's `name` field because that field is missing on
v1 structs / old drivers and because every other tool in the ecosystem uses this rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import IntEnum
from fractions import Fraction


class GiProfileEnum(IntEnum):
    """NVML_GPU_INSTANCE_PROFILE_* values (the enum index, not the device-specific profile id)."""

    SLICE_1 = 0x0
    SLICE_2 = 0x1
    SLICE_3 = 0x2
    SLICE_4 = 0x3
    SLICE_7 = 0x4
    SLICE_8 = 0x5
    SLICE_6 = 0x6
    SLICE_1_REV1 = 0x7  # 1g with media extensions ("+me")
    SLICE_2_REV1 = 0x8  # 2g with media extensions ("+me")
    SLICE_1_REV2 = 0x9  # 1g with double memory; named like a plain profile
    SLICE_1_GFX = 0xA
    SLICE_2_GFX = 0xB
    SLICE_4_GFX = 0xC
    SLICE_1_NO_ME = 0xD
    SLICE_2_NO_ME = 0xE
    SLICE_1_ALL_ME = 0xF
    SLICE_2_ALL_ME = 0x10
    SLICE_3_GFX = 0x11


# Suffix per enum variant (go-nvlib's attribute strings). REV2 deliberately has none: NVIDIA tells the
# double-memory 1g apart from the plain 1g by its GB figure alone ("1g.10gb" vs "1g.5gb").
_SUFFIX_BY_ENUM: dict[int, str] = {
    GiProfileEnum.SLICE_1_REV1: "+me",
    GiProfileEnum.SLICE_2_REV1: "+me",
    GiProfileEnum.SLICE_1_ALL_ME: "+me.all",
    GiProfileEnum.SLICE_2_ALL_ME: "+me.all",
    GiProfileEnum.SLICE_1_GFX: "+gfx",
    GiProfileEnum.SLICE_2_GFX: "+gfx",
    GiProfileEnum.SLICE_3_GFX: "+gfx",
    GiProfileEnum.SLICE_4_GFX: "+gfx",
    GiProfileEnum.SLICE_1_NO_ME: "-me",
    GiProfileEnum.SLICE_2_NO_ME: "-me",
}

# The grammar every NVIDIA profile name follows; used to validate names users write in configuration.
PROFILE_NAME_PATTERN = r"^\d+(c\.\d+)?g\.\d+gb(\+me|\+me\.all|\+gfx|-me)?$"
PROFILE_NAME_RE = re.compile(PROFILE_NAME_PATTERN)

ME_ALL_SUFFIX = "+me.all"
NO_ME_SUFFIX = "-me"


def suffix_for_enum(enum_index: int) -> str:
    """The name suffix of a GI profile enum variant ("" for the plain profiles and REV2)."""
    return _SUFFIX_BY_ENUM.get(enum_index, "")


def _round_half_away(value: Fraction) -> int:
    # Go's math.Round rounds halves away from zero; Python's round() rounds them to even, which would
    # turn the B200's 22.5 into "1g.22gb" instead of NVIDIA's "1g.23gb".
    floor = math.floor(abs(value) + Fraction(1, 2))
    return floor if value >= 0 else -floor


def memory_gb(memory_mib: int, total_mib: int) -> int:
    """The GB figure of a profile name: ceil(memory fraction in eighths) x the GPU's size in whole GiB.

    Exact rational arithmetic avoids float artefacts at the boundaries (a fraction of exactly 2/8 must
    stay 2/8, not become 3/8 through 0.25000000000000006).
    """
    if total_mib <= 0:
        raise ValueError(f"total GPU memory must be positive, got {total_mib} MiB")
    if memory_mib < 0:
        raise ValueError(f"profile memory must not be negative, got {memory_mib} MiB")
    eighths = math.ceil(Fraction(memory_mib, total_mib) * 8)
    total_gib = -(-total_mib // 1024)  # ceil: go-nvlib rounds the device memory up to whole GiB
    return _round_half_away(Fraction(eighths, 8) * total_gib)


def profile_name(
    gpu_slices: int,
    memory_mib: int,
    total_mib: int,
    enum_index: int = GiProfileEnum.SLICE_1,
    compute_slices: int | None = None,
) -> str:
    """Name a profile by NVIDIA's rule.

    `gpu_slices` is the GI's compute-slice count (the "<G>g" part). `compute_slices`, when given and
    different, names a compute-instance profile "<C>c.<G>g.<GB>gb".
    """
    if gpu_slices <= 0:
        raise ValueError(f"slice count must be positive, got {gpu_slices}")
    gb = memory_gb(memory_mib, total_mib)
    suffix = suffix_for_enum(enum_index)
    if compute_slices is None or compute_slices == gpu_slices:
        return f"{gpu_slices}g.{gb}gb{suffix}"
    return f"{compute_slices}c.{gpu_slices}g.{gb}gb{suffix}"


def is_valid_profile_name(name: str) -> bool:
    return PROFILE_NAME_RE.fullmatch(name) is not None


def profile_suffix(name: str) -> str:
    """The variant suffix of a profile name ("", "+me", "+me.all", "+gfx" or "-me")."""
    match = PROFILE_NAME_RE.fullmatch(name)
    if match is None:
        return ""
    return match.group(2) or ""


_SIZE_NAME = re.compile(r"^(\d+)g\.(\d+)gb(.*)$")


def rounded_name_match(name: str, offered: Sequence[str]) -> str | None:
    """`name` when offered; else the offered name with the same slice count and suffix whose size in
    GB differs by at most 1 and 2 % (a rounding difference: HAMi's user guide writes 7g.79gb for the A100-80GB
    profile NVIDIA names 7g.80gb); else None."""
    if name in offered:
        return name
    m = _SIZE_NAME.match(name)
    if m is None:
        return None
    best: tuple[int, str] | None = None
    for other in offered:
        o = _SIZE_NAME.match(other)
        if o is None or o.group(1) != m.group(1) or o.group(3) != m.group(3):
            continue
        size, other_size = int(m.group(2)), int(o.group(2))
        diff = abs(other_size - size)
        # At most 1 GB and 2 %: 79 vs 80 is rounding, 5 vs 6 (A100's 1g.5gb, A30's 1g.6gb) is not.
        if diff <= 1 and diff * 50 <= max(size, other_size) and (best is None or diff < best[0]):
            best = (diff, other)
    return best[1] if best else None
