"""NVML's answers as flexmig values: the pure half of the NVML port (driver/nvml/port.py).

Each function turns what a pynvml-like library returned (its ctypes structs and enum codes, the same
for the real `pynvml` and the simulator) into a value type of `driver.nvml.types`, or chooses among
such values. Nothing here calls NVML; the port makes the calls and hands the results in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from driver.nvml.types import (
    Architecture,
    ComputeInstance,
    GiProfileInfo,
    GpuInstance,
    Placement,
)


@dataclass(frozen=True, slots=True)
class CiProfile:
    """The facts of one compute-instance profile inside a GI profile that the port needs."""

    profile_id: int
    slice_count: int
    instance_count: int
    multiprocessors: int


def architecture(lib: Any, code: int) -> Architecture:
    """`nvmlDeviceGetArchitecture`'s code (-1 when unsupported) as an Architecture."""
    names = {
        getattr(lib, "NVML_DEVICE_ARCH_AMPERE", None): Architecture.AMPERE,
        getattr(lib, "NVML_DEVICE_ARCH_HOPPER", None): Architecture.HOPPER,
        getattr(lib, "NVML_DEVICE_ARCH_BLACKWELL", None): Architecture.BLACKWELL,
    }
    return names.get(code, Architecture.UNKNOWN)


def gi_profile_info(enum_index: int, info: Any, placements: tuple[Placement, ...]) -> GiProfileInfo:
    """A `nvmlGpuInstanceProfileInfo_v2` struct and the profile's possible placements."""
    name = info.name
    return GiProfileInfo(
        enum_index=enum_index,
        profile_id=int(info.id),
        compute_slices=int(info.sliceCount),
        memory_slices=placements[0].size if placements else 0,
        instance_count=int(info.instanceCount),
        memory_mib=int(info.memorySizeMB),
        multiprocessors=int(info.multiprocessorCount),
        copy_engines=int(info.copyEngineCount),
        decoders=int(info.decoderCount),
        encoders=int(info.encoderCount),
        jpegs=int(info.jpegCount),
        ofas=int(info.ofaCount),
        placements=placements,
        nvml_name=name.decode() if isinstance(name, bytes) else str(name),
    )


def gpu_instance(index: int, info: Any) -> GpuInstance:
    """A `nvmlGpuInstanceInfo_t` struct of a GI on GPU `index`."""
    placement = Placement(int(info.placement.start), int(info.placement.size))
    return GpuInstance(
        gpu_index=index, gi_id=int(info.id), profile_id=int(info.profileId), placement=placement
    )


def ci_profile(info: Any) -> CiProfile:
    """A `nvmlComputeInstanceProfileInfo_v2` struct."""
    return CiProfile(
        int(info.id), int(info.sliceCount), int(info.instanceCount), int(info.multiprocessorCount)
    )


def compute_instance(index: int, gi_id: int, info: Any) -> ComputeInstance:
    """A `nvmlComputeInstanceInfo_t` struct of a CI in GI `gi_id` on GPU `index`."""
    return ComputeInstance(
        gpu_index=index,
        gi_id=gi_id,
        ci_id=int(info.id),
        profile_id=int(info.profileId),
        compute_start=int(info.placement.start),
        compute_size=int(info.placement.size),
    )


def full_ci_profile(candidates: list[CiProfile], gi_profile: GiProfileInfo) -> CiProfile | None:
    """The CI profile NVML reports as spanning the whole GI.

    Its slice count equals the GI's. More than one can: inside a 1g double-memory GI on Hopper
    (1g.20gb, 1g.24gb) NVML reports the plain 1-slice profile 0 and profile 7 (1_SLICE_REV1), and
    7 is the default, the one holding all of the GI's SMs. So prefer the profile whose SM count is
    the GI's, then the most SMs, then the higher id (the variant over the plain profile).
    """
    full = [p for p in candidates if p.slice_count == gi_profile.compute_slices]
    if not full:
        return None
    return max(
        full,
        key=lambda p: (p.multiprocessors == gi_profile.multiprocessors, p.multiprocessors, p.profile_id),
    )
