"""Build this node's ResourceSlices (KEP-4815 partitionable devices, 1.35+ layout). Pure: no I/O.

Slices are plain camelCase dicts (`resource.k8s.io/v1` JSON), not `kubernetes.client` models: the client
sends dicts unchanged, they compare and diff with `==`, and tests read them without a model layer.

Per published GPU i:
- counter set `gpu-<i>-counter-set`: `memory-slice-<k>` = 1 for every memory slice, plus capacity
  counters `memory` (Mi), `multiprocessors`, `copy-engines`, `decoders`, `encoders`, `jpegs`, `ofas`;
- whole-GPU device `gpu-<i>` consuming every counter of the set, so it excludes every MIG device;
- one MIG device per allowed (profile, placement), consuming the memory slices `[start, start+size)` and
  its capacities; two placements that overlap share a memory-slice counter, so no counter-honouring
  allocator can hand out both.

Layout: the pool is named after the node; counter sets go into slices of their own (<=8 sets each, the
API limit; 1.35+ rejects a slice with both), devices into other slices (<=64 devices each, the limit for
devices that consume counters). A GPU's devices are kept together in one slice whenever they fit (every
known model has <=31), and GPUs are packed first-fit in index order so a 16-GPU node needs few objects.
Slice names are `<node>-gpu.flexmig.dev-<k>`, counter slices first. All slices carry the same
generation and `resourceSliceCount`, so the scheduler only uses the pool once it sees all of them.

Attribute, capacity and counter names are the published device contract of api/devicecontract.py.

Which GPUs appear (docs/kubelet-plugin.md): none when the GPU is in `filterdevices` or the node's `operatingmode`
is `mps`. A `hami-core` node publishes one shareable `gpu-<i>-shared` device per GPU whose MIG mode is
off and nothing else (kubeletplugin/shared/device.py, contract C1 in docs/architecture.md). On a `mig` node: Hopper and newer publish the whole GPU and its MIG devices (MIG mode is switched at
prepare). GPUs that need a reset to switch MIG mode (Ampere) publish what their *current* mode allows:
the whole GPU when MIG is off, only MIG devices when it is on.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api import devicecontract as dc
from api.constants import (
    DRIVER_NAME,
    counter_set_name,
    memory_slice_counter_name,
    mig_device_name,
    whole_gpu_device_name,
)
from driver.catalog.types import GpuCatalog, MigProfile
from kubeletplugin.publish.slicelimits import (
    MAX_ATTRIBUTE_STRING_LENGTH,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_COUNTERS,
    MAX_NAME_DNS_SUBDOMAIN,
    validate_pool,
)
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode
from kubeletplugin.shared.device import ShareEnforcement, shared_decision, shared_gpu_device

API_VERSION = "resource.k8s.io/v1"
SHARES_REFUSED_REASON = (
    "HAMi-core library missing: share not published, its limits could not be enforced (install"
    " libvgpu.so and restart the plugin, or allow unenforced shares with --unenforced-shares=publish)"
)

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


@dataclass(frozen=True, slots=True)
class GpuPublication:
    """What was published for one GPU, and why, so the plugin can log and report it."""

    gpu_index: int
    gpu_uuid: str
    whole: bool
    mig_devices: int
    reason: str
    shared: bool = False  # `gpu-<i>-shared` published (hami-core node)
    shares: ShareEnforcement | None = None  # set for a GPU in hami-core mode that MIG mode did not exclude


@dataclass(frozen=True, slots=True)
class PublishedSlice:
    name: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeSlices:
    slices: tuple[PublishedSlice, ...]
    gpus: tuple[GpuPublication, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slices)


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


def gpu_decision(catalog: GpuCatalog, mig_enabled: bool, node: NodeConfig) -> tuple[bool, bool, str]:
    """(publish whole GPU, publish MIG devices, reason) for one GPU."""
    gpu = catalog.gpu
    if node.is_filtered(gpu.index, gpu.uuid):
        return False, False, "excluded by filterdevices"
    mode = node.gpu_mode(gpu.mig_capable)
    if mode is not OperatingMode.MIG:
        return False, False, f"node operatingmode is {node.operating_mode.value!r}, not 'mig'"
    return _mig_gpu_decision(catalog, mig_enabled)


def _mig_gpu_decision(catalog: GpuCatalog, mig_enabled: bool) -> tuple[bool, bool, str]:
    gpu = catalog.gpu
    if gpu.architecture.mig_toggle_needs_reset and mig_enabled:
        if not catalog.profiles:
            return False, False, "MIG mode is on (needs a reset to turn off) and no MIG profile is allowed"
        return False, True, "MIG mode is on and cannot change without a GPU reset: MIG devices only"
    if not gpu.mig_capable:
        return True, False, "not MIG-capable: whole GPU only"
    if gpu.architecture.mig_toggle_needs_reset:
        return True, False, "MIG mode is off and cannot change without a GPU reset: whole GPU only"
    if not catalog.profiles:
        return True, False, "no MIG profile allowed for this model: whole GPU only"
    return True, True, "whole GPU and MIG devices (MIG mode switched at prepare)"


def _attr_str(value: str) -> dict[str, Any]:
    # Attribute strings are capped at 64 characters by the API; product names are informational.
    return {"string": value[:MAX_ATTRIBUTE_STRING_LENGTH]}


def _common_attributes(catalog: GpuCatalog) -> dict[str, Any]:
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


def _whole_device(catalog: GpuCatalog, counter_set: Mapping[str, Any] | None) -> dict[str, Any]:
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
            **_common_attributes(catalog),
            dc.ATTR_MIG_CAPABLE: {"bool": gpu.mig_capable},
            dc.ATTR_MEMORY_SLICES: {"int": catalog.memory_slices},
            dc.ATTR_COMPUTE_SLICES: {"int": catalog.compute_slices},
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
            **_common_attributes(catalog),
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


def _gpu_devices(
    catalog: GpuCatalog, whole: bool, mig: bool
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
        devices.append(_whole_device(catalog, counter_set))
    return counter_set, devices


def slice_name_prefix(node_name: str) -> str:
    prefix = f"{node_name}-{DRIVER_NAME}"
    # Leave room for "-<k>"; a node name near the 253 limit gets a stable hash instead of its tail.
    if len(prefix) + 6 > MAX_NAME_DNS_SUBDOMAIN:
        digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
        keep = MAX_NAME_DNS_SUBDOMAIN - 6 - len(DRIVER_NAME) - len(digest) - 2
        prefix = f"{node_name[:keep].rstrip('.-')}-{digest}-{DRIVER_NAME}"
    return prefix


def _pack(groups: Sequence[list[dict[str, Any]]], limit: int) -> list[list[dict[str, Any]]]:
    """First-fit in order, never splitting a group that fits in one slice."""
    out: list[list[dict[str, Any]]] = []
    for group in groups:
        for i in range(0, len(group), limit):
            chunk = group[i : i + limit]
            if out and len(out[-1]) + len(chunk) <= limit:
                out[-1].extend(chunk)
            else:
                out.append(list(chunk))
    return out


def build_node_slices(
    catalogs: Sequence[GpuCatalog],
    node_name: str,
    generation: int,
    node_config: NodeConfig,
    mig_enabled: Mapping[int, bool],
    *,
    node_uid: str | None = None,
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE_WITH_COUNTERS,
    shares: ShareEnforcement = ShareEnforcement.ENFORCED,
) -> NodeSlices:
    """All of the node's slices for pool `node_name` at `generation`.

    `mig_enabled` maps GPU index to its *current* MIG mode (missing = off). `node_uid`, when given, makes
    the Node the slices' owner so they are garbage-collected with it. `shares` says whether HAMi-core
    can enforce a share here (ENFORCED), cannot but the admin lets shares be published anyway, marked
    `enforced: false` (UNENFORCED), or cannot and shares are withheld (REFUSED). Raises ValueError if the result
    would break an API limit, which means a bug or an unknown GPU shape, never a silently bad publish.
    """
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation must be a non-negative integer, got {generation!r}")
    if not 1 <= max_devices_per_slice <= MAX_DEVICES_PER_SLICE_WITH_COUNTERS:
        raise ValueError(f"max_devices_per_slice must be in 1..{MAX_DEVICES_PER_SLICE_WITH_COUNTERS}")
    indexes = [c.gpu.index for c in catalogs]
    if len(set(indexes)) != len(indexes):
        raise ValueError(f"catalogs contain duplicate GPU indexes: {sorted(indexes)}")

    counter_sets: list[dict[str, Any]] = []
    device_groups: list[list[dict[str, Any]]] = []
    report: list[GpuPublication] = []
    for catalog in sorted(catalogs, key=lambda c: c.gpu.index):
        gpu = catalog.gpu
        refused_reason = ""
        if node_config.gpu_mode(gpu.mig_capable) is OperatingMode.HAMI_CORE:
            shared, reason = shared_decision(
                catalog, mig_enabled.get(gpu.index, False), node_config.is_filtered(gpu.index, gpu.uuid)
            )
            state = shares if shared else None
            if shared and shares is ShareEnforcement.REFUSED:
                shared, reason = False, SHARES_REFUSED_REASON
            if shared:
                device = shared_gpu_device(
                    catalog,
                    node_config.device_split_count,
                    _common_attributes(catalog),
                    enforced=shares is ShareEnforcement.ENFORCED,
                    memory_scaling=node_config.memory_scaling,
                    core_scaling=node_config.core_scaling,
                )
                device_groups.append([device])
                reason = f"{reason} ({node_config.device_split_count} shares, {shares.value})"
            if shared or node_config.operating_mode is not OperatingMode.AUTO or state is None:
                report.append(GpuPublication(gpu.index, gpu.uuid, False, 0, reason, shared, state))
                continue
            # auto chose hami-core only because the GPU cannot do MIG; without an enforced share it is
            # still worth offering whole (an exclusive GPU needs no enforcement).
            refused_reason = f"{reason}; "
        whole, mig, reason = (
            _mig_gpu_decision(catalog, mig_enabled.get(gpu.index, False))
            if refused_reason
            else gpu_decision(catalog, mig_enabled.get(gpu.index, False), node_config)
        )
        reason = refused_reason + reason
        counter_set, devices = _gpu_devices(catalog, whole, mig) if whole or mig else (None, [])
        if counter_set is not None:
            counter_sets.append(counter_set)
        if devices:
            device_groups.append(devices)
        report.append(
            GpuPublication(
                gpu.index,
                gpu.uuid,
                whole,
                len(devices) - int(whole),
                reason,
                shares=ShareEnforcement.REFUSED if refused_reason else None,
            )
        )

    contents: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", counter_sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    contents += [("devices", chunk) for chunk in _pack(device_groups, max_devices_per_slice)]

    prefix = slice_name_prefix(node_name)
    slices: list[PublishedSlice] = []
    for k, (key, items) in enumerate(contents):
        name = f"{prefix}-{k}"
        metadata: dict[str, Any] = {"name": name}
        if node_uid is not None:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        body = {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(contents)},
                key: items,
            },
        }
        slices.append(PublishedSlice(name=name, body=body))

    problems = validate_pool([s.body for s in slices])
    if problems:
        raise ValueError("ResourceSlices would violate API limits: " + "; ".join(problems[:10]))
    return NodeSlices(slices=tuple(slices), gpus=tuple(report))
