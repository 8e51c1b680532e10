"""Reading HAMi's legacy requests (`nvidia.com/gpu`, `gpumem`, `gpumem-percentage`, `gpucores` and the
`nvidia.com/vgpu-mode` annotation) into one `Shape` per container, or a denial that says what to fix.

`nvidia.com/priority` (HAMi: 0 high, 1 low) is validated and removed with the others but has no
effect; any other `nvidia.com/*` resource on such a container is denied, because no node advertises
it once the GPUs come from a claim, and the pod would stay Pending holding its devices.

Values are read as Kubernetes quantities because the API server hands the webhook canonical quantity
strings: a user's `nvidia.com/gpumem: 8000` arrives as "8k". What must come out is a whole number: "1.5"
(canonically "1500m") or "abc" is denied. `gpumem` is a number of MiB, as in HAMi, so a binary suffix
("8Gi") is denied rather than read as 8 GiB of MiB.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from api.constants import (
    ANNOTATION_VGPU_MODE,
    RESOURCE_GPU,
    RESOURCE_GPUCORES,
    RESOURCE_GPUMEM,
    RESOURCE_GPUMEM_PERCENTAGE,
    VGPU_MODE_HAMI_CORE,
    VGPU_MODE_MIG,
)
from controller.claims.quantity import QuantityError, parse_quantity
from controller.shim.defaults import RESOURCE_PRIORITY, ResourceNames, ShimDefaults

LEGACY_RESOURCES = (RESOURCE_GPU, RESOURCE_GPUMEM, RESOURCE_GPUMEM_PERCENTAGE, RESOURCE_GPUCORES)
"""The resources that make a container a legacy GPU container (and get it rewritten)."""
REMOVED_RESOURCES = (*LEGACY_RESOURCES, RESOURCE_PRIORITY)
"""Every resource the rewrite takes out of such a container; other `nvidia.com/*` keys are denied."""
_VENDOR_PREFIX = "nvidia.com/"
MAX_GPUS = 32  # the API's limit on allocation results per claim
MAX_GPUMEM_MIB = 2**30  # 1 PiB; anything above is a typo, and it keeps template names short
_BINARY_SUFFIX = re.compile(r"[KMGTPE]i$")


class AdmissionDenied(Exception):
    """The pod cannot be admitted as written; `message` names the container, resource and allowed values."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Mode(enum.StrEnum):
    """Which devices a legacy request may land on (from `nvidia.com/vgpu-mode`)."""

    MIG = VGPU_MODE_MIG
    HAMI_CORE = VGPU_MODE_HAMI_CORE
    ANY = "any"


@dataclass(frozen=True)
class Shape:
    """One container's request: `count` devices, each with at least the memory (MiB or percent of its
    GPU) and the compute percent given."""

    count: int
    memory_mib: int | None
    memory_percent: int | None
    cores: int
    mode: Mode

    def __post_init__(self) -> None:
        # Invariants the template builder relies on; violations are bugs in this module, not user input.
        if not 1 <= self.count <= MAX_GPUS:
            raise ValueError(f"count {self.count} outside 1..{MAX_GPUS}")
        if (self.memory_mib is None) == (self.memory_percent is None):
            raise ValueError("exactly one of memory_mib and memory_percent must be set")
        if self.memory_mib is not None and not 1 <= self.memory_mib <= MAX_GPUMEM_MIB:
            raise ValueError(f"memory_mib {self.memory_mib} outside 1..{MAX_GPUMEM_MIB}")
        if self.memory_percent is not None and not 1 <= self.memory_percent <= 100:
            raise ValueError(f"memory_percent {self.memory_percent} outside 1..100")
        if not 0 <= self.cores <= 100:
            raise ValueError(f"cores {self.cores} outside 0..100")


def vgpu_mode(annotations: Mapping[str, Any] | None) -> Mode:
    """The pod's mode: `mig`, `hami-core`, or ANY when the annotation is absent."""
    if not annotations or ANNOTATION_VGPU_MODE not in annotations:
        return Mode.ANY
    raw = annotations[ANNOTATION_VGPU_MODE]
    if raw == VGPU_MODE_MIG:
        return Mode.MIG
    if raw == VGPU_MODE_HAMI_CORE:
        return Mode.HAMI_CORE
    raise AdmissionDenied(
        f"annotation {ANNOTATION_VGPU_MODE}={raw!r} is not supported "
        f"(allowed: {VGPU_MODE_MIG!r}, {VGPU_MODE_HAMI_CORE!r}, or no annotation for either)"
    )


def has_legacy_resources(container: Mapping[str, Any], names: ResourceNames | None = None) -> bool:
    resources = container.get("resources") or {}
    keys = LEGACY_RESOURCES if names is None else names.legacy
    return any(key in (resources.get(part) or {}) for part in ("limits", "requests") for key in keys)


# resource -> (lowest, highest, what the value means)
_RANGES: dict[str, tuple[int, int, str]] = {
    RESOURCE_GPU: (0, MAX_GPUS, "a whole number of GPUs"),
    RESOURCE_GPUMEM: (0, MAX_GPUMEM_MIB, "a whole number of MiB per GPU, e.g. 8000 (HAMi's unit)"),
    RESOURCE_GPUMEM_PERCENTAGE: (1, 100, "a whole percent of each GPU's memory"),
    RESOURCE_GPUCORES: (0, 100, "a whole percent of each GPU's compute"),
    RESOURCE_PRIORITY: (0, 1, "HAMi's task priority, 0 high or 1 low; accepted and ignored"),
}


def _value(raw: Any) -> Fraction | None:
    """The exact value of a quantity (string, or a JSON number from a hand-built object); None if not one."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return Fraction(raw)
    if isinstance(raw, float):
        return Fraction(raw) if raw == raw and abs(raw) != float("inf") else None
    if isinstance(raw, str):
        try:
            return parse_quantity(raw)
        except QuantityError:
            return None
    return None


def _read(
    who: str, key: str, where: str, raw: Any, errors: list[str], names: ResourceNames | None = None
) -> int | None:
    # A custom name (HAMi's resource*Name) plays the role of HAMi's default name.
    role = key if names is None else names.canonical(key)
    lowest, highest, meaning = _RANGES[role]
    allowed = f"allowed: {meaning}, {lowest}..{highest}"
    if role == RESOURCE_GPUMEM and isinstance(raw, str) and _BINARY_SUFFIX.search(raw.strip()):
        errors.append(f"{who}: {key}={raw!r} in {where}: binary suffixes are not accepted ({allowed})")
        return None
    value = _value(raw)
    if value is None or value.denominator != 1:
        errors.append(f"{who}: {key}={raw!r} in {where} is not a whole number ({allowed})")
        return None
    if not lowest <= value <= highest:
        errors.append(f"{who}: {key}={raw!r} in {where} is out of range ({allowed})")
        return None
    return int(value)


def _legacy_values(
    who: str, container: Mapping[str, Any], errors: list[str], names: ResourceNames | None = None
) -> dict[str, int]:
    """resource -> value, from limits or requests; both given must agree (Kubernetes requires equal
    limits and requests for extended resources; HAMi reads limits)."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    values: dict[str, int] = {}
    names = names or ResourceNames()
    unknown = sorted(
        {
            str(k)
            for k in (*limits, *requests)
            if str(k).startswith((_VENDOR_PREFIX, *names.prefixes)) and k not in names.removed
        }
    )
    if unknown:
        errors.append(
            f"{who}: {', '.join(unknown)} cannot be combined with {names.count} under flexmig "
            f"(allowed {'/'.join(names.prefixes)} resources: {', '.join(names.removed)})"
        )
    for key in names.removed:
        in_limits = _read(who, key, "limits", limits[key], errors, names) if key in limits else None
        # The API server copies extended-resource limits into requests: the same value is read once,
        # so a denial names each problem once.
        same = key in limits and key in requests and str(limits[key]) == str(requests[key])
        in_requests = (
            _read(who, key, "requests", requests[key], errors, names)
            if key in requests and not same
            else None
        )
        if in_limits is not None and in_requests is not None and in_limits != in_requests:
            errors.append(
                f"{who}: {key} differs between limits ({limits[key]!r}) and requests ({requests[key]!r}); "
                "give it in limits only, or the same value in both"
            )
            continue
        value = in_limits if in_limits is not None else in_requests
        if value is not None:
            values[key] = value
    return values


def container_shape(
    container: Mapping[str, Any], mode: Mode, defaults: ShimDefaults, kind: str = "container"
) -> Shape | None:
    """The shape a container's legacy resources ask for; None when it asks for no GPU (no legacy
    resource, or `nvidia.com/gpu: 0` alone). Raises AdmissionDenied listing every problem found."""
    who = f'{kind} "{container.get("name", "?")}"'
    errors: list[str] = []
    names = defaults.names
    values = _legacy_values(who, container, errors, names)
    if errors:
        raise AdmissionDenied("; ".join(errors))
    others = [k for k in (names.memory, names.memory_percentage, names.cores) if k in values]
    count = values.get(names.count)
    if count is None:
        if not others:
            return None
        if defaults.default_gpu_num == 0:
            raise AdmissionDenied(
                f"{who}: {', '.join(others)} given with no {names.count}, and the device config's "
                f"defaultGPUNum is 0 (allowed: add {names.count}: 1..{MAX_GPUS})"
            )
        count = defaults.default_gpu_num  # HAMi's webhook adds defaultGPUNum the same way
    elif count == 0:
        if others:
            raise AdmissionDenied(
                f"{who}: {names.count} is 0 but {', '.join(others)} is given "
                f"(allowed: {names.count}: 1..{MAX_GPUS} with them, or remove them)"
            )
        if names.priority in values:
            # The container is left as written, and no node advertises nvidia.com/priority.
            raise AdmissionDenied(
                f"{who}: {names.count} is 0 but {names.priority} is given (allowed: remove it)"
            )
        return None  # asks for nothing; the scheduler ignores zero requests, so it is left as written
    mib = values.get(names.memory)
    percent = values.get(names.memory_percentage)
    if mib is not None and percent is not None:
        raise AdmissionDenied(
            f"{who}: {names.memory} and {names.memory_percentage} are both given (allowed: one of them)"
        )
    if mib:
        # HAMi's memoryFactor: gpumem is given in units of that many MiB.
        mib *= defaults.memory_factor
        if mib > MAX_GPUMEM_MIB:
            raise AdmissionDenied(
                f"{who}: {names.memory}={values[names.memory]} times the device config's memoryFactor "
                f"{defaults.memory_factor} is {mib} MiB, above {MAX_GPUMEM_MIB} (allowed: a smaller value)"
            )
    if percent is None and not mib:  # gpumem 0 means "not given", as in HAMi
        mib = defaults.default_memory_mib or None
        percent = None if mib else 100
    cores = values.get(names.cores, defaults.default_cores)
    return Shape(count=count, memory_mib=mib, memory_percent=percent, cores=cores, mode=mode)
