"""The published device contract: what a node writes into its ResourceSlices and the controller reads.

The node agent builds the devices (kubeletplugin/publish/gpudevices.py, kubeletplugin/shared/device.py); the
controller rebuilds its GPUs from them (controller/state/inventory.py, controller/shared/capacity.py) and writes
CEL selectors and constraints against them (controller/shim/templates.py). Both sides take every
attribute, capacity and counter name from here, so a rename is one edit and cannot leave the two
sides disagreeing. Device names, counter-set names and memory-slice counter names are encoded (and
strictly parsed) in api/constants.py.

Per device kind (attribute names are unqualified; a selector sees them under the driver's domain,
`device.attributes["gpu.flexmig.dev"].<name>`):

- whole GPU `gpu-<i>`: type "gpu", uuid, productName, model, architecture, index, migCapable,
  memorySlices, computeSlices, and on a MIG-capable GPU migModeChangeNeedsReset (plus migMode where
  that is true); capacities memory (Mi) and the engine capacities below; consumes
  every counter of its GPU's counter set when MIG devices are published beside it;
- MIG device `gpu-<i>-mig-...`: type "mig", parentUUID, the common four, profile, giProfileId,
  placementStart, placementSize, memorySlices, computeSlices, gpuMemorySlices, gpuComputeSlices;
  capacities memory (Mi) and engines; consumes its memory slices and its engine counters;
- shared GPU `gpu-<i>-shared` (hami-core nodes): type "hami-core", uuid, the common four,
  splitCount, enforced; consumable capacities memory (Mi), cores (percent of SMs), shares.

Counter set `gpu-<i>-counter-set`: `memory-slice-<k>` = 1 per memory slice, plus one counter per
MIG dimension (`DIMENSIONS`) that some layout of the GPU consumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# --- attribute names --------------------------------------------------------------------------

ATTR_TYPE: Final = "type"
"""Device kind, one of the TYPE_* values; DeviceClasses select on it."""
ATTR_UUID: Final = "uuid"
"""NVML UUID of the GPU (whole and shared devices)."""
ATTR_PARENT_UUID: Final = "parentUUID"
"""NVML UUID of the GPU a MIG device is carved from."""
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_MODEL: Final = "model"
"""The catalog's model key, e.g. "A100-40GB"."""
ATTR_ARCHITECTURE: Final = "architecture"
ATTR_INDEX: Final = "index"
"""The GPU's NVML index on its node."""
ATTR_MIG_CAPABLE: Final = "migCapable"
ATTR_MIG_MODE_CHANGE_NEEDS_RESET: Final = "migModeChangeNeedsReset"
"""Whole GPU, MIG-capable only: switching MIG mode needs a GPU reset (Ampere), so flexmig never does it."""
ATTR_MIG_MODE: Final = "migMode"
"""Whole GPU whose mode change needs a reset: "on"/"off" as read at plugin start. Fixed until a reset
(which needs a plugin restart anyway); Hopper+ switch at prepare, so there it would go stale and is left out."""
MIG_MODE_ON: Final = "on"
MIG_MODE_OFF: Final = "off"
ATTR_MEMORY_SLICES: Final = "memorySlices"
"""Memory slices the device holds (whole GPU: all of them)."""
ATTR_COMPUTE_SLICES: Final = "computeSlices"
ATTR_PROFILE: Final = "profile"
"""NVML MIG profile name, e.g. "1g.10gb+me" (not the encoded form in the device name)."""
ATTR_GI_PROFILE_ID: Final = "giProfileId"
ATTR_PLACEMENT_START: Final = "placementStart"
ATTR_PLACEMENT_SIZE: Final = "placementSize"
ATTR_GPU_MEMORY_SLICES: Final = "gpuMemorySlices"
"""The parent GPU's memory slices, so a selector can ask for "at least p% of the GPU"."""
ATTR_GPU_COMPUTE_SLICES: Final = "gpuComputeSlices"
ATTR_SPLIT_COUNT: Final = "splitCount"
"""Shares a hami-core GPU offers (the node's deviceSplitCount)."""
ATTR_ENFORCED: Final = "enforced"
"""False when HAMi-core cannot enforce a share's limits on that node."""

TYPE_WHOLE_GPU: Final = "gpu"
TYPE_MIG: Final = "mig"
TYPE_SHARED: Final = "hami-core"

# --- capacity names (C identifiers, as the API requires) --------------------------------------

CAP_MEMORY: Final = "memory"
"""MiB quantity ("<n>Mi") on every device kind."""
CAP_MULTIPROCESSORS: Final = "multiprocessors"
CAP_COPY_ENGINES: Final = "copyEngines"
CAP_DECODERS: Final = "decoders"
CAP_ENCODERS: Final = "encoders"
CAP_JPEGS: Final = "jpegs"
CAP_OFAS: Final = "ofas"
CAP_CORES: Final = "cores"
"""Shared GPUs: percent of the SMs a share reserves, 0..100."""
CAP_SHARES: Final = "shares"
"""Shared GPUs: split slots; every allocation consumes exactly one."""

SHARED_CAPACITY_NAMES: Final = (CAP_MEMORY, CAP_CORES, CAP_SHARES)
"""The consumable capacities of a `gpu-<i>-shared` device, in the order messages list them."""


# --- counter names (DNS labels) and the MIG dimensions ----------------------------------------


@dataclass(frozen=True, slots=True)
class Dimension:
    """One thing a MIG instance consumes: its counter name in the counter set and its capacity name."""

    counter: str
    capacity: str


MEMORY_DIMENSION: Final = Dimension("memory", CAP_MEMORY)
"""Memory in MiB: the counter and the capacity are quantities "<n>Mi"."""

DIMENSIONS: Final = (
    MEMORY_DIMENSION,
    Dimension("multiprocessors", CAP_MULTIPROCESSORS),
    Dimension("copy-engines", CAP_COPY_ENGINES),
    Dimension("decoders", CAP_DECODERS),
    Dimension("encoders", CAP_ENCODERS),
    Dimension("jpegs", CAP_JPEGS),
    Dimension("ofas", CAP_OFAS),
)
"""Memory first, then the engines; plain integers except memory."""

ENGINE_CAPACITIES: Final = tuple(d.capacity for d in DIMENSIONS[1:])
"""Capacity names of the engine dimensions, in `DIMENSIONS` order."""


def dimension_quantity(dimension: Dimension, value: int) -> str:
    """A dimension's value as the quantity string a counter or capacity carries."""
    return f"{value}Mi" if dimension == MEMORY_DIMENSION else str(value)
