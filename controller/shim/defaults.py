"""HAMi's device-config defaults that decide what a legacy `nvidia.com/*` request means.

The shim reads the same ConfigMap shape HAMi's scheduler reads (`{"nvidia": {"defaultMemory": 0,
"defaultCores": 0, "defaultGPUNum": 1, "migProfileAllowlist": [...], ...}}`), so an admin who moves from
HAMi keeps one file. Only the three defaults matter here; every other key belongs to someone else and is
ignored, but a default of the wrong type is refused with the key's name rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ShimConfigError(ValueError):
    """The device config has a default of the wrong type or range; the message names the key."""


@dataclass(frozen=True)
class ShimDefaults:
    """HAMi's device config defaults (HAMi's own defaults when the key is absent)."""

    default_memory_mib: int = 0
    """HAMi `defaultMemory`: MiB per GPU when a pod gives no gpumem; 0 = the whole GPU's memory (100%)."""
    default_cores: int = 0
    """HAMi `defaultCores`: percent of the GPU's compute when a pod gives no gpucores (0..100)."""
    default_gpu_num: int = 1
    """HAMi `defaultGPUNum`: GPUs added when a pod gives gpumem/gpucores but no gpu; 0 = deny instead."""


# key -> (dataclass field, upper bound)
_KEYS: dict[str, tuple[str, int]] = {
    "defaultMemory": ("default_memory_mib", 2**30),  # 1 PiB in MiB, the shim's gpumem limit
    "defaultCores": ("default_cores", 100),
    "defaultGPUNum": ("default_gpu_num", 32),  # the API's limit on devices per claim
}


def parse_shim_defaults(doc: Mapping[str, Any] | None) -> ShimDefaults:
    """The defaults in a parsed HAMi device ConfigMap (None or no `nvidia` section: HAMi's defaults)."""
    if doc is None:
        return ShimDefaults()
    if not isinstance(doc, Mapping):
        raise ShimConfigError(
            f"device config must be a mapping with an 'nvidia' key, got {type(doc).__name__}"
        )
    section = doc.get("nvidia")
    if section is None:
        return ShimDefaults()
    if not isinstance(section, Mapping):
        raise ShimConfigError(f"nvidia: must be a mapping, got {type(section).__name__}")
    values: dict[str, int] = {}
    for key, (attr, upper) in _KEYS.items():
        if key not in section or section[key] is None:
            continue
        raw = section[key]
        # bool is an int in Python but `defaultCores: true` is a typo in YAML, never a number.
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ShimConfigError(f"nvidia.{key}: must be an integer, got {raw!r}")
        if not 0 <= raw <= upper:
            raise ShimConfigError(f"nvidia.{key}: {raw} is out of range (allowed: 0..{upper})")
        values[attr] = raw
    return ShimDefaults(**values)
