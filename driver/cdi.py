"""CDI (Container Device Interface) specs for prepared claims.

One transient spec file per claim, `gpu.flexmig.dev-<claim uid>.json`, kind `gpu.flexmig.dev/mig`,
one CDI device per prepared device named `<claim uid>-<DRA device name>`, so the id handed to kubelet
is `gpu.flexmig.dev/mig=<claim uid>-<device name>`. Whole-GPU devices of a claim sit in the same file
and therefore under the same kind: a CDI spec file carries exactly one kind, and keeping one file per
claim makes unprepare a single unlink.

cdiVersion is "0.6.0": the oldest version that allows spec/device annotations (we record the claim
uid there) and device-node host paths, understood by every containerd (>=1.7) and CRI-O with CDI. We use
nothing newer (no intelRdt, additionalGIDs, netDevices).

What a CUDA container needs, in both runtime set-ups:
- CDI (containerd/CRI-O inject the spec): per device, `/dev/nvidia<N>` and, for a MIG device, its GI and
  CI capability nodes; once per claim (spec-level containerEdits) `/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools`, the driver's libraries and binaries bind-mounted read-only, and
  createContainer hooks (`nvidia-cdi-hook create-symlinks` / `update-ldcache`) when the hook is
  installed. Device nodes are complete (type, major, minor, host path: `driver.cdi_host`) so the runtime
  creates them without stat-ing the host.
- the legacy NVIDIA runtime reads only `NVIDIA_VISIBLE_DEVICES` from each container's environment.

A claim of HAMi-core shared GPUs (`PreparedShared`) gets each GPU as a whole-GPU device plus its
per-device HAMi-core limits, and more spec-level containerEdits (built by `driver.hamicore`): the
shared-region cache, the library mount and its preload.

Everything here is pure except `write_spec_atomically`, `remove_spec` and `read_mig_minors`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.atomicfile import fsync_dir, write_atomically
from driver.cdi_host import DeviceNode, DeviceTable, DriverFiles

CDI_VERSION = "0.6.0"
CDI_VENDOR = "gpu.flexmig.dev"
CDI_CLASS = "mig"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
CLAIM_ANNOTATION = "gpu.flexmig.dev/claim-uid"

# Kubernetes UIDs are RFC 4122 UUIDs; we accept any DNS-label-like token so test UIDs work, but never
# '/', '.', or anything that could escape the CDI directory or break the CDI device-name grammar.
_CLAIM_UID_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_DEVICE_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # DRA device names are DNS labels
_UUID_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9-]+$")
_MINORS_LINE_RE = re.compile(r"^(\S+)\s+(\d+)$")

# The nvidia-caps kernel module reserves minors in a fixed order (see `mig_cap_minor`).
_CAP_FIRST_GI_MINOR = 3  # minors 1 and 2 are "config" and "monitor"
_CIS_PER_GI = 8  # ci0..ci7
_GIS_PER_GPU = 15  # gi0..gi14
_MINORS_PER_GI = 1 + _CIS_PER_GI
_MINORS_PER_GPU = _GIS_PER_GPU * _MINORS_PER_GI


@dataclass(frozen=True, slots=True)
class PreparedGpu:
    """A whole GPU handed to a container."""

    device_name: str  # DRA device name, e.g. "gpu-0"
    gpu_uuid: str
    gpu_minor: int  # /dev/nvidia<minor>


@dataclass(frozen=True, slots=True)
class PreparedMig:
    """A MIG instance created for a claim."""

    device_name: str  # DRA device name, e.g. "gpu-0-mig-1g5gb-19-3"
    parent_uuid: str
    gpu_minor: int  # the parent's /dev/nvidia<minor>, also the `gpu<N>` key in mig-minors
    gi_id: int
    ci_id: int
    mig_uuid: str


@dataclass(frozen=True, slots=True)
class PreparedShared:
    """A whole GPU shared through HAMi-core: the GPU's nodes plus its limit variables."""

    device_name: str  # DRA device name, e.g. "gpu-0-shared"
    gpu_uuid: str
    gpu_minor: int
    env: tuple[str, ...]  # CUDA_DEVICE_MEMORY_LIMIT_<k>=..., CUDA_DEVICE_SM_LIMIT_<k>=...


PreparedDevice = PreparedGpu | PreparedMig | PreparedShared


def validate_claim_uid(claim_uid: str) -> None:
    if not isinstance(claim_uid, str) or not _CLAIM_UID_RE.match(claim_uid):
        raise ValueError(
            f"claim_uid {claim_uid!r} is invalid: need 1-63 letters, digits or '-', starting and ending"
            " with a letter or digit"
        )


def _validate_device_name(device_name: str) -> None:
    if not isinstance(device_name, str) or not _DEVICE_NAME_RE.match(device_name):
        raise ValueError(f"device_name {device_name!r} is invalid: must be a DNS label")


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    """The CDI device name inside the claim's spec."""
    validate_claim_uid(claim_uid)
    _validate_device_name(device_name)
    return f"{claim_uid}-{device_name}"


def qualified_device_id(claim_uid: str, device_name: str) -> str:
    """Fully qualified CDI id kubelet passes to the runtime: `gpu.flexmig.dev/mig=<uid>-<device>`."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid, device_name)}"


def spec_file_name(claim_uid: str) -> str:
    validate_claim_uid(claim_uid)
    return f"{CDI_VENDOR}-{claim_uid}.json"


# --- MIG capability minors -------------------------------------------------------------------------


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse `/proc/driver/nvidia-caps/mig-minors`: lines `<cap path> <minor>`.

    Keys are kept verbatim (`config`, `monitor`, `gpu0/gi1/access`, `gpu0/gi1/ci0/access`). Lines that do
    not match the format are skipped, as nvidia-container-toolkit does, because the kernel may add new
    capability kinds we do not need.
    """
    minors: dict[str, int] = {}
    for raw_line in text.splitlines():
        m = _MINORS_LINE_RE.match(raw_line.strip())
        if m:
            minors[m.group(1)] = int(m.group(2))
    return minors


def read_mig_minors(path: str | os.PathLike[str] = DEFAULT_MIG_MINORS_PATH) -> dict[str, int] | None:
    """The parsed minors table, or None when the file does not exist (no nvidia-caps: the simulator)."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    return parse_mig_minors(text)


def mig_cap_minor(gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """The nvidia-caps minor of a GI (ci_id None) or CI access capability, by the kernel's fixed layout.

    The kernel enumerates `config`=1, `monitor`=2, then for every GPU minor 0..31, GI 0..14: the GI access
    cap followed by CI 0..7 access caps. NVIDIA's documented samples pin it: gpu0/gi0/access=3,
    gpu0/gi0/ci0/access=4, gpu3/gi3/ci3/access=439, gpu6/gi11/ci7/access=920, gpu31/gi14/ci7/access=4322.
    We only fall back to this when the table file is absent (simulator); a real node's file is authoritative.
    """
    if gpu_minor < 0 or not 0 <= gi_id < _GIS_PER_GPU:
        raise ValueError(f"gi_id {gi_id} (gpu minor {gpu_minor}) outside the nvidia-caps range 0..14")
    base = _CAP_FIRST_GI_MINOR + gpu_minor * _MINORS_PER_GPU + gi_id * _MINORS_PER_GI
    if ci_id is None:
        return base
    if not 0 <= ci_id < _CIS_PER_GI:
        raise ValueError(f"ci_id {ci_id} outside the nvidia-caps range 0..7")
    return base + 1 + ci_id


def mig_cap_minors(
    gpu_minor: int, gi_id: int, ci_id: int, minors: Mapping[str, int] | None
) -> tuple[int, int]:
    """The nvidia-caps minors of the GI and the CI access capabilities.

    With a minors table (real node) a missing entry is an error: guessing would hand the container the
    wrong instance. Without one, the kernel formula is used.
    """
    gi_key = f"gpu{gpu_minor}/gi{gi_id}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"
    if minors is None:
        return mig_cap_minor(gpu_minor, gi_id), mig_cap_minor(gpu_minor, gi_id, ci_id)
    missing = [k for k in (gi_key, ci_key) if k not in minors]
    if missing:
        raise ValueError(f"mig-minors table has no entry for {', '.join(missing)}")
    return minors[gi_key], minors[ci_key]


def cap_path(minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


def mig_cap_device_nodes(
    gpu_minor: int, gi_id: int, ci_id: int, minors: Mapping[str, int] | None
) -> tuple[str, str]:
    """`/dev/nvidia-caps/nvidia-cap<N>` for the GI and the CI access capabilities."""
    gi_minor, ci_minor = mig_cap_minors(gpu_minor, gi_id, ci_id, minors)
    return cap_path(gi_minor), cap_path(ci_minor)


# --- spec building ---------------------------------------------------------------------------------

CONTROL_NODES = ("/dev/nvidiactl",)
UVM_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True, slots=True)
class SpecHost:
    """The host facts a spec is built from: device numbers and the driver's files."""

    devices: DeviceTable = field(default_factory=DeviceTable)
    driver: DriverFiles = field(default_factory=DriverFiles)


def _check_gpu_minor(gpu_minor: int) -> None:
    if isinstance(gpu_minor, bool) or not isinstance(gpu_minor, int) or gpu_minor < 0:
        raise ValueError(f"gpu_minor must be a non-negative integer, got {gpu_minor!r}")


def _required_node(table: DeviceTable, path: str) -> DeviceNode:
    node = table.node(path)
    if node is None:  # only for numbers that come from /proc/devices
        raise ValueError(
            f"device node {path}: nothing at {table.local_path(path)} (host {table.host_path(path)}) and its"
            " driver is not loaded"
        )
    return node


def _check_uuid(field_name: str, value: str, prefix: str) -> None:
    if not isinstance(value, str) or not _UUID_RE.match(value) or not value.startswith(prefix):
        raise ValueError(f"{field_name} {value!r} is invalid: expected '{prefix}<uuid>'")


def _visible_uuid(dev: PreparedDevice) -> str:
    return dev.mig_uuid if isinstance(dev, PreparedMig) else dev.gpu_uuid


def device_nodes(
    dev: PreparedDevice, minors: Mapping[str, int] | None, table: DeviceTable
) -> list[DeviceNode]:
    """The nodes only this device brings: its GPU and, for a MIG device, its GI/CI capabilities."""
    _check_gpu_minor(dev.gpu_minor)
    nodes = [_required_node(table, f"/dev/nvidia{dev.gpu_minor}")]
    if isinstance(dev, PreparedMig):
        caps = [table.node(cap_path(m)) for m in mig_cap_minors(dev.gpu_minor, dev.gi_id, dev.ci_id, minors)]
        if all(c is not None for c in caps):
            nodes += [c for c in caps if c is not None]
        elif table.strict:
            raise ValueError(
                f"MIG device {dev.device_name}: nvidia-caps is not registered in /proc/devices and its"
                f" capability nodes are missing under {table.local_dev_root or table.dev_root}: a container"
                " could not use the instance"
            )
    return nodes


def _device_edits(
    dev: PreparedDevice, minors: Mapping[str, int] | None, visible: str, table: DeviceTable
) -> dict[str, Any]:
    if isinstance(dev, PreparedMig):
        _check_uuid("mig_uuid", dev.mig_uuid, "MIG-")
        _check_uuid("parent_uuid", dev.parent_uuid, "GPU-")
    else:
        _check_uuid("gpu_uuid", dev.gpu_uuid, "GPU-")
    extra = list(dev.env) if isinstance(dev, PreparedShared) else []
    for item in extra:
        if "=" not in item or not item.split("=", 1)[0]:
            raise ValueError(f"env entry {item!r} of {dev.device_name} is not NAME=value")
    return {
        "env": [f"NVIDIA_VISIBLE_DEVICES={visible}", *extra],
        "deviceNodes": [n.entry() for n in device_nodes(dev, minors, table)],
    }


def common_edits(host: SpecHost) -> dict[str, Any]:
    """What every container given any device of the claim needs once: control/UVM nodes, driver files."""
    nodes = [_required_node(host.devices, p) for p in CONTROL_NODES]
    # UVM is loaded on demand on some nodes: a node whose driver is not loaded is left out, as the NVIDIA
    # Container Toolkit's spec generator does; CUDA then fails in the container until it is loaded.
    nodes += [n for n in (host.devices.node(p) for p in UVM_NODES) if n is not None]
    edits: dict[str, Any] = {"deviceNodes": [n.entry() for n in nodes]}
    if mounts := host.driver.mount_entries():
        edits["mounts"] = mounts
    if hooks := host.driver.hook_entries():
        edits["hooks"] = hooks
    return edits


def _merge_edits(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = [*out.get(key, []), *value] if isinstance(value, list) else value
    return out


def build_claim_spec(
    claim_uid: str,
    devices: Sequence[PreparedDevice],
    mig_minors: Mapping[str, int] | None = None,
    spec_edits: Mapping[str, Any] | None = None,
    host: SpecHost | None = None,
) -> dict[str, Any]:
    """The CDI spec (JSON-ready dict) for one claim's prepared devices.

    `mig_minors` is the parsed mig-minors table, or None to use the kernel formula (simulator).
    `spec_edits` are HAMi-core's spec-level containerEdits (claims with shared GPUs only), added to the
    common edits every container of the claim gets once. `host` supplies device numbers and driver files
    (default: this host's /dev, no driver files).
    """
    validate_claim_uid(claim_uid)
    if not devices:
        raise ValueError("devices must not be empty: a claim with nothing prepared needs no CDI spec")
    names = [d.device_name for d in devices]
    if len(set(names)) != len(names):
        raise ValueError(f"devices contain duplicate device_name entries: {sorted(names)}")
    if spec_edits and not any(isinstance(d, PreparedShared) for d in devices):
        raise ValueError("spec-level containerEdits are only for claims with shared GPUs")
    host = host or SpecHost()
    # A runtime merging two devices' edits keeps only the last value of an env var, so a container given
    # two devices of one claim (nvidia.com/gpu: 2 through the shim) would see one GPU. Every device of
    # the claim therefore carries the same variable: the claim's UUIDs in device order. Device nodes stay
    # per device, so a container given only some of the claim's devices can still open only those.
    visible = ",".join(_visible_uuid(d) for d in devices)
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {CLAIM_ANNOTATION: claim_uid},
        "devices": [
            {
                "name": cdi_device_name(claim_uid, d.device_name),
                "containerEdits": _device_edits(d, mig_minors, visible, host.devices),
            }
            for d in devices
        ],
        "containerEdits": _merge_edits(common_edits(host), spec_edits or {}),
    }
    return spec


# --- files -----------------------------------------------------------------------------------------


def write_spec_atomically(
    cdi_dir: str | os.PathLike[str], claim_uid: str, spec: Mapping[str, Any], *, durable: bool = True
) -> Path:
    """Write the spec so a runtime reading the directory sees the old file, the new one, or none.

    The temp file is a dot-file without the `.json` suffix so CDI registries (which load `*.json` and
    `*.yaml`) never pick up a half-written spec; the rename is atomic within the directory. `durable`
    fsyncs the file and then the directory, so the spec survives a power loss too; without it a
    killed process still leaves the old spec or the whole new one (the page cache survives it).
    """
    directory = Path(cdi_dir)
    target = directory / spec_file_name(claim_uid)
    directory.mkdir(parents=True, exist_ok=True)
    # Compact: the C encoder serves only unindented output, and this runs for every prepared claim.
    data = json.dumps(spec, sort_keys=True).encode() + b"\n"
    # 0644: runtimes may read specs as a different user than the plugin.
    return write_atomically(target, data, durable=durable, mode=0o644)


def remove_spec(cdi_dir: str | os.PathLike[str], claim_uid: str) -> bool:
    """Delete the claim's spec. Returns False when it was already gone (unprepare must be idempotent)."""
    directory = Path(cdi_dir)
    try:
        (directory / spec_file_name(claim_uid)).unlink()
    except FileNotFoundError:
        return False
    fsync_dir(directory)
    return True
