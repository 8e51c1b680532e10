"""HAMi-style per-namespace GPU quotas, kept working for the pods the shim translates.

HAMi users cap a namespace with a ResourceQuota on `nvidia.com/gpu` and `nvidia.com/gpumem` (HAMi's
guide writes `limits.nvidia.com/gpumem`; Kubernetes' own form is `requests.nvidia.com/gpu`). The shim
removes those resources from the pod, so Kubernetes' quota admission, which runs after the webhook,
never sees them. The webhook therefore enforces such a quota itself: before it admits a translated pod
it adds what the namespace's live pods already hold to what the pod asks for, and denies the pod,
naming the quota, the resource, the limit and the use, when a limit would be exceeded.

What counts: a translated pod holds, per shim claim, `count` devices and `count x MiB` of memory (its
template's name fixes both: templates.py `shape_from_name`); a pod still carrying the resources (one
HAMi placed, or one left to Kubernetes' extended-resource mapping) holds what its containers' limits
say. Memory asked as a percentage, as a whole GPU (no gpumem, `defaultMemory` 0) or as an
`nvidia.com/mig-<profile>` has no MiB figure before a GPU is chosen; under a memory quota such a pod is
denied with what to write instead, never admitted uncounted. Pods admitted at the same moment are not
counted against each other (HAMi's own check has the same window). Pure: the webhook fetches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from controller.claims.quantity import QuantityError, parse_quantity
from controller.shim.defaults import ResourceNames
from controller.shim.legacy import Shape
from controller.shim.migprofile import ProfileShape
from controller.shim.templates import AnyShape, shape_from_name

QUOTA_KEY_PREFIXES = ("", "requests.", "limits.")
_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class QuotaLimit:
    quota: str  # ResourceQuota name
    key: str  # the key as written in spec.hard
    role: str  # "count" or "memory"
    hard: Fraction


def gpu_quota_limits(quotas: Iterable[Mapping[str, Any]], names: ResourceNames) -> list[QuotaLimit]:
    """The limits on GPU count and memory among a namespace's ResourceQuotas."""
    roles = {names.count: "count", names.memory: "memory"}
    out: list[QuotaLimit] = []
    for quota in quotas:
        name = str((quota.get("metadata") or {}).get("name", "?"))
        for key, raw in ((quota.get("spec") or {}).get("hard") or {}).items():
            for prefix in QUOTA_KEY_PREFIXES:
                role = roles.get(str(key)[len(prefix) :]) if str(key).startswith(prefix) else None
                if role is None:
                    continue
                # The API server accepts only quantities; nothing to enforce if one is not.
                with contextlib.suppress(QuantityError):
                    out.append(QuotaLimit(name, str(key), role, parse_quantity(str(raw))))
                break
    return out


def _shape_use(shape: AnyShape) -> tuple[int, int | None]:
    if isinstance(shape, ProfileShape):
        return shape.count, None
    mib = shape.memory_mib
    return shape.count, None if mib is None else shape.count * mib


def _number(raw: Any) -> int:
    try:
        value = parse_quantity(str(raw))
    except QuantityError:
        return 0
    return int(value) if value >= 0 else 0


def pod_use(pod: Mapping[str, Any], names: ResourceNames, memory_factor: int = 1) -> tuple[int, int]:
    """(GPUs, MiB) a live pod holds under HAMi's counting; 0 for a finished pod."""
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        return 0, 0
    spec = pod.get("spec") or {}
    gpus = mib = 0
    for entry in spec.get("resourceClaims") or []:
        shape = (
            shape_from_name(entry.get("resourceClaimTemplateName")) if isinstance(entry, Mapping) else None
        )
        if shape is not None:
            count, memory = _shape_use(shape)
            gpus, mib = gpus + count, mib + (memory or 0)
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            count = _number(limits.get(names.count, 0))
            gpus += count
            mib += count * _number(limits.get(names.memory, 0)) * memory_factor
    return gpus, mib


def quota_problems(
    namespace: str,
    limits: Sequence[QuotaLimit],
    pods: Iterable[Mapping[str, Any]],
    asked: Sequence[AnyShape],
    names: ResourceNames,
    memory_factor: int = 1,
) -> list[str]:
    """Why admitting a pod that asks for `asked` would break a limit; [] when it fits."""
    if not limits or not asked:
        return []
    used_gpus = used_mib = 0
    for pod in pods:
        g, m = pod_use(pod, names, memory_factor)
        used_gpus, used_mib = used_gpus + g, used_mib + m
    ask_gpus = sum(_shape_use(s)[0] for s in asked)
    memories = [_shape_use(s)[1] for s in asked]
    problems: list[str] = []
    for limit in limits:
        if limit.role == "memory" and any(m is None for m in memories):
            unsized = [_unsized(s) for s in asked if _shape_use(s)[1] is None]
            problems.append(
                f"namespace {namespace!r}: ResourceQuota {limit.quota!r} limits {limit.key} (MiB), and "
                f"this pod asks for {', '.join(unsized)}, which has no MiB figure until a GPU is chosen "
                f"(allowed under this quota: give {names.count} with {names.memory} in MiB)"
            )
            continue
        used, ask = (
            (used_gpus, ask_gpus) if limit.role == "count" else (used_mib, sum(m or 0 for m in memories))
        )
        if used + ask > limit.hard:
            problems.append(
                f"namespace {namespace!r}: ResourceQuota {limit.quota!r} limits {limit.key} to "
                f"{_show(limit.hard)}; {used} in use by the namespace's pods, this pod asks for {ask} "
                f"(allowed: at most {_show(max(Fraction(0), limit.hard - used))} more)"
            )
    return problems


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def _unsized(shape: AnyShape) -> str:
    if isinstance(shape, ProfileShape):
        return f"MIG profile {shape.profile}"
    if isinstance(shape, Shape) and shape.memory_percent is not None:
        return f"{shape.memory_percent}% of a GPU's memory"
    return "GPU memory without a size"


__all__ = ["QuotaLimit", "gpu_quota_limits", "pod_use", "quota_problems"]
