"""Build this node's ResourceSlices (KEP-4815 partitionable devices, 1.35+ layout). Pure: no I/O.

Slices are plain camelCase dicts (`resource.k8s.io/v1` JSON), not `kubernetes.client` models: the client
sends dicts unchanged, they compare and diff with `==`, and tests read them without a model layer.

Per published GPU i: a counter set `gpu-<i>-counter-set`, the whole-GPU device `gpu-<i>` and one MIG
device per allowed (profile, placement), built by kubeletplugin/publish/gpudevices.py; counters make the
whole GPU and overlapping placements mutually exclusive for any counter-honouring allocator.

Layout: the pool is named after the node; counter sets go into slices of their own (<=8 sets each, the
API limit; 1.35+ rejects a slice with both), devices into other slices (<=64 devices each, the limit for
devices that consume counters). A GPU's devices are kept together in one slice whenever they fit (every
known model has <=31), and GPUs are packed first-fit in index order so a 16-GPU node needs few objects.
Slice names are `<node>-gpu.flexmig.dev-<k>`, counter slices first. All slices carry the same
generation and `resourceSliceCount`, so the scheduler only uses the pool once it sees all of them.

Which GPUs appear (docs/kubelet-plugin.md): none when the GPU is in `filterdevices` or the node's `operatingmode`
is `mps`. A `hami-core` node publishes one shareable `gpu-<i>-shared` device per GPU whose MIG mode is
off and nothing else (kubeletplugin/shared/device.py, contract C1 in docs/architecture.md). On a `mig` node: Hopper and newer publish the whole GPU and its MIG devices (MIG mode is switched at
prepare). GPUs that need a reset to switch MIG mode (Ampere) publish what their *current* mode allows:
the whole GPU when MIG is off, only MIG devices when it is on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.constants import DRIVER_NAME
from driver.catalog.types import GpuCatalog
from kubeletplugin.publish.gpudevices import common_attributes, gpu_devices
from kubeletplugin.publish.slicelimits import (
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
                    common_attributes(catalog),
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
        counter_set, devices = (
            gpu_devices(catalog, whole, mig, mig_enabled.get(gpu.index, False))
            if whole or mig
            else (None, [])
        )
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
