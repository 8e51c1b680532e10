"""The HAMi-core shared-GPU parts of prepare (contract C2 in docs/architecture.md), kept apart from the MIG path they never touch.

A shared GPU (`gpu-<i>-shared`) needs no NVML object: prepare checks the GPU is the published one with
MIG off (kubeletplugin/prepare/steps.py::check_shared_gpu), then writes a CDI spec giving the container the whole GPU
plus the HAMi-core limits of its share. A claim normally holds one share per GPU; if an allocator gave
the same claim several shares of one GPU, the container sees that GPU once, limited to their sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from driver import cdi, hamicore
from kubeletplugin.agent.metrics import SharedGpuUsage
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.kube.kubeapi import AllocatedDevice
from kubeletplugin.shared.capacity import MAX_CORES, SharedShare, share_from_result
from kubeletplugin.shared.shareconfig import memory_percent, sized


def shares_of(
    results: Sequence[AllocatedDevice], gpu_memory_mib: int, config: Sequence[Mapping[str, Any]] = ()
) -> tuple[SharedShare, ...]:
    """The shares the results naming one shared device hold (in result order), each sized by a
    memoryPercentage config of the allocation that applies to it (kubeletplugin/shared/shareconfig.py).

    ShareConfigError when our config in `config` cannot be read."""
    return tuple(
        sized(
            share_from_result(r.device, r.share_id, r.consumed_capacity, gpu_memory_mib),
            memory_percent(config, r.request),
            gpu_memory_mib,
        )
        for r in results
    )


def share_limit(rec: PreparedDeviceRecord) -> hamicore.ShareLimit:
    """The limits the container gets for this GPU: the claim's shares of it, added up."""
    memory = sum(s.memory_mib for s in rec.shares)
    cores = min(MAX_CORES, sum(s.cores for s in rec.shares))
    return hamicore.ShareLimit(rec.gpu_index, memory, cores)


def shared_cdi_devices(
    records: Sequence[PreparedDeviceRecord], minors: dict[str, int]
) -> tuple[dict[str, cdi.PreparedShared], list[hamicore.ShareLimit]]:
    """CDI devices (by device name) for the claim's shared records, and their limits.

    `minors` maps device name to the GPU's /dev/nvidia<minor>.
    """
    limits = [share_limit(r) for r in records if r.is_shared]
    env = hamicore.device_env(limits)
    devices = {
        r.device_name: cdi.PreparedShared(r.device_name, r.gpu_uuid, minors[r.device_name], env[r.gpu_index])
        for r in records
        if r.is_shared
    }
    return devices, limits


def shared_usage(claims: Iterable[ClaimCheckpoint]) -> list[SharedGpuUsage]:
    """Per GPU, what the completed claims' shares add up to (for the node metrics)."""
    totals: dict[tuple[int, str], list[int]] = {}
    for claim in claims:
        if claim.state is not ClaimState.PREPARE_COMPLETED:
            continue
        for rec in claim.devices:
            for share in rec.shares:
                t = totals.setdefault((rec.gpu_index, rec.gpu_uuid), [0, 0, 0])
                t[0] += share.shares
                t[1] += share.memory_mib
                t[2] += share.cores
    return [
        SharedGpuUsage(index, uuid, shares, memory, cores)
        for (index, uuid), (shares, memory, cores) in sorted(totals.items())
    ]
