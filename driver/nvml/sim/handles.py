"""Opaque simulator handles, typed exactly like pynvml's (`c_nvmlDevice_t`, `c_nvmlGpuInstance_t`, ...).

A handle is a pynvml pointer type whose address encodes what it refers to; it is never dereferenced.
Encoding identity in the address (instead of keeping a Python-side registry) lets the simulator fill
the ctypes handle arrays that `nvmlDeviceGetGpuInstances` & co. take, just like the real library, and
keeps handles meaningful across calls without any in-memory state. GI/CI/MIG handles carry the
instance's creation serial, so a handle to a destroyed instance stays stale even if its id is reused.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import pynvml


class Kind(IntEnum):
    DEVICE = 1
    GPU_INSTANCE = 2
    COMPUTE_INSTANCE = 3
    MIG_DEVICE = 4
    EVENT_SET = 5


_POINTER_TYPES: dict[Kind, Any] = {
    Kind.DEVICE: pynvml.c_nvmlDevice_t,
    Kind.GPU_INSTANCE: pynvml.c_nvmlGpuInstance_t,
    Kind.COMPUTE_INSTANCE: pynvml.c_nvmlComputeInstance_t,
    Kind.MIG_DEVICE: pynvml.c_nvmlDevice_t,
    Kind.EVENT_SET: pynvml.c_nvmlEventSet_t,
}
_SERIAL_MASK = 0xFFFFFF


@dataclass(frozen=True, slots=True)
class HandleRef:
    kind: Kind
    gpu: int = 0
    gi: int = 0
    ci: int = 0
    serial: int = 0

    def address(self) -> int:
        return (
            (int(self.kind) << 56)
            | (self.gpu << 40)
            | (self.gi << 32)
            | (self.ci << 24)
            | (self.serial & _SERIAL_MASK)
        )

    def matches_serial(self, serial: int) -> bool:
        return self.serial == serial & _SERIAL_MASK


def make(ref: HandleRef) -> Any:
    """A pynvml pointer object of the right type for `ref`."""
    return ctypes.cast(ctypes.c_void_p(ref.address()), _POINTER_TYPES[ref.kind])


def parse(handle: Any, *kinds: Kind) -> HandleRef:
    """Decode a handle made by `make`; INVALID_ARGUMENT for anything else or an unexpected kind."""
    if not isinstance(handle, ctypes._Pointer):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    try:
        kind = Kind(address >> 56)
    except ValueError:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
    if kind not in kinds:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return HandleRef(
        kind=kind,
        gpu=(address >> 40) & 0xFFFF,
        gi=(address >> 32) & 0xFF,
        ci=(address >> 24) & 0xFF,
        serial=address & _SERIAL_MASK,
    )


def out_param(ref: Any) -> Any:
    """The object behind a `byref(x)` / `pointer(x)` output argument, as C would write through it."""
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    target = getattr(ref, "_obj", None)  # ctypes.byref() returns a CArgObject holding the target
    if target is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target
