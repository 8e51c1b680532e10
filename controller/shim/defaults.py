"""HAMi's device-config defaults that decide what a legacy `nvidia.com/*` request means.

The shim reads the same ConfigMap shape HAMi's scheduler reads (`{"nvidia": {"defaultMemory": 0,
"defaultCores": 0, "defaultGPUNum": 1, "migProfileAllowlist": [...], ...}}`), so an admin who moves from
HAMi keeps one file. The shim uses the three defaults, the five `resource*Name` keys (custom resource
names) and `memoryFactor`; the other keys belong to someone else (driver/hamiconfig.py lists what
flexmig uses), but a key of the wrong type is refused with its name rather than guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.constants import RESOURCE_GPU, RESOURCE_GPUCORES, RESOURCE_GPUMEM, RESOURCE_GPUMEM_PERCENTAGE
from driver.catalog.allowlist import (
    DEFAULT_MIG_PROFILE_ALLOWLIST,
    AllowlistError,
    MigProfileAllowlist,
    parse_allowlist,
)
from driver.hamiconfig import other_version_hint

RESOURCE_PRIORITY = "nvidia.com/priority"
# An extended resource name: a domain prefix (not kubernetes.io) and a name, as the API validates it.
EXTENDED_RESOURCE_NAME = _RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class ShimConfigError(ValueError):
    """The device config has a default of the wrong type or range; the message names the key."""


@dataclass(frozen=True)
class ResourceNames:
    """The container resources the shim reads (HAMi's resource*Name keys; HAMi's names by default)."""

    count: str = RESOURCE_GPU
    memory: str = RESOURCE_GPUMEM
    memory_percentage: str = RESOURCE_GPUMEM_PERCENTAGE
    cores: str = RESOURCE_GPUCORES
    priority: str = RESOURCE_PRIORITY

    @property
    def legacy(self) -> tuple[str, str, str, str]:
        """The resources that make a container a HAMi GPU container."""
        return (self.count, self.memory, self.memory_percentage, self.cores)

    @property
    def removed(self) -> tuple[str, ...]:
        """Every resource the rewrite takes out of such a container."""
        return (*self.legacy, self.priority)

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Domain prefixes ("nvidia.com/") of the names: other resources under them are denied."""
        return tuple(sorted({n.split("/", 1)[0] + "/" for n in self.removed}))

    def canonical(self, name: str) -> str:
        """HAMi's default name of the role `name` plays (itself when it plays none)."""
        for mine, default in zip(self.removed, ResourceNames().removed, strict=True):
            if name == mine:
                return default
        return name


# key -> ResourceNames field
_NAME_KEYS: dict[str, str] = {
    "resourceCountName": "count",
    "resourceMemoryName": "memory",
    "resourceMemoryPercentageName": "memory_percentage",
    "resourceCoreName": "cores",
    "resourcePriorityName": "priority",
}
MAX_MEMORY_FACTOR = 2**20


@dataclass(frozen=True)
class ShimDefaults:
    """HAMi's device config defaults (HAMi's own defaults when the key is absent)."""

    default_memory_mib: int = 0
    """HAMi `defaultMemory`: MiB per GPU when a pod gives no gpumem; 0 = the whole GPU's memory (100%)."""
    default_cores: int = 0
    """HAMi `defaultCores`: percent of the GPU's compute when a pod gives no gpucores (0..100)."""
    default_gpu_num: int = 1
    """HAMi `defaultGPUNum`: GPUs added when a pod gives gpumem/gpucores but no gpu; 0 = deny instead."""
    names: ResourceNames = field(default_factory=ResourceNames)
    """HAMi `resource*Name`: the container resources read as gpu, gpumem, gpumem-percentage, gpucores
    and priority."""
    memory_factor: int = 1
    mapped_resources: frozenset[str] = frozenset()
    """Extended resource names a flexmig DeviceClass maps (KEP-5004, `spec.extendedResourceName`);
    not from the device config but from the webhook's `--mapped-resources` (controller/shim/mapped.py)."""
    allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
    """HAMi `migProfileAllowlist`: which `nvidia.com/mig-<profile>` resources can be served (the
    nodes publish the same profiles, so a profile outside it would never be allocated)."""
    """HAMi `memoryFactor`: a container's gpumem is given in units of this many MiB (defaultMemory
    stays in MiB)."""


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
    values: dict[str, Any] = {}  # ShimDefaults field -> int
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
    names = _names(section)
    factor = section.get("memoryFactor")
    if factor is None:
        factor = 1
    if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= MAX_MEMORY_FACTOR:
        raise ShimConfigError(
            f"nvidia.memoryFactor: {factor!r} is not allowed (allowed: an integer 1..{MAX_MEMORY_FACTOR})"
        )
    return ShimDefaults(**values, names=names, memory_factor=factor, allowlist=_allowlist(section))


def _allowlist(section: Mapping[str, Any]) -> MigProfileAllowlist:
    raw = section.get("migProfileAllowlist")
    if raw is None:
        return DEFAULT_MIG_PROFILE_ALLOWLIST  # what the kubelet plugin publishes without the key
    try:
        return parse_allowlist(raw)
    except AllowlistError as exc:
        hint = other_version_hint(section)
        more = f" ({hint}: convert it with `flexmig migrate-config`)" if hint else ""
        raise ShimConfigError(f"nvidia.{exc}{more}") from None


def _names(section: Mapping[str, Any]) -> ResourceNames:
    given: dict[str, str] = {}
    for key, attr in _NAME_KEYS.items():
        raw = section.get(key)
        if raw is None or raw == "":
            continue  # HAMi's chart renders an unset value as empty: its default name
        if not isinstance(raw, str) or not _RESOURCE_NAME.match(raw) or raw.startswith("kubernetes.io/"):
            raise ShimConfigError(
                f"nvidia.{key}: {raw!r} is not an extended resource name (allowed: <domain>/<name>, "
                f"e.g. {getattr(ResourceNames(), attr)})"
            )
        given[attr] = raw
    names = ResourceNames(**given)
    if len(set(names.removed)) != len(names.removed):
        raise ShimConfigError(
            f"nvidia.resource*Name: two roles share one name ({', '.join(names.removed)}); each must differ"
        )
    return names
