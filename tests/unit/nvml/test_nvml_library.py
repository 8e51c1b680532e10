"""The simulated library follows pynvml's own conventions (types, errors, ctypes arguments)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from driver.nvml.sim import SimGpuSpec, SimulatedNvmlLibrary, init_sim_state


@pytest.fixture
def lib(tmp_path: Path) -> Iterator[SimulatedNvmlLibrary]:
    path = tmp_path / "s.json"
    init_sim_state(path, [SimGpuSpec("A100-40GB")])
    library = SimulatedNvmlLibrary(str(path))
    library.nvmlInit()
    yield library
    library.nvmlShutdown()


def test_profile_info_structs_and_enum_end(lib: SimulatedNvmlLibrary) -> None:
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(dev, pynvml.c_nvmlDevice_t)
    info = lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (info.id, info.sliceCount, info.memorySizeMB, info.name) == (9, 3, 19968, "MIG 3g.20gb")
    assert info.version == pynvml.nvmlGpuInstanceProfileInfo_v2
    v1 = lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0, version=1)
    assert isinstance(v1, pynvml.c_nvmlGpuInstanceProfileInfo_t) and v1.id == 19
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoById(dev, 15).sliceCount == 1


def test_possible_placements_count_only_and_small_buffer(lib: SimulatedNvmlLibrary) -> None:
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 19, None, ctypes.byref(count))
    assert count.value == 7
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 3)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        lib.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 19, small, ctypes.byref(count))
    buf = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 9, buf, ctypes.byref(count))
    assert [(buf[i].start, buf[i].size) for i in range(count.value)] == [(0, 4), (4, 4)]


def test_create_with_placement_needs_byref_and_returns_handles(lib: SimulatedNvmlLibrary) -> None:
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, placement)
    gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, ctypes.byref(placement))
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    info = lib.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (1, 9, 4, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, ctypes.byref(placement))
    default = lib.nvmlDeviceCreateGpuInstance(dev, 9)  # default placement takes the free half
    assert lib.nvmlGpuInstanceGetInfo(default).placement.start == 0
    ci = lib.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(ci, pynvml.c_nvmlComputeInstance_t)
    assert lib.nvmlComputeInstanceGetInfo(ci).placement.size == 3
    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    flag = lib.nvmlDeviceIsMigDeviceHandle(mig)
    assert isinstance(flag, ctypes.c_uint) and bool(flag.value)
    assert lib.nvmlDeviceGetUUID(mig).startswith("MIG-")
    parent = lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert lib.nvmlDeviceGetUUID(parent) == lib.nvmlDeviceGetUUID(dev)
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, 7)


def test_stale_handles_are_not_found(lib: SimulatedNvmlLibrary) -> None:
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    gi = lib.nvmlDeviceCreateGpuInstance(dev, 19)
    lib.nvmlGpuInstanceDestroy(gi)
    lib.nvmlDeviceCreateGpuInstance(dev, 19)  # same id, new instance
    with pytest.raises(pynvml.NVMLError_NotFound):
        lib.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlGpuInstanceGetInfo(dev)


def test_get_gpu_instances_buffer_must_fit_instance_count(lib: SimulatedNvmlLibrary) -> None:
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        lib.nvmlDeviceGetGpuInstances(dev, 19, (pynvml.c_nvmlGpuInstance_t * 2)(), ctypes.byref(count))
    buf = (pynvml.c_nvmlGpuInstance_t * 7)()
    lib.nvmlDeviceGetGpuInstances(dev, 19, buf, ctypes.byref(count))
    assert count.value == 0


def test_unimplemented_functions_are_not_forwarded(lib: SimulatedNvmlLibrary) -> None:
    with pytest.raises(AttributeError, match="does not implement"):
        lib.nvmlDeviceGetPowerUsage  # noqa: B018
    assert lib.NVML_DEVICE_MIG_ENABLE == 1
