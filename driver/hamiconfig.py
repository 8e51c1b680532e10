"""HAMi's device ConfigMap as written (v2.10 chart and user guide): where it is, and which keys flexmig uses.

HAMi's scheduler reads `device-config.yaml` from its device ConfigMap:

    nvidia:
      resourceCountName: nvidia.com/gpu          # ... and the other resource*Name keys
      overwriteEnv: false
      defaultMemory: 0
      defaultCores: 0
      defaultGPUNum: 1
      memoryFactor: 1
      deviceSplitCount: 10
      deviceMemoryScaling: 1
      deviceCoreScaling: 1
      migProfileAllowlist: [...]
    cambricon: {...}                             # other vendors' sections

flexmig's plugin and controller read the same file. Each component parses the keys it uses itself
(the allowlist in driver/catalog/allowlist.py, the webhook's keys in controller/shim/defaults.py, the
hami-core keys in kubeletplugin/settings/config.py); this module says where the document is (a ConfigMap, its
data, or the file) and which keys flexmig as a whole does not use, so every component can log the
same single warning naming them instead of dropping them silently. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

DATA_KEY = "device-config.yaml"
"""The key of HAMi's device ConfigMap (and of flexmig's) that holds the document."""

# nvidia.<key> -> what flexmig does with it (docs/hami-config.md has the long form).
USED_NVIDIA_KEYS: dict[str, str] = {
    "migProfileAllowlist": "MIG profiles published per model (kubelet plugin; the webhook serves "
    "nvidia.com/mig-<profile> only for these)",
    "resourceCountName": "the shim's name for nvidia.com/gpu",
    "resourceMemoryName": "the shim's name for nvidia.com/gpumem",
    "resourceMemoryPercentageName": "the shim's name for nvidia.com/gpumem-percentage",
    "resourceCoreName": "the shim's name for nvidia.com/gpucores",
    "resourcePriorityName": "the shim's name for nvidia.com/priority",
    "defaultMemory": "gpumem of a container that gives none (shim)",
    "defaultCores": "gpucores of a container that gives none (shim)",
    "defaultGPUNum": "gpu count of a container that gives gpumem/gpucores only (shim)",
    "memoryFactor": "unit of gpumem in MiB (shim multiplies the request by it)",
    "deviceSplitCount": "shares per GPU of a hami-core GPU (kubelet plugin)",
    "deviceMemoryScaling": "fraction of a hami-core GPU's memory its shares may hold (kubelet plugin)",
    "deviceCoreScaling": "fraction of a hami-core GPU's SMs its shares may hold (kubelet plugin)",
}


class DeviceConfigError(ValueError):
    """The document is not a HAMi device config; the message names the path that is wrong."""


def device_config_document(doc: Any, where: str = "device config") -> dict[str, Any]:
    """The `{nvidia: ...}` document from what a user has: the ConfigMap itself (`kind: ConfigMap`), its
    `data` map, or the document. A data value that is a string is parsed as YAML (or JSON)."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise DeviceConfigError(f"{where}: must be a mapping, got {type(doc).__name__}")
    if doc.get("kind") == "ConfigMap":
        data = doc.get("data")
        if not isinstance(data, Mapping):
            raise DeviceConfigError(f"{where}: data: a ConfigMap needs a data map, got {data!r}")
        return device_config_document(data, f"{where}: data")
    if "nvidia" not in doc:
        texts = [k for k, v in doc.items() if isinstance(v, str)]
        key = DATA_KEY if DATA_KEY in texts else (texts[0] if len(texts) == 1 else None)
        if key is not None:
            try:
                parsed = yaml.safe_load(doc[key])
            except yaml.YAMLError as exc:
                raise DeviceConfigError(f"{where}.{key}: not valid YAML or JSON: {exc}") from None
            return device_config_document(parsed, f"{where}.{key}")
    return dict(doc)


def nvidia_section(doc: Mapping[str, Any], where: str = "device config") -> Mapping[str, Any]:
    """`nvidia:` of a device config document ({} when absent)."""
    section = doc.get("nvidia")
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise DeviceConfigError(f"{where}: nvidia: must be a mapping, got {type(section).__name__}")
    return section


def other_version_hint(section: Mapping[str, Any]) -> str | None:
    """Why `nvidia:` looks like a device config of another HAMi version (v2.9's `knownMigGeometries`
    whole-GPU templates, which v2.10 replaced by `migProfileAllowlist`), or None. A component that cannot
    start on it says so and names `flexmig migrate-config`, instead of only "no allowlist" (which reads
    like flexmig's own mistake) or a field error in a shape the operator never meant to write."""
    allow = section.get("migProfileAllowlist")
    if "knownMigGeometries" in section and allow is None:
        return "nvidia.knownMigGeometries (HAMi v2.9's whole-GPU templates) and no nvidia.migProfileAllowlist"
    if isinstance(allow, list):
        for i, entry in enumerate(allow):
            if isinstance(entry, Mapping) and "allowedGeometries" in entry:
                return f"nvidia.migProfileAllowlist[{i}] has allowedGeometries (HAMi v2.9's template shape)"
            profiles = entry.get("profiles") if isinstance(entry, Mapping) else None
            if isinstance(profiles, list) and any(isinstance(p, Mapping) for p in profiles):
                return (
                    f"nvidia.migProfileAllowlist[{i}].profiles holds {{name, memory, count}} templates "
                    "(HAMi v2.9's shape; v2.10 lists profile names)"
                )
    return None


def other_version_message(reason: str, path: str) -> str:
    """The one line a component stops with on such a config."""
    return (
        f"this looks like a HAMi device config of another version (v2.9 or earlier): {reason}; flexmig "
        f"reads HAMi v2.10's nvidia.migProfileAllowlist. Run `flexmig migrate-config {path} -o values.yaml` "
        "to convert it (docs/hami-config.md)"
    )


def unused_keys(doc: Mapping[str, Any]) -> list[str]:
    """Dotted paths of the keys flexmig does not use (other vendors' sections, `nvidia.overwriteEnv`,
    `nvidia.knownMigGeometries`, ...), sorted. `flexmig migrate-config` turns knownMigGeometries into
    an allowlist."""
    out = [str(k) for k in doc if k != "nvidia"]
    section = doc.get("nvidia")
    if isinstance(section, Mapping):
        out += [f"nvidia.{k}" for k in section if k not in USED_NVIDIA_KEYS]
    return sorted(out)


def unused_keys_message(keys: list[str]) -> str:
    """The one warning a component logs for them."""
    return (
        "device config keys flexmig does not use (accepted, no effect): "
        + ", ".join(keys)
        + (
            "; run `flexmig migrate-config` for knownMigGeometries"
            if "nvidia.knownMigGeometries" in keys
            else ""
        )
    )
