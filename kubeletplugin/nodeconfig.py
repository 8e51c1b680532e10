"""Per-node settings from the HAMi-style device-plugin config (`nodeconfig` list in config.json).

    {"nodeconfig": [{"name": "node-a", "operatingmode": "mig",
                     "filterdevices": {"uuid": ["GPU-..."], "index": [3]}}]}

Only `name`, `operatingmode`, `filterdevices` and `devicesplitcount` (how many HAMi-core shares one GPU
of a hami-core node offers; the plugin's `--device-split-count` when absent) matter to flexmig. The other
keys HAMi documents for an entry are accepted (so an existing HAMi config keeps loading) but ignored; any
other key is an error, because a misspelt `filterdevice` silently publishing a GPU the admin meant to
hide is worse than a plugin that refuses to start.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class NodeConfigError(ValueError):
    """The device-plugin config is malformed; the message names the entry and the field."""


class OperatingMode(enum.StrEnum):
    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


# HAMi's default for nodes not listed in `nodeconfig`.
DEFAULT_OPERATING_MODE = OperatingMode.HAMI_CORE
# HAMi's default `deviceSplitCount`: how many containers may share one GPU of a hami-core node.
DEFAULT_DEVICE_SPLIT_COUNT = 10

_USED_KEYS = frozenset({"name", "operatingmode", "filterdevices"})
_SPLIT_KEY = "devicesplitcount"  # HAMi decodes keys case-insensitively, so any case is accepted
# Keys HAMi's device plugin reads from a nodeconfig entry that have no meaning for flexmig.
_HAMI_ONLY_KEYS = frozenset({"migstrategy", "devicememoryscaling", "devicecorescaling", "libcudaloglevel"})
_FILTER_KEYS = frozenset({"uuid", "index"})


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    operating_mode: OperatingMode = DEFAULT_OPERATING_MODE
    filter_uuids: frozenset[str] = field(default_factory=frozenset)
    filter_indexes: frozenset[int] = field(default_factory=frozenset)
    device_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT
    """Shares per GPU on a hami-core node (the `shares` capacity of `gpu-<i>-shared`)."""

    @property
    def publishes_mig(self) -> bool:
        return self.operating_mode is OperatingMode.MIG

    @property
    def publishes_shared(self) -> bool:
        """hami-core nodes publish each GPU as one shareable `gpu-<i>-shared` device."""
        return self.operating_mode is OperatingMode.HAMI_CORE

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
    for i, n in enumerate(indexes_raw):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise NodeConfigError(
                f"{where}.filterdevices.index[{i}] must be a non-negative integer, got {n!r}"
            )
    return frozenset(uuids_raw), frozenset(indexes_raw)


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


def _parse_entry(i: int, raw: Any, default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT) -> NodeConfig:
    where = f"nodeconfig[{i}]"
    if not isinstance(raw, dict):
        raise NodeConfigError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(
        k for k in raw if k not in _USED_KEYS and k.lower() not in _HAMI_ONLY_KEYS | {_SPLIT_KEY}
    )
    if unknown:
        allowed = ", ".join(sorted(_USED_KEYS | _HAMI_ONLY_KEYS | {_SPLIT_KEY}))
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
    )


def parse_device_plugin_config(
    data: str | bytes | Mapping[str, Any], default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT
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
        cfg = _parse_entry(i, raw, default_split_count)
        if cfg.name in out:
            raise NodeConfigError(f"nodeconfig[{i}].name {cfg.name!r} is listed more than once")
        out[cfg.name] = cfg
    return out


def node_config_for(
    data: str | bytes | Mapping[str, Any] | None,
    node_name: str,
    default_mode: OperatingMode = DEFAULT_OPERATING_MODE,
    default_split_count: int = DEFAULT_DEVICE_SPLIT_COUNT,
) -> NodeConfig:
    """This node's settings; a node without an entry gets `default_mode`, no filters and
    `default_split_count` shares per GPU.

    The whole file is validated even though only one entry is used, so a typo for another node shows up
    on every node rather than only where it bites.
    """
    configs = parse_device_plugin_config(data, default_split_count) if data is not None else {}
    return configs.get(
        node_name,
        NodeConfig(name=node_name, operating_mode=default_mode, device_split_count=default_split_count),
    )
