"""`flexmig migrate-config`: a HAMi device config with `knownMigGeometries` -> flexmig chart values.

HAMi v2.9 and earlier listed whole-GPU layouts per model (`knownMigGeometries`); v2.10's user guide says
to take the union of the profile names in those layouts as `migProfileAllowlist`, checked against what
each model offers. This does that, and carries the device config's other keys that flexmig's chart
has a value for (docs/hami-config.md), so the output is a values file for `helm install -f`.

Both shapes HAMi has shipped for `allowedGeometries` are read:

    allowedGeometries:                        allowedGeometries:
    - - {name: 1g.5gb, memory: 5120, count: 7}    - group: group1
    - - {name: 2g.10gb, ...}                        geometries: [{name: 1g.5gb, memory: 5120, count: 7}]

Every change is reported (a name the model does not offer mapped to the one NVIDIA's naming rule gives
for the same slice count, e.g. A100-80GB `7g.79gb` -> `7g.80gb`), and so is every name that could not
be mapped (`Migration.unmapped`: the migration is partial, and the command refuses to write it unless
asked to) and every key not carried over. Bad input raises MigrateError naming the path.
Pure apart from the catalog lookup (simulated discovery of each model's profile table).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.shim.defaults import ShimConfigError, parse_shim_defaults
from driver import hamiconfig
from driver.catalog.allowlist import AllowlistError, parse_allowlist
from driver.catalog.models import GpuModel, resolve_model
from driver.catalog.naming import is_valid_profile_name, rounded_name_match
from driver.catalog.simulated import simulated_catalog
from kubeletplugin.settings.nodeconfig import check_scaling, check_split_count

# nvidia.<key> -> chart value under deviceConfig
_CARRIED = {
    "defaultMemory": "defaultMemory",
    "defaultCores": "defaultCores",
    "defaultGPUNum": "defaultGPUNum",
    "deviceSplitCount": "deviceSplitCount",
    "memoryFactor": "memoryFactor",
    "deviceMemoryScaling": "deviceMemoryScaling",
    "deviceCoreScaling": "deviceCoreScaling",
}
_NAMES = (
    "resourceCountName",
    "resourceMemoryName",
    "resourceMemoryPercentageName",
    "resourceCoreName",
    "resourcePriorityName",
)
_HAMI_DEFAULT_NAMES = {
    "resourceCountName": "nvidia.com/gpu",
    "resourceMemoryName": "nvidia.com/gpumem",
    "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
    "resourceCoreName": "nvidia.com/gpucores",
    "resourcePriorityName": "nvidia.com/priority",
}


class MigrateError(ValueError):
    """The input is not a device config this command can read; the message names the path."""


@dataclass
class Migration:
    values: dict[str, Any]
    """Chart values: {deviceConfig: {migProfileAllowlist: [...], ...}}."""
    changes: list[str] = field(default_factory=list)
    """Every change made, one line each, naming where it came from."""
    unmapped: list[str] = field(default_factory=list)
    """Every profile name that could not be mapped (left out), why, and the names allowed instead.
    Not empty: the values would allow less than the input did (a model left out disables MIG on it)."""
    not_carried: list[str] = field(default_factory=list)
    """Keys of the input that have no chart value (docs/hami-config.md)."""


@functools.lru_cache(maxsize=32)
def offered_profiles(model_key: str) -> tuple[str, ...]:
    """Every GPU-instance profile name the model offers (its simulated catalog, all profiles)."""
    return tuple(p.name for p in simulated_catalog(model_key).all_profiles)


def map_profile(name: str, offered: Sequence[str]) -> str | None:
    """`name` when offered, else its rounding-difference twin (`rounded_name_match`), else None."""
    return rounded_name_match(name, offered)


def _strings(raw: Any, where: str) -> list[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x.strip() for x in raw):
        raise MigrateError(f"{where}: must be a non-empty list of strings, got {raw!r}")
    return [x.strip() for x in raw]


def _template_names(raw: Any, where: str) -> list[str]:
    """Profile names of one whole-GPU template: a list of {name, memory, count}."""
    if not isinstance(raw, list) or not raw:
        raise MigrateError(f"{where}: must be a non-empty list of {{name, memory, count}}, got {raw!r}")
    names: list[str] = []
    for j, item in enumerate(raw):
        at = f"{where}[{j}]"
        if not isinstance(item, Mapping):
            raise MigrateError(f"{at}: must be a mapping {{name, memory, count}}, got {item!r}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise MigrateError(f"{at}.name: must be a profile name such as 1g.10gb, got {name!r}")
        count = item.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MigrateError(f"{at}.count: must be a non-negative integer, got {count!r}")
        names.append(name.strip())
    return names


def geometry_names(raw: Any, where: str) -> list[str]:
    """The union (first-seen order) of profile names in `allowedGeometries`, either shape."""
    if not isinstance(raw, list) or not raw:
        raise MigrateError(f"{where}: must be a non-empty list of geometries, got {raw!r}")
    out: list[str] = []
    for k, geometry in enumerate(raw):
        at = f"{where}[{k}]"
        if isinstance(geometry, Mapping):  # {group, geometries: [...]}
            unknown = sorted(set(geometry) - {"group", "geometries"})
            if unknown or "geometries" not in geometry:
                raise MigrateError(
                    f"{at}: a grouped geometry has keys group and geometries, got {sorted(geometry)}"
                )
            names = _template_names(geometry["geometries"], f"{at}.geometries")
        else:
            names = _template_names(geometry, at)
        out += [n for n in names if n not in out]
    return out


@dataclass
class _ModelProfiles:
    model_strings: list[str]
    profiles: list[str]


def _merge(groups: dict[str, _ModelProfiles], key: str, model_string: str, names: list[str]) -> None:
    group = groups.setdefault(key, _ModelProfiles([], []))
    if model_string not in group.model_strings:
        group.model_strings.append(model_string)
    group.profiles += [n for n in names if n not in group.profiles]


def _entry_profiles(
    model: GpuModel | None, model_string: str, names: list[str], where: str, out: Migration
) -> list[str]:
    """The names checked against what the model offers; reports changes and unmapped names."""
    if model is None:
        out.changes.append(
            f"{where}: model {model_string!r} is not a GPU flexmig knows; its names are kept unchecked "
            f"(it matches only a GPU whose NVML name is exactly {model_string!r})"
        )
        for name in names:
            if not is_valid_profile_name(name):
                out.unmapped.append(
                    f"{where}: {name!r} for {model_string!r} is not a MIG profile name; left out "
                    "(allowed: NVIDIA's form <G>g.<GB>gb, e.g. 1g.10gb, 3g.40gb, 1g.24gb+me)"
                )
        return [n for n in names if is_valid_profile_name(n)]
    offered = offered_profiles(model.key)
    kept: list[str] = []
    for name in names:
        mapped = map_profile(name, offered)
        if mapped is None:
            out.unmapped.append(
                f"{where}: {name!r} is not a profile of {model.key} ({model_string!r}); left out "
                f"(it offers: {', '.join(offered)})"
            )
            continue
        if mapped != name:
            out.changes.append(
                f"{where}: {name!r} -> {mapped!r} for {model.key} ({model_string!r}): the name NVIDIA's "
                "rule gives that profile"
            )
        if mapped not in kept:
            kept.append(mapped)
    return kept


def _group_key(model: GpuModel | None, model_string: str) -> str:
    return model.key if model is not None else f"unknown:{' '.join(model_string.split()).casefold()}"


def _allowlist(section: Mapping[str, Any], out: Migration) -> list[dict[str, list[str]]]:
    groups: dict[str, _ModelProfiles] = {}
    existing = section.get("migProfileAllowlist")
    if existing is not None:
        try:
            parse_allowlist(existing)
        except AllowlistError as exc:
            raise MigrateError(f"nvidia.{exc}") from None
        for entry in existing:
            for model_string in entry["models"]:
                model = resolve_model(model_string)
                _merge(groups, _group_key(model, model_string), model_string, list(entry["profiles"]))
        out.changes.append(f"nvidia.migProfileAllowlist: {len(existing)} existing entries kept")
    known = section.get("knownMigGeometries")
    if known is None:
        if existing is None:
            raise MigrateError("nvidia.knownMigGeometries: missing (and no nvidia.migProfileAllowlist)")
        return [{"models": g.model_strings, "profiles": g.profiles} for g in groups.values()]
    if not isinstance(known, list):
        raise MigrateError(
            f"nvidia.knownMigGeometries: must be a list of {{models, allowedGeometries}}, got {known!r}"
        )
    for i, entry in enumerate(known):
        where = f"nvidia.knownMigGeometries[{i}]"
        if not isinstance(entry, Mapping):
            raise MigrateError(f"{where}: must be a mapping {{models, allowedGeometries}}, got {entry!r}")
        unknown = sorted(set(entry) - {"models", "allowedGeometries"})
        if unknown:
            raise MigrateError(f"{where}: unknown keys {unknown} (allowed: models, allowedGeometries)")
        models = _strings(entry.get("models"), f"{where}.models")
        names = geometry_names(entry.get("allowedGeometries"), f"{where}.allowedGeometries")
        out.changes.append(
            f"{where}: {len(entry['allowedGeometries'])} geometries of {', '.join(models)} -> profiles "
            f"{', '.join(names)}"
        )
        by_model: dict[str, list[str]] = {}
        for model_string in dict.fromkeys(models):
            by_model.setdefault(_group_key(resolve_model(model_string), model_string), []).append(
                model_string
            )
        for key, strings in by_model.items():
            kept = _entry_profiles(resolve_model(strings[0]), ", ".join(strings), names, where, out)
            for model_string in strings:
                _merge(groups, key, model_string, kept)
    result = [{"models": g.model_strings, "profiles": g.profiles} for g in groups.values() if g.profiles]
    for g in groups.values():
        if not g.profiles:
            out.unmapped.append(
                f"models {', '.join(g.model_strings)}: no profile left, so the model is not in the "
                "allowlist (flexmig would publish no MIG device on those GPUs)"
            )
    try:
        parse_allowlist(result)
    except AllowlistError as exc:  # e.g. an unknown model string twice under different spellings
        raise MigrateError(f"the migrated allowlist is invalid: {exc}") from None
    return result


def _check_values(doc: Mapping[str, Any], section: Mapping[str, Any]) -> None:
    """The carried keys, checked by the parsers the components use (so the values install)."""
    try:
        parse_shim_defaults(doc)
    except ShimConfigError as exc:
        raise MigrateError(str(exc)) from None
    for key, check in (
        ("deviceSplitCount", check_split_count),
        ("deviceMemoryScaling", check_scaling),
        ("deviceCoreScaling", check_scaling),
    ):
        if section.get(key) is not None:
            try:
                check(section[key])
            except ValueError as exc:
                raise MigrateError(f"nvidia.{key}: {exc}") from None


def migrate(raw: Any) -> Migration:
    """Chart values from a HAMi device config (the document, the ConfigMap or its data map)."""
    try:
        doc = hamiconfig.device_config_document(raw, "input")
        section = hamiconfig.nvidia_section(doc, "input")
    except hamiconfig.DeviceConfigError as exc:
        raise MigrateError(str(exc)) from None
    if not section:
        raise MigrateError("input: no nvidia section (expected a HAMi device config: nvidia: {...})")
    _check_values(doc, section)
    out = Migration(values={})
    device: dict[str, Any] = {"migProfileAllowlist": _allowlist(section, out)}
    for key, value_key in _CARRIED.items():
        if section.get(key) is not None:
            device[value_key] = section[key]
            out.changes.append(f"nvidia.{key}: {section[key]!r} -> deviceConfig.{value_key}")
    names = {
        k: section[k]
        for k in _NAMES
        if section.get(k) not in (None, "") and section[k] != _HAMI_DEFAULT_NAMES[k]
    }
    if names:
        device["resourceNames"] = names
        out.changes += [f"nvidia.{k}: {v!r} -> deviceConfig.resourceNames.{k}" for k, v in names.items()]
    used = {"migProfileAllowlist", "knownMigGeometries", *_CARRIED, *_NAMES}
    out.not_carried = [k for k in hamiconfig.unused_keys(doc) if k.removeprefix("nvidia.") not in used]
    out.values = {"deviceConfig": device}
    return out
