"""The one device a hami-core node publishes per GPU: `gpu-<i>-shared` (contract C1,
docs/architecture.md). Pure: no I/O.

The GPU is shared by HAMi-core (memory and SM limits enforced inside each container), so the device
allows multiple allocations and offers three consumable capacities:

- `memory` (MiB): a share asks for what it may allocate; by default the whole GPU's memory;
- `cores` (percent of the SMs, 0..100): 0, the default, asks for no compute reservation (HAMi's
  `gpucores` absent), so no SM limit is set in the container;
- `shares`: the node's device split count; every allocation consumes exactly one, which caps how many
  containers share the GPU as HAMi's `deviceSplitCount` does.

No counters: nothing else is published for a GPU of a hami-core node (no MIG device, no whole GPU), so
there is nothing to keep mutually exclusive.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from api import devicecontract as dc
from api.constants import shared_gpu_device_name
from driver.catalog.types import GpuCatalog
from kubeletplugin.publish.slicelimits import MAX_ATTRIBUTE_STRING_LENGTH

MAX_CORES = 100


class ShareEnforcement(enum.StrEnum):
    """Whether a share published on this node is enforced (the `enforced` attribute of the device)."""

    ENFORCED = "enforced"  # the HAMi-core library is usable
    UNENFORCED = "unenforced"  # library missing, admin allowed publishing: limits are advisory only
    REFUSED = "refused"  # library missing, shares withheld (the default)


def shared_gpu_device(
    catalog: GpuCatalog,
    split_count: int,
    common_attributes: Mapping[str, Any],
    *,
    enforced: bool = True,
    memory_scaling: float = 1.0,
    core_scaling: float = 1.0,
) -> dict[str, Any]:
    """The ResourceSlice device (camelCase dict) for one GPU shared through HAMi-core. `enforced` false
    marks a share whose limits HAMi-core cannot enforce; a selector can refuse such a device with
    `device.attributes["gpu.flexmig.dev"].enforced`."""
    if isinstance(split_count, bool) or not isinstance(split_count, int) or split_count < 1:
        raise ValueError(f"split_count must be an integer >= 1, got {split_count!r}")
    if not (0 < memory_scaling <= 1 and 0 < core_scaling <= 1):
        raise ValueError(f"scalings must be in (0, 1], got {memory_scaling!r}, {core_scaling!r}")
    gpu = catalog.gpu
    # HAMi's deviceMemoryScaling / deviceCoreScaling: what the shares of this GPU may hold together.
    total = f"{max(1, int(gpu.memory_total_mib * memory_scaling))}Mi"
    max_cores = str(max(1, int(MAX_CORES * core_scaling)))
    return {
        "name": shared_gpu_device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": {
            dc.ATTR_TYPE: {"string": dc.TYPE_SHARED},  # DeviceClass hami-core.gpu.flexmig.dev selects on it
            dc.ATTR_UUID: {"string": gpu.uuid[:MAX_ATTRIBUTE_STRING_LENGTH]},
            **common_attributes,
            dc.ATTR_SPLIT_COUNT: {"int": split_count},
            dc.ATTR_ENFORCED: {"bool": enforced},
        },
        "capacity": {
            dc.CAP_MEMORY: {
                "value": total,
                "requestPolicy": {"default": total, "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            dc.CAP_CORES: {
                "value": max_cores,
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": max_cores, "step": "1"},
                },
            },
            dc.CAP_SHARES: {
                "value": str(split_count),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }


def shared_decision(catalog: GpuCatalog, mig_enabled: bool, filtered: bool) -> tuple[bool, str]:
    """(publish `gpu-<i>-shared`, reason) for one GPU of a hami-core node."""
    if filtered:
        return False, "excluded by filterdevices"
    if mig_enabled:
        # HAMi-core needs the whole GPU; flexmig never switches MIG mode on a hami-core node (an
        # administrator may have set it for another purpose), so the GPU is left out, visibly.
        return False, (
            "MIG mode is on: a HAMi-core share needs MIG off, and flexmig does not change MIG mode on"
            " hami-core nodes (disable MIG and restart the plugin to share this GPU)"
        )
    return True, "shared through HAMi-core"
