"""Per-node settings from the HAMi-style device-plugin config (`nodeconfig` list in config.json).

    {"nodeconfig": [{"name": "node-a", "operatingmode": "mig",
                     "filterdevices": {"uuid": ["GPU-..."], "index": [3]}}]}

Only `name`, `operatingmode`, `filterdevices`, `devicesplitcount` (how many HAMi-core shares one GPU
of a hami-core node offers; the device config's `deviceSplitCount` when absent) and
`devicememoryscaling` / `devicecorescaling` (the fraction of a hami-core GPU's memory / SMs offered;
values above 1, HAMi-core oversubscription, act as 1) matter to flexmig. `migstrategy` and
`libcudaloglevel` are accepted (so an existing HAMi config keeps loading) but have no effect; any
other key is an error, because a misspelt `filterdevice` silently publishing a GPU the admin meant to
hide is worse than a plugin that refuses to start.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class NodeConfigError(ValueError):
    """The device-plugin config is malformed; the message names the entry and the field."""


class OperatingMode(enum.StrEnum):
    AUTO = "auto"
    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


# What an entry that gives no `operatingmode` means: HAMi's own default for a listed node.
DEFAULT_OPERATING_MODE = OperatingMode.HAMI_CORE
# Mode of a node with no entry at all (the plugin's --operating-mode default). HAMi would make it
# hami-core, which on a MIG-capable GPU offers neither dynamic MIG nor (without the HAMi-core library)
# enforced sharing; `auto` decides per GPU instead (see NodeConfig.gpu_mode).
DEFAULT_UNLISTED_MODE = OperatingMode.AUTO
# HAMi's default `deviceSplitCount`: how many containers may share one GPU of a hami-core node.
DEFAULT_DEVICE_SPLIT_COUNT = 10

_USED_KEYS = frozenset({"name", "operatingmode", "filterdevices"})
_SPLIT_KEY = "devicesplitcount"  # HAMi decodes keys case-insensitively, so any case is accepted
_MEMORY_SCALING_KEY = "devicememoryscaling"
_CORE_SCALING_KEY = "devicecorescaling"
_LOWER_KEYS = frozenset({_SPLIT_KEY, _MEMORY_SCALING_KEY, _CORE_SCALING_KEY})
# Keys HAMi's device plugin reads from a nodeconfig entry that have no meaning for flexmig.
_HAMI_ONLY_KEYS = frozenset({"migstrategy", "libcudaloglevel"})
_FILTER_KEYS = frozenset({"uuid", "index"})
_GPU_UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    operating_mode: OperatingMode = DEFAULT_OPERATING_MODE
    filter_uuids: frozenset[str] = field(default_factory=frozenset)
    filter_indexes: frozenset[int] = field(default_factory=frozenset)
    device_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT
    """Shares per GPU on a hami-core node (the `shares` capacity of `gpu-<i>-shared`)."""
    memory_scaling: float = 1.0
    """HAMi's deviceMemoryScaling as applied: the fraction of a hami-core GPU's memory its shares may
    hold together (0 < x <= 1; HAMi's oversubscription above 1 is not offered, see scaling_applied)."""
    core_scaling: float = 1.0
    """HAMi's deviceCoreScaling as applied: the fraction of a hami-core GPU's SMs (0 < x <= 1)."""

    @property
    def publishes_mig(self) -> bool:
        """Some GPU of this node may publish MIG devices (mode mig, or auto on a MIG-capable GPU)."""
        return self.operating_mode in (OperatingMode.MIG, OperatingMode.AUTO)

    @property
    def publishes_shared(self) -> bool:
        """Some GPU may be published as one shareable `gpu-<i>-shared` device (hami-core, or auto on a
        GPU that is not MIG-capable)."""
        return self.operating_mode in (OperatingMode.HAMI_CORE, OperatingMode.AUTO)

    def gpu_mode(self, mig_capable: bool) -> OperatingMode:
        """The mode one GPU gets. `auto`: `mig` for a MIG-capable GPU (dynamic MIG is the point of
        flexmig), `hami-core` for the others (HAMi's default), never `auto` itself."""
        if self.operating_mode is OperatingMode.AUTO:
            return OperatingMode.MIG if mig_capable else OperatingMode.HAMI_CORE
        return self.operating_mode

    def is_filtered(self, gpu_index: int, gpu_uuid: str) -> bool:
        """True when the admin excluded this GPU from flexmig (by index or by UUID)."""
        return gpu_index in self.filter_indexes or gpu_uuid in self.filter_uuids


def _parse_filter(where: str, raw: Any) -> tuple[frozenset[str], frozenset[int]]:
    if raw is None:
        return frozenset(), frozenset()
    if not isinstance(raw, dict):
        raise NodeConfigError(f"{where}.filterdevices must be an object with 'uuid' and 'index' lists")
    unknown = sorted(set(raw) - _FILTER_KEYS)
    if unknown:
        raise NodeConfigError(f"{where}.filterdevices has unknown keys {unknown}; allowed: uuid, index")
    uuids_raw = raw.get("uuid") or []
    indexes_raw = raw.get("index") or []
    if not isinstance(uuids_raw, list):
        raise NodeConfigError(f"{where}.filterdevices.uuid must be a list of GPU UUID strings")
    if not isinstance(indexes_raw, list):
        raise NodeConfigError(f"{where}.filterdevices.index must be a list of GPU indexes")
    for i, u in enumerate(uuids_raw):
        if not isinstance(u, str) or not u:
            raise NodeConfigError(f"{where}.filterdevices.uuid[{i}] must be a non-empty string, got {u!r}")
        if not _GPU_UUID_RE.fullmatch(u):
            # A UUID that can never match leaves the GPU the admin meant to hide published.
            raise NodeConfigError(
                f"{where}.filterdevices.uuid[{i}]: {u!r} is not a GPU UUID; allowed: 'GPU-' and 32 hex "
                "digits as 8-4-4-4-12, as `nvidia-smi -L` prints them (or filter by index)"
            )
    for i, n in enumerate(indexes_raw):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise NodeConfigError(
                f"{where}.filterdevices.index[{i}] must be a non-negative integer, got {n!r}"
            )
    return frozenset(uuids_raw), frozenset(indexes_raw)


def unused_entry_keys(doc: Mapping[str, Any]) -> list[str]:
    """`nodeconfig[<i>].<key>` for every key HAMi reads that has no effect in flexmig (migstrategy,
    libcudaloglevel), for the plugin's one start-up warning. Call after parsing (the shape is valid)."""
    out: list[str] = []
    for i, entry in enumerate(doc.get("nodeconfig") or []):
        if isinstance(entry, Mapping):
            out += [
                f"nodeconfig[{i}].{k}" for k in entry if isinstance(k, str) and k.lower() in _HAMI_ONLY_KEYS
            ]
    return out


def check_split_count(value: Any) -> int:
    """A device split count: an integer >= 1 (bool rejected). ValueError names the allowed values."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is not a valid device split count; allowed: an integer >= 1")
    return value


def _parse_split(where: str, raw: Mapping[str, Any], default: int) -> int:
    keys = [k for k in raw if isinstance(k, str) and k.lower() == _SPLIT_KEY]
    if not keys:
        return default
    if len(keys) > 1:
        raise NodeConfigError(f"{where} sets devicesplitcount more than once ({sorted(keys)})")
    try:
        return check_split_count(raw[keys[0]])
    except ValueError as exc:
        raise NodeConfigError(f"{where}.{keys[0]}: {exc}") from None


def check_scaling(value: Any) -> float:
    """HAMi's deviceMemoryScaling / deviceCoreScaling: a number > 0 (bool rejected). Values above 1
    (HAMi-core oversubscription) are accepted and applied as 1: flexmig never promises more memory or
    SMs than the GPU has. ValueError names the allowed values."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{value!r} is not a valid scaling; allowed: a number > 0 (values above 1 act as 1)")
    return min(float(value), 1.0)


def _parse_scaling(where: str, raw: Mapping[str, Any], key: str, default: float) -> float:
    keys = [k for k in raw if isinstance(k, str) and k.lower() == key]
    if not keys:
        return default
    if len(keys) > 1:
        raise NodeConfigError(f"{where} sets {key} more than once ({sorted(keys)})")
    try:
        return check_scaling(raw[keys[0]])
    except ValueError as exc:
        raise NodeConfigError(f"{where}.{keys[0]}: {exc}") from None


def _parse_entry(
    i: int,
    raw: Any,
    default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT,
    default_scaling: tuple[float, float] = (1.0, 1.0),
) -> NodeConfig:
    where = f"nodeconfig[{i}]"
    if not isinstance(raw, dict):
        raise NodeConfigError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in _USED_KEYS and k.lower() not in _HAMI_ONLY_KEYS | _LOWER_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_USED_KEYS | _HAMI_ONLY_KEYS | _LOWER_KEYS))
        raise NodeConfigError(f"{where} has unknown keys {unknown}; allowed: {allowed}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise NodeConfigError(f"{where}.name must be a non-empty node name")
    where = f"nodeconfig[{i}] (node {name!r})"
    mode_raw = raw.get("operatingmode", DEFAULT_OPERATING_MODE.value)
    try:
        mode = OperatingMode(mode_raw)
    except ValueError:
        allowed = ", ".join(m.value for m in OperatingMode)
        raise NodeConfigError(f"{where}.operatingmode {mode_raw!r} is not one of: {allowed}") from None
    uuids, indexes = _parse_filter(where, raw.get("filterdevices"))
    return NodeConfig(
        name=name,
        operating_mode=mode,
        filter_uuids=uuids,
        filter_indexes=indexes,
        device_split_count=_parse_split(where, raw, default_split_count),
        memory_scaling=_parse_scaling(where, raw, _MEMORY_SCALING_KEY, default_scaling[0]),
        core_scaling=_parse_scaling(where, raw, _CORE_SCALING_KEY, default_scaling[1]),
    )


def parse_device_plugin_config(
    data: str | bytes | Mapping[str, Any],
    default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT,
    default_scaling: tuple[float, float] = (1.0, 1.0),
) -> dict[str, NodeConfig]:
    """All `nodeconfig` entries by node name. Other top-level keys of the HAMi file are left alone.

    `default_split_count` is what an entry without `devicesplitcount` gets (the plugin's flag).
    """
    if isinstance(data, str | bytes):
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as exc:
            raise NodeConfigError(f"device-plugin config is not valid JSON: {exc}") from exc
    else:
        doc = data
    if not isinstance(doc, dict):
        raise NodeConfigError("device-plugin config must be a JSON object")
    entries = doc.get("nodeconfig")
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise NodeConfigError("nodeconfig must be a list of per-node objects")
    out: dict[str, NodeConfig] = {}
    for i, raw in enumerate(entries):
        cfg = _parse_entry(i, raw, default_split_count, default_scaling)
        if cfg.name in out:
            raise NodeConfigError(f"nodeconfig[{i}].name {cfg.name!r} is listed more than once")
        out[cfg.name] = cfg
    return out


def node_config_for(
    data: str | bytes | Mapping[str, Any] | None,
    node_name: str,
    default_mode: OperatingMode = DEFAULT_UNLISTED_MODE,
    default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT,
    default_scaling: tuple[float, float] = (1.0, 1.0),
) -> NodeConfig:
    """This node's settings; a node without an entry gets `default_mode`, no filters and
    `default_split_count` shares per GPU.

    The whole file is validated even though only one entry is used, so a typo for another node shows up
    on every node rather than only where it bites.
    """
    configs = (
        parse_device_plugin_config(data, default_split_count, default_scaling) if data is not None else {}
    )
    return configs.get(
        node_name,
        NodeConfig(
            name=node_name,
            operating_mode=default_mode,
            device_split_count=default_split_count,
            memory_scaling=default_scaling[0],
            core_scaling=default_scaling[1],
        ),
    )
