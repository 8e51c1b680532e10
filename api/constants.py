"""Names shared by every flexmig component, and the device-name encoding of ResourceSlices.

Device names are the join key between the controller's allocations, the published ResourceSlices
and the node's prepare path, so their encoding lives here, in one place, with a strict parser:
anything that is not a name this module would produce is rejected rather than guessed at.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# --- identities -------------------------------------------------------------------------------

DRIVER_NAME = "gpu.flexmig.dev"
"""DRA driver name: ResourceSlice spec.driver, kubelet plugin name, allocation results[].driver."""

ALLOCATION_GATE = "gpu.flexmig.dev/allocation"
"""Scheduling gate the webhook adds to pods whose claims the controller allocates."""

ANNOTATION_EXPECTED_DURATION = "gpu.flexmig.dev/expected-duration"
"""Optional pod annotation: how long the pod is expected to run (`90s`, `45m`, `2h30m`, or plain
seconds). The controller's MIG policy then co-locates pods expected to end together, so that whole
GPUs free up for large requests (controller/allocation/lifetime.py). A bad value is ignored with a
Warning event; it never blocks the pod."""

ANNOTATION_MOVABLE = "gpu.flexmig.dev/movable"
"""Pod annotation, `"true"` or `"false"`: whether the controller may evict the pod so that its
controller (Deployment, Job, ...) recreates it on devices reserved elsewhere, to make room for a pod
that fits nowhere (docs/moves.md). Without it a pod is movable only in a namespace the operator lists
(`--movable-namespaces`); `"false"` opts out even there. Off by default."""

# --- pod annotations (kept from HAMi) ---------------------------------------------------------

ANNOTATION_MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
"""Mirror of the realised MIG allocations of a pod; informational, never the source of truth."""

ANNOTATION_VGPU_MODE = "nvidia.com/vgpu-mode"
"""Per-pod sharing mode request: VGPU_MODE_MIG or VGPU_MODE_HAMI_CORE."""

VGPU_MODE_MIG = "mig"
VGPU_MODE_HAMI_CORE = "hami-core"

# --- extended resource names (kept from HAMi, served through the compatibility shim) ------------

RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_GPUMEM = "nvidia.com/gpumem"
RESOURCE_GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
RESOURCE_GPUCORES = "nvidia.com/gpucores"

# --- metrics ----------------------------------------------------------------------------------

DEFAULT_NODE_METRICS_PORT = 31992
"""Node agent metrics (hami_mig_device_info) and liveness."""

DEFAULT_CONTROLLER_METRICS_PORT = 31993
"""Controller metrics (hami_node_gpu_mig_instance_info)."""

# --- device-name encoding ---------------------------------------------------------------------

DNS_LABEL_MAX = 63
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
# Canonical non-negative decimal: no sign, no leading zeros, so that parse(format(x)) == x and
# format(parse(s)) == s both hold.
_UINT = r"(?:0|[1-9][0-9]*)"
_WHOLE_RE = re.compile(rf"gpu-(?P<gpu>{_UINT})")
_SHARED_RE = re.compile(rf"gpu-(?P<gpu>{_UINT})-shared")
_MIG_RE = re.compile(
    rf"gpu-(?P<gpu>{_UINT})-mig-(?P<profile>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<gi>{_UINT})-(?P<start>{_UINT})"
)
# NVML profile names look like "1g.5gb", "1c.2g.10gb", "1g.10gb+me", "1g.24gb+me.all", "1g.24gb-me".
_PROFILE_RE = re.compile(r"[a-z0-9]+(?:[.+-][a-z0-9]+)*")


class DeviceKind(enum.StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    SHARED = "shared"
    """A whole GPU shared through HAMi-core (allowMultipleAllocations), on hami-core nodes."""


@dataclass(frozen=True, slots=True)
class DeviceName:
    """A parsed flexmig device name. The MIG fields are None for a whole or shared GPU."""

    kind: DeviceKind
    gpu_index: int
    profile: str | None = None
    """The encoded profile (dots removed, '+' as 'plus'), e.g. "1g10gbplusme"."""
    gi_profile_id: int | None = None
    start: int | None = None

    def __str__(self) -> str:
        if self.kind is DeviceKind.WHOLE:
            return whole_gpu_device_name(self.gpu_index)
        if self.kind is DeviceKind.SHARED:
            return shared_gpu_device_name(self.gpu_index)
        if self.profile is None or self.gi_profile_id is None or self.start is None:
            raise ValueError(f"incomplete MIG device name: {self!r}")
        return _join_mig(self.gpu_index, self.profile, self.gi_profile_id, self.start)


def is_dns_label(name: str) -> bool:
    """RFC 1123 label, as Kubernetes validates ResourceSlice device and counter names."""
    return len(name) <= DNS_LABEL_MAX and _DNS_LABEL_RE.fullmatch(name) is not None


def _check_index(what: str, value: int) -> None:
    # bool is an int subclass; True as a GPU index is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")


def _checked(name: str) -> str:
    if not is_dns_label(name):
        raise ValueError(f"{name!r} is not a valid DNS label (<= {DNS_LABEL_MAX} chars of [a-z0-9-])")
    return name


def encode_profile_name(profile_name: str) -> str:
    """NVML MIG profile name -> the form used in device names: dots dropped, '+' spelled 'plus'.

    "1g.5gb" -> "1g5gb", "1g.10gb+me" -> "1g10gbplusme", "1g.24gb-me" -> "1g24gb-me".
    An already encoded name is returned unchanged. Upper case is rejected rather than folded so
    that two distinct NVML names can never map to the same device name.
    """
    if _PROFILE_RE.fullmatch(profile_name) is None:
        raise ValueError(f"{profile_name!r} is not a MIG profile name")
    return profile_name.replace(".", "").replace("+", "plus")


def whole_gpu_device_name(gpu_index: int) -> str:
    """The whole-GPU device: gpu-<i>."""
    _check_index("gpu_index", gpu_index)
    return _checked(f"gpu-{gpu_index}")


def shared_gpu_device_name(gpu_index: int) -> str:
    """The HAMi-core shareable device of a GPU on a hami-core node: gpu-<i>-shared."""
    _check_index("gpu_index", gpu_index)
    return _checked(f"gpu-{gpu_index}-shared")


def counter_set_name(gpu_index: int) -> str:
    """The KEP-4815 counter set of one GPU: gpu-<i>-counter-set."""
    _check_index("gpu_index", gpu_index)
    return _checked(f"gpu-{gpu_index}-counter-set")


MEMORY_SLICE_COUNTER_PREFIX = "memory-slice-"
"""Every memory-slice counter name starts with this; the other counters of a set never do."""


def memory_slice_counter_name(slice_index: int) -> str:
    """The counter of one MIG memory slice within a GPU's counter set: memory-slice-<k>."""
    _check_index("slice_index", slice_index)
    return _checked(f"{MEMORY_SLICE_COUNTER_PREFIX}{slice_index}")


def _join_mig(gpu_index: int, encoded_profile: str, gi_profile_id: int, start: int) -> str:
    return _checked(f"gpu-{gpu_index}-mig-{encoded_profile}-{gi_profile_id}-{start}")


def mig_device_name(gpu_index: int, profile_name: str, gi_profile_id: int, start: int) -> str:
    """A MIG device: gpu-<i>-mig-<encoded profile>-<GI profile id>-<placement start>.

    >>> mig_device_name(0, "1g.5gb", 19, 3)
    'gpu-0-mig-1g5gb-19-3'
    >>> mig_device_name(2, "1g.10gb+me", 20, 0)
    'gpu-2-mig-1g10gbplusme-20-0'

    The GI profile id and the start are part of the name because a profile name alone does not
    identify a placement, and the same name can exist under two profile ids on one GPU family.
    """
    _check_index("gpu_index", gpu_index)
    _check_index("gi_profile_id", gi_profile_id)
    _check_index("start", start)
    return _join_mig(gpu_index, encode_profile_name(profile_name), gi_profile_id, start)


def parse_device_name(name: str) -> DeviceName:
    """Parse a whole-GPU, shared-GPU or MIG device name; ValueError for anything else (counter sets
    included)."""
    if not isinstance(name, str) or not is_dns_label(name):
        raise ValueError(f"{name!r} is not a flexmig device name")
    m = _WHOLE_RE.fullmatch(name)
    if m is not None:
        return DeviceName(kind=DeviceKind.WHOLE, gpu_index=int(m["gpu"]))
    m = _SHARED_RE.fullmatch(name)
    if m is not None:
        return DeviceName(kind=DeviceKind.SHARED, gpu_index=int(m["gpu"]))
    # The profile group is non-greedy and the last two groups are anchored at the end, so an
    # encoded profile containing '-' ("1g24gb-me") or digit segments still splits unambiguously:
    # the GI profile id and the start are always the final two segments.
    m = _MIG_RE.fullmatch(name)
    if m is not None:
        return DeviceName(
            kind=DeviceKind.MIG,
            gpu_index=int(m["gpu"]),
            profile=m["profile"],
            gi_profile_id=int(m["gi"]),
            start=int(m["start"]),
        )
    raise ValueError(f"{name!r} is not a flexmig device name")
