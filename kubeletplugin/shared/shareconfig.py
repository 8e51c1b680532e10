"""A share's memory from the allocation's config: the same size whoever allocated the claim.

A `SharedGpuRequest` opaque config (memoryPercentage) in a claim asks for a share of that percent of
the GPU's memory. flexmig's controller turns it into the result's consumedCapacity.memory; kube-scheduler
(allocationMode scheduler) does not read opaque configs, writes the request policy's default (the whole
GPU) as consumed capacity, and copies the config into `status.allocation.devices.config` as upstream
does. So the node reads the config too: a share a percentage applies to holds floor(total * p / 100)
MiB (at least 1, contract C3, as the controller computes it), and never more than its consumed
capacity (what the allocator counted). Both modes therefore prepare the same limit.

A config applies to a result when it names no request, the result's request, or (for a firstAvailable
subrequest "r/s") its parent "r". Configs of other drivers are skipped; ours decode strictly
(api/opaqueconfig.py), and two different percentages for one request are refused, as the controller
refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from api.constants import DRIVER_NAME
from api.opaqueconfig import OpaqueConfigError, decode_parameters
from kubeletplugin.shared.capacity import SharedShare


class ShareConfigError(ValueError):
    """The allocation's config for our driver cannot be read; the message names the entry."""


def memory_percent(config: Sequence[Mapping[str, Any]], request: str) -> int | None:
    """The memoryPercentage that applies to results of `request` ("r" or "r/s"), or None."""
    names = {request, request.split("/", 1)[0]}
    found: dict[int, str] = {}
    for i, cfg in enumerate(config):
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        targets = cfg.get("requests") or ()
        if targets and not names.intersection(targets):
            continue
        where = f"status.allocation.devices.config[{i}].opaque.parameters"
        try:
            decoded = decode_parameters(where, opaque.get("parameters"))
        except OpaqueConfigError as exc:
            raise ShareConfigError(str(exc)) from None
        found.setdefault(decoded.memory_percentage, where)
    if len(found) > 1:
        raise ShareConfigError(
            f"more than one SharedGpuRequest memoryPercentage applies to request {request!r}: "
            f"{sorted(found)} ({', '.join(found.values())}); keep one"
        )
    return next(iter(found), None)


def sized(share: SharedShare, percent: int | None, gpu_memory_mib: int) -> SharedShare:
    """`share` limited to `percent` of the GPU's memory, never above what it consumes."""
    if percent is None:
        return share
    return replace(share, memory_mib=min(share.memory_mib, max(1, gpu_memory_mib * percent // 100)))
