"""One GPU's published devices: its counter set, the whole-GPU device and one MIG device per placement.

Pure: no I/O. The devices are plain camelCase dicts, put into ResourceSlices by
kubeletplugin/publish/slices.py, which also decides per GPU which of them appear. For GPU i:
- counter set `gpu-<i>-counter-set`: `memory-slice-<k>` = 1 for every memory slice, plus capacity
  counters `memory` (Mi), `multiprocessors`, `copy-engines`, `decoders`, `encoders`, `jpegs`, `ofas`;
- whole-GPU device `gpu-<i>` consuming every counter of the set, so it excludes every MIG device; on a
  MIG-capable GPU it says whether a MIG mode change needs a reset, and there the current MIG mode;
- one MIG device per allowed (profile, placement), consuming the memory slices `[start, start+size)` and
  its capacities; two placements that overlap share a memory-slice counter, so no counter-honouring
  allocator can hand out both.

Attribute, capacity and counter names are the published device contract of api/devicecontract.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from api import devicecontract as dc
from api.constants import counter_set_name, memory_slice_counter_name, mig_device_name, whole_gpu_device_name
from driver.catalog.types import GpuCatalog, MigProfile
from kubeletplugin.publish.slicelimits import MAX_ATTRIBUTE_STRING_LENGTH

# (dimension of the published contract, MigProfile attribute that gives its value)
_PROFILE_FIELD = {
    dc.CAP_MEMORY: "memory_mib",
    dc.CAP_MULTIPROCESSORS: "multiprocessors",
    dc.CAP_COPY_ENGINES: "copy_engines",
    dc.CAP_DECODERS: "decoders",
    dc.CAP_ENCODERS: "encoders",
    dc.CAP_JPEGS: "jpegs",
    dc.CAP_OFAS: "ofas",
}
_DIMENSIONS: tuple[tuple[dc.Dimension, str], ...] = tuple(
    (d, _PROFILE_FIELD[d.capacity]) for d in dc.DIMENSIONS
)


def capacity_counter_totals(catalog: GpuCatalog) -> dict[str, int]:
    return dict(_layout_maxima(catalog.profiles, catalog.memory_slices, catalog.compute_slices))


@functools.lru_cache(maxsize=64)  # every GPU of a model has the same answer; the search is ~20 ms
def _layout_maxima(
    profiles: tuple[MigProfile, ...], memory_slices: int, compute_slices: int
) -> tuple[tuple[str, int], ...]:
    """Capacity-counter values for a GPU's counter set.

    Each must be at least what any layout NVML accepts consumes together, or a counter-honouring
    allocator would refuse a valid layout; and as small as possible so the counters still mean something
    (an OFA counter of 7 where only one `+me` instance can exist would be noise). So: the per-dimension
    maximum over every set of allowed instances with disjoint placements, per-profile instance caps and
    the GPU's compute-slice budget. Media-engine exclusivity rules are not modelled, which can only make
    a value larger, never too small. The search is tiny: <=12 memory slices, a few placements each.
    """
    by_start: dict[int, list[MigProfile]] = {}
    for prof in profiles:
        for pl in prof.placements:
            by_start.setdefault(pl.start, []).append(prof)
    width = max([memory_slices, *(pl.end for p in profiles for pl in p.placements)])
    compute_budget = compute_slices or sum(p.compute_slices for p in profiles)
    attrs = [attr for _, attr in _DIMENSIONS]
    best = [max((getattr(p, a) for p in profiles), default=0) for a in attrs]
    used: dict[int, int] = {}

    def visit(x: int, compute: int, sums: list[int]) -> None:
        for i, v in enumerate(sums):
            best[i] = max(best[i], v)
        if x >= width:
            return
        visit(x + 1, compute, sums)
        for prof in by_start.get(x, ()):
            n = used.get(prof.gi_profile_id, 0)
            cap = prof.instance_count or width  # 0 means "unknown": stay an upper bound
            if n >= cap or compute + prof.compute_slices > compute_budget:
                continue
            used[prof.gi_profile_id] = n + 1
            visit(
                x + prof.memory_slices,
                compute + prof.compute_slices,
                [v + getattr(prof, a) for v, a in zip(sums, attrs, strict=True)],
            )
            used[prof.gi_profile_id] = n

    visit(0, 0, [0] * len(attrs))
    return tuple((dim.counter, best[i]) for i, (dim, _) in enumerate(_DIMENSIONS))


def _attr_str(value: str) -> dict[str, Any]:
    # Attribute strings are capped at 64 characters by the API; product names are informational.
    return {"string": value[:MAX_ATTRIBUTE_STRING_LENGTH]}


def common_attributes(catalog: GpuCatalog) -> dict[str, Any]:
    gpu = catalog.gpu
    return {
        dc.ATTR_PRODUCT_NAME: _attr_str(gpu.name),
        dc.ATTR_MODEL: _attr_str(catalog.model),
        dc.ATTR_ARCHITECTURE: _attr_str(gpu.architecture.value),
        dc.ATTR_INDEX: {"int": gpu.index},
    }


def _counter_set(catalog: GpuCatalog, totals: Mapping[str, int]) -> dict[str, Any]:
    counters = {memory_slice_counter_name(k): {"value": "1"} for k in range(catalog.memory_slices)}
    for dim, _ in _DIMENSIONS:
        if totals[dim.counter] > 0:  # a counter nobody consumes only adds noise
            counters[dim.counter] = {"value": dc.dimension_quantity(dim, totals[dim.counter])}
    return {"name": counter_set_name(catalog.gpu.index), "counters": counters}


def _mig_mode_attributes(catalog: GpuCatalog, mig_enabled: bool) -> dict[str, Any]:
    """What an operator needs to see a GPU waiting for an administrator's MIG enable + reset."""
    gpu = catalog.gpu
    if not gpu.mig_capable:
        return {}
    needs_reset = gpu.architecture.mig_toggle_needs_reset
    attrs: dict[str, Any] = {dc.ATTR_MIG_MODE_CHANGE_NEEDS_RESET: {"bool": needs_reset}}
    if needs_reset:  # only there is the start-time mode still true later (see dc.ATTR_MIG_MODE)
        attrs[dc.ATTR_MIG_MODE] = _attr_str(dc.MIG_MODE_ON if mig_enabled else dc.MIG_MODE_OFF)
    return attrs


def _whole_device(
    catalog: GpuCatalog, counter_set: Mapping[str, Any] | None, mig_enabled: bool
) -> dict[str, Any]:
    gpu = catalog.gpu
    capacity = {dc.CAP_MEMORY: {"value": dc.dimension_quantity(dc.MEMORY_DIMENSION, gpu.memory_total_mib)}}
    for dim, attr in _DIMENSIONS[1:]:
        # NVML gives engine/SM counts per MIG profile only; the largest profile is the best whole-GPU figure.
        best = max((getattr(p, attr) for p in catalog.all_profiles), default=0)
        capacity[dim.capacity] = {"value": dc.dimension_quantity(dim, best)}
    device: dict[str, Any] = {
        "name": whole_gpu_device_name(gpu.index),
        "attributes": {
            dc.ATTR_TYPE: _attr_str(dc.TYPE_WHOLE_GPU),
            dc.ATTR_UUID: _attr_str(gpu.uuid),
            **common_attributes(catalog),
            dc.ATTR_MIG_CAPABLE: {"bool": gpu.mig_capable},
            dc.ATTR_MEMORY_SLICES: {"int": catalog.memory_slices},
            dc.ATTR_COMPUTE_SLICES: {"int": catalog.compute_slices},
            **_mig_mode_attributes(catalog, mig_enabled),
        },
        "capacity": capacity,
    }
    if counter_set is not None:
        # Consuming every counter makes the whole GPU and any MIG device mutually exclusive.
        device["consumesCounters"] = [
            {"counterSet": counter_set["name"], "counters": dict(counter_set["counters"])}
        ]
    return device


def _mig_device(
    catalog: GpuCatalog, profile: MigProfile, start: int, size: int, set_name: str
) -> dict[str, Any]:
    gpu = catalog.gpu
    counters = {memory_slice_counter_name(k): {"value": "1"} for k in range(start, start + size)}
    capacity: dict[str, Any] = {}
    for dim, attr in _DIMENSIONS:
        value = int(getattr(profile, attr))
        capacity[dim.capacity] = {"value": dc.dimension_quantity(dim, value)}
        if value > 0:
            counters[dim.counter] = {"value": dc.dimension_quantity(dim, value)}
    return {
        "name": mig_device_name(gpu.index, profile.name, profile.gi_profile_id, start),
        "attributes": {
            dc.ATTR_TYPE: _attr_str(dc.TYPE_MIG),
            dc.ATTR_PARENT_UUID: _attr_str(gpu.uuid),
            **common_attributes(catalog),
            dc.ATTR_PROFILE: _attr_str(profile.name),
            dc.ATTR_GI_PROFILE_ID: {"int": profile.gi_profile_id},
            dc.ATTR_PLACEMENT_START: {"int": start},
            dc.ATTR_PLACEMENT_SIZE: {"int": size},
            dc.ATTR_MEMORY_SLICES: {"int": profile.memory_slices},
            dc.ATTR_COMPUTE_SLICES: {"int": profile.compute_slices},
            # The parent's totals, so a selector can ask for "at least p% of the GPU" (contract C1/C3).
            dc.ATTR_GPU_MEMORY_SLICES: {"int": catalog.memory_slices},
            dc.ATTR_GPU_COMPUTE_SLICES: {"int": catalog.compute_slices},
        },
        "capacity": capacity,
        "consumesCounters": [{"counterSet": set_name, "counters": counters}],
    }


def gpu_devices(
    catalog: GpuCatalog, whole: bool, mig: bool, mig_enabled: bool = False
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    counter_set = _counter_set(catalog, capacity_counter_totals(catalog)) if mig else None
    devices: list[dict[str, Any]] = []
    if mig and counter_set is not None:
        # Smallest instances first, whole GPU last: kube-scheduler (scheduler mode) takes the first fit,
        # so this order makes its fallback choice a best fit instead of burning a whole GPU.
        ordered = sorted(
            ((p, pl) for p in catalog.profiles for pl in p.placements),
            key=lambda item: (
                item[0].memory_mib,
                item[0].compute_slices,
                item[0].gi_profile_id,
                item[1].start,
            ),
        )
        devices.extend(_mig_device(catalog, p, pl.start, pl.size, counter_set["name"]) for p, pl in ordered)
    if whole:
        devices.append(_whole_device(catalog, counter_set, mig_enabled))
    return counter_set, devices
