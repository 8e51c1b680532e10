"""Value types of the NVML port.

Every caller outside `driver/nvml` sees only these types and `NvmlError`, never pynvml's ctypes
structs, so the code above the port is identical on real hardware and on the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


class NvmlErrorCode(IntEnum):
    """NVML return codes (same numbers as `nvml.h` / pynvml `NVML_ERROR_*`)."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    INSUFFICIENT_RESOURCES = 23
    INVALID_STATE = 29
    UNKNOWN = 999

    @classmethod
    def from_int(cls, value: int) -> NvmlErrorCode:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class NvmlError(Exception):
    """An NVML call failed. `function` is the NVML function name, `code` the NVML return code."""

    def __init__(self, function: str, code: NvmlErrorCode, detail: str = "") -> None:
        self.function = function
        self.code = code
        self.detail = detail
        suffix = f": {detail}" if detail else ""
        super().__init__(f"{function} failed with NVML_ERROR_{code.name} ({int(code)}){suffix}")


class Architecture(str, Enum):  # noqa: UP042 - str() must stay the Enum form for existing callers
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    UNKNOWN = "unknown"

    @property
    def mig_toggle_needs_reset(self) -> bool:
        """Ampere keeps a pending MIG mode until a GPU reset; Hopper and newer switch at once."""
        return self in (Architecture.AMPERE, Architecture.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Placement:
    """A GPU-instance placement in memory-slice units: slices [start, start + size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True, slots=True)
class MigMode:
    current: bool
    pending: bool

    @property
    def change_pending(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # exact NVML product name, e.g. "NVIDIA A100-SXM4-40GB"
    memory_total_mib: int
    architecture: Architecture
    pci_device_id: int  # e.g. 0x20B0; 0 when unknown
    minor_number: int
    mig_capable: bool


@dataclass(frozen=True, slots=True)
class GiProfileInfo:
    """One GPU-instance profile as NVML reports it for one GPU."""

    enum_index: int  # NVML_GPU_INSTANCE_PROFILE_* value used to query it
    profile_id: int  # device-specific id (info.id), used by every other call
    compute_slices: int  # info.sliceCount
    memory_slices: int  # placement size in memory slices
    instance_count: int  # info.instanceCount (max instances)
    memory_mib: int  # info.memorySizeMB
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[Placement, ...]  # all possible placements, occupied or not
    nvml_name: str  # info.name as NVML reports it (v2 struct), may be empty on old drivers


@dataclass(frozen=True, slots=True)
class GpuInstance:
    gpu_index: int
    gi_id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    gpu_index: int
    gi_id: int
    ci_id: int
    profile_id: int
    compute_start: int  # CI placement in compute-slice units inside its GI
    compute_size: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device handle's identity (one per compute instance)."""

    gpu_index: int
    gi_id: int
    ci_id: int
    uuid: str  # "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


class HealthEventKind(str, Enum):  # noqa: UP042 - see Architecture
    XID = "xid"
    ECC_DOUBLE_BIT = "ecc-double-bit"
    ECC_SINGLE_BIT = "ecc-single-bit"
    GPU_LOST = "gpu-lost"


@dataclass(frozen=True, slots=True)
class HealthEvent:
    gpu_index: int
    kind: HealthEventKind
    xid: int  # XID number for XID events, 0 otherwise
    gi_id: int | None  # set when the event is scoped to a MIG instance
    ci_id: int | None
