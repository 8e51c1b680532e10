"""A claim's allocation, as this node's checkpoint records: what each allocated device name means here.

Pure lookups: the allocator chose the devices, the inventory says which GPU, profile and placement a
name stands for. Results of other drivers are skipped; a result naming another node's pool, a name this
node does not publish, or a MIG or whole-GPU device named by two results is the claim's error. A
result with adminAccess becomes an `admin` record: nothing is created or destroyed for it.
"""

from __future__ import annotations

import dataclasses

import structlog

from api.constants import DRIVER_NAME, DeviceKind
from kubeletplugin.checkpoint.model import PreparedDeviceRecord
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.shared.prepare import shares_of
from kubeletplugin.shared.shareconfig import ShareConfigError

log = structlog.get_logger(__name__)


class UnknownDevices(Exception):
    """The claim names devices this node does not publish, or cannot prepare as allocated (another
    node's pool, or one MIG or whole-GPU device given to two requests)."""


def records_for(view: ClaimView, node: str, inventory: Inventory) -> list[PreparedDeviceRecord]:
    """This node's devices of the claim as (not yet realised) checkpoint records."""
    requests: dict[str, list[str]] = {}
    results: dict[str, list[AllocatedDevice]] = {}
    for result in view.devices:
        if result.driver != DRIVER_NAME:
            continue
        if result.pool != node:
            # Our devices are node-local: a pod here cannot use them, and preparing the rest would
            # start it with fewer devices than its claim holds.
            raise UnknownDevices(
                f"result for request {result.request!r} names device {result.device} in pool "
                f"{result.pool!r}, not this node's pool {node!r}: the allocation is for another node"
            )
        requests.setdefault(result.device, []).append(result.request)
        results.setdefault(result.device, []).append(result)
    unknown = [name for name in requests if inventory.get(name) is None]
    if unknown:
        raise UnknownDevices(
            f"devices {sorted(unknown)} are not published by node {node} (unknown name, filtered GPU"
            " or a MIG mode that does not offer them)"
        )
    twice = sorted(
        name
        for name, rs in results.items()
        if len(rs) > 1 and (nd := inventory.get(name)) is not None and nd.kind is not DeviceKind.SHARED
    )
    if twice:
        # Only a shared GPU may be allocated more than once; two requests given one MIG instance or
        # one whole GPU would share it unknowingly.
        raise UnknownDevices(
            f"devices {twice} are allocated to more than one request of the claim "
            f"({', '.join(f'{n}: {sorted(requests[n])}' for n in twice)}); only a shared GPU may be"
        )
    mixed = sorted(n for n, rs in results.items() if len({r.admin_access for r in rs}) > 1)
    if mixed:
        # Upstream never gives one claim a device twice; held and watched at once would be both.
        raise UnknownDevices(f"devices {mixed} are allocated to this claim both with and without adminAccess")
    records = []
    for name, reqs in requests.items():
        nd = inventory.get(name)
        assert nd is not None
        admin = results[name][0].admin_access
        base = PreparedDeviceRecord(
            # One request may name a shared device more than once (several shares of one GPU).
            request_names=tuple(dict.fromkeys(reqs)),
            pool=node,
            device_name=name,
            gpu_index=nd.gpu.index,
            gpu_uuid=nd.gpu.uuid,
            admin=admin,
        )
        if nd.kind is DeviceKind.MIG:
            assert nd.profile is not None and nd.placement is not None
            # created_gi=True is the ownership intent: see kubeletplugin/prepare/steps.py.
            base = dataclasses.replace(
                base,
                profile=nd.profile.name,
                gi_profile_id=nd.profile.gi_profile_id,
                placement_start=nd.placement.start,
                placement_size=nd.placement.size,
                # An admin record exposes the instance its holder made: never ours to destroy.
                created_gi=not admin,
                created_ci=not admin,
            )
        elif nd.kind is DeviceKind.SHARED and not admin:  # an admin sees the whole GPU, unlimited
            try:
                shares = shares_of(results[name], nd.gpu.memory_total_mib, view.config)
            except ShareConfigError as exc:
                raise UnknownDevices(f"device {name}: {exc}") from None
            base = dataclasses.replace(base, shares=shares)
        records.append(base)
    return records
