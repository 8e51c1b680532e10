"""`migProfileAllowlist`: which MIG profiles flexmig may create, per GPU model.

The shape is HAMi's (user guide), so an existing HAMi configuration keeps working:

    migProfileAllowlist:
      - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
        profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]

Decoding is strict: HAMi only checks that names look like "<N>g.*", so a typo such as "2g.10g" is
accepted there and silently never offered. Here every defect is an `AllowlistError` that names the
entry index, the field and what would have been accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from driver.catalog.models import GpuModel, model_keys, names_match, resolve_model
from driver.catalog.naming import PROFILE_NAME_PATTERN, is_valid_profile_name

log = structlog.get_logger(__name__)

_FIELDS = ("models", "profiles")


class AllowlistError(ValueError):
    """The allowlist configuration is malformed; the message says where and what is allowed."""


@dataclass(frozen=True, slots=True)
class AllowlistEntry:
    models: tuple[str, ...]
    profiles: tuple[str, ...]

    def matches(self, nvml_name: str) -> bool:
        return any(names_match(m, nvml_name) for m in self.models)

    def to_data(self) -> dict[str, list[str]]:
        return {"models": list(self.models), "profiles": list(self.profiles)}


@dataclass(frozen=True, slots=True)
class MigProfileAllowlist:
    entries: tuple[AllowlistEntry, ...]

    def entry_for(self, nvml_name: str) -> AllowlistEntry | None:
        """The entry that applies to a GPU with this NVML name (parsing guarantees at most one)."""
        return next((e for e in self.entries if e.matches(nvml_name)), None)

    def profiles_for(self, nvml_name: str) -> tuple[str, ...] | None:
        entry = self.entry_for(nvml_name)
        return None if entry is None else entry.profiles

    def to_data(self) -> list[dict[str, list[str]]]:
        """The configuration shape (list of {models, profiles}), e.g. to render into Helm values."""
        return [e.to_data() for e in self.entries]


def _string_list(entry: Mapping[Any, Any], index: int, field: str) -> tuple[str, ...]:
    where = f"migProfileAllowlist[{index}].{field}"
    if field not in entry:
        raise AllowlistError(f"{where}: required field is missing (each entry needs {' and '.join(_FIELDS)})")
    value = entry[field]
    # A bare string is a sequence too; accepting it would split "A30" into "A", "3", "0".
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise AllowlistError(f"{where}: expected a list of strings, got {type(value).__name__}")
    if not value:
        raise AllowlistError(f"{where}: must not be empty")
    items: list[str] = []
    for pos, item in enumerate(value):
        if not isinstance(item, str):
            raise AllowlistError(f"{where}[{pos}]: expected a string, got {type(item).__name__} {item!r}")
        text = item.strip()
        if not text:
            raise AllowlistError(f"{where}[{pos}]: must not be empty")
        if text in items:
            raise AllowlistError(f"{where}[{pos}]: {text!r} is listed twice")
        items.append(text)
    return tuple(items)


def _parse_entry(raw: object, index: int) -> AllowlistEntry:
    if not isinstance(raw, Mapping):
        raise AllowlistError(
            f"migProfileAllowlist[{index}]: expected a mapping with keys {', '.join(_FIELDS)}, "
            f"got {type(raw).__name__}"
        )
    unknown = sorted(str(k) for k in raw if k not in _FIELDS)
    if unknown:
        raise AllowlistError(
            f"migProfileAllowlist[{index}]: unknown field(s) {', '.join(unknown)}; "
            f"allowed fields: {', '.join(_FIELDS)}"
        )
    models = _string_list(raw, index, "models")
    profiles = _string_list(raw, index, "profiles")
    for pos, name in enumerate(profiles):
        if not is_valid_profile_name(name):
            raise AllowlistError(
                f"migProfileAllowlist[{index}].profiles[{pos}]: {name!r} is not a MIG profile name; "
                f"expected NVIDIA's form <G>g.<GB>gb with an optional +me, +me.all, +gfx or -me suffix "
                f"(pattern {PROFILE_NAME_PATTERN}), e.g. 1g.10gb, 3g.40gb, 1g.24gb+me"
            )
    return AllowlistEntry(models=models, profiles=profiles)


def parse_allowlist(data: object) -> MigProfileAllowlist:
    """Decode a YAML/JSON-decoded `migProfileAllowlist` value (a list of {models, profiles}).

    An empty list is valid and means "no MIG profiles anywhere" (whole GPUs only).
    """
    if isinstance(data, str | bytes) or not isinstance(data, Sequence):
        raise AllowlistError(
            f"migProfileAllowlist: expected a list of {{models: [...], profiles: [...]}} entries, "
            f"got {type(data).__name__}"
        )
    entries = tuple(_parse_entry(raw, i) for i, raw in enumerate(data))
    _check_models(entries)
    return MigProfileAllowlist(entries=entries)


def _check_models(entries: tuple[AllowlistEntry, ...]) -> None:
    """Reject a model claimed by two entries (which one applies would be ambiguous); warn on unknown."""
    owner: dict[str, tuple[int, str]] = {}
    for index, entry in enumerate(entries):
        for name in entry.models:
            model: GpuModel | None = resolve_model(name)
            key = model.key if model is not None else f"unknown:{' '.join(name.split()).casefold()}"
            if key in owner and owner[key][0] != index:
                first_index, first_name = owner[key]
                raise AllowlistError(
                    f"migProfileAllowlist[{index}].models: {name!r} names the same GPU model as "
                    f"{first_name!r} in migProfileAllowlist[{first_index}]; a model may appear in one "
                    f"entry only"
                )
            owner.setdefault(key, (index, name))
            if model is None:
                # Still usable: it matches a GPU whose NVML name is exactly this string.
                log.warning(
                    "allowlist names an unknown GPU model; it only matches a GPU with exactly this NVML name",
                    model=name,
                    entry=index,
                    known_models=", ".join(model_keys()),
                )


# The user guide's defaults, same shape. One correction: the guide lists "7g.79gb" for the A100-80GB,
# but NVIDIA's naming rule gives "7g.80gb" (NVML reports ~79 GiB for the 7g, whose memory fraction
# rounds up to 8/8 of an 80 GiB GPU), which is the name NVIDIA's tools print. With "7g.79gb" the full
# profile would never be offered on an A100-80GB.
_DEFAULT_DATA: list[dict[str, list[str]]] = [
    {"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb", "4g.24gb"]},
    {
        "models": ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"],
        "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"],
    },
    {
        "models": ["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"],
        "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"],
    },
    {
        "models": ["H100-PCIE-80GB", "H100-SXM5-80GB"],
        "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"],
    },
    {
        "models": ["H100-PCIE-94GB", "H100-SXM5-94GB"],
        "profiles": ["1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"],
    },
    {"models": ["H20", "H100 on GH200"], "profiles": ["1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"]},
    {"models": ["H200 NVL", "H200-SXM5"], "profiles": ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]},
    {"models": ["B200"], "profiles": ["1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"]},
    {"models": ["RTX PRO 6000 Blackwell Server Edition"], "profiles": ["1g.24gb", "2g.48gb", "4g.96gb"]},
    {
        "models": ["A800-SXM4-40GB", "A800-40GB-PCIe"],
        "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"],
    },
    {
        "models": ["A800-SXM4-80GB", "A800-80GB-PCIe"],
        "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"],
    },
    {"models": ["H800-SXM5-80GB", "H800 PCIe"], "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]},
    {"models": ["H20-3e"], "profiles": ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]},
    {"models": ["GB200"], "profiles": ["1g.23gb", "2g.47gb", "3g.93gb", "7g.186gb"]},
]


def default_allowlist_data() -> list[dict[str, list[str]]]:
    """A fresh copy of the default configuration value (safe to mutate)."""
    return [{k: list(v) for k, v in e.items()} for e in _DEFAULT_DATA]


DEFAULT_MIG_PROFILE_ALLOWLIST: MigProfileAllowlist = parse_allowlist(_DEFAULT_DATA)
