"""`Nvml`: the one NVML interface the rest of flexmig uses.

It drives a pynvml-like library object — the real `pynvml` module or the simulator's
`SimulatedNvmlLibrary` — through exactly the same calls and ctypes conventions, and turns the results
into the value types of `driver.nvml.types` (the pure conversions are driver/nvml/decode.py). Every
`NVMLError` becomes `NvmlError(function, code)`. Health events come from the event set of
driver/nvml/healthevents.py.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from driver.nvml import decode
from driver.nvml.decode import CiProfile
from driver.nvml.healthevents import HealthEventWatch
from driver.nvml.types import (
    ComputeInstance,
    GiProfileInfo,
    GpuInfo,
    GpuInstance,
    HealthEvent,
    MigDevice,
    MigMode,
    NvmlError,
    NvmlErrorCode,
    Placement,
)

_SKIP_PROFILE = (NvmlErrorCode.NOT_SUPPORTED, NvmlErrorCode.INVALID_ARGUMENT)
_EMPTY_MIG_INDEX = (NvmlErrorCode.NOT_FOUND, NvmlErrorCode.INVALID_ARGUMENT)


class Nvml:
    """Narrow NVML port over a pynvml-compatible `lib` (real module or simulator)."""

    def __init__(self, lib: Any, *, description: str = "") -> None:
        self._lib = lib
        self.description = description
        self._profiles: dict[int, list[GiProfileInfo]] = {}
        # CI profile facts are fixed per (GPU, GI profile); querying all of them costs one NVML call
        # per CI profile, on every CI create, so they are read once.
        self._ci_profile_cache: dict[tuple[int, int], list[CiProfile]] = {}
        # A device handle is valid from nvmlInit to nvmlShutdown; a prepare looked each GPU's handle up
        # about a dozen times (a quarter of its NVML calls), so it is looked up once per init.
        self._handles: dict[int, Any] = {}
        self._health = HealthEventWatch(lib, self._call, self._handle)

    # -- plumbing -----------------------------------------------------------------------------------

    def _call(self, function: str, *args: Any) -> Any:
        fn: Callable[..., Any] = getattr(self._lib, function)
        try:
            return fn(*args)
        except self._lib.NVMLError as exc:
            raise NvmlError(function, NvmlErrorCode.from_int(int(exc.value)), str(exc)) from exc

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return handle

    def _gi_handle(self, index: int, gi_id: int) -> Any:
        return self._call("nvmlDeviceGetGpuInstanceById", self._handle(index), gi_id)

    # -- lifetime -----------------------------------------------------------------------------------

    def init(self) -> None:
        self._handles.clear()
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._handles.clear()
        try:
            self._health.close()
        finally:
            self._call("nvmlShutdown")

    def __enter__(self) -> Nvml:
        self.init()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # -- GPUs -------------------------------------------------------------------------------------------

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def gpu(self, index: int) -> GpuInfo:
        h = self._handle(index)
        memory = self._call("nvmlDeviceGetMemoryInfo", h)
        pci = self._call("nvmlDeviceGetPciInfo", h)
        try:
            arch_code = int(self._call("nvmlDeviceGetArchitecture", h))
        except NvmlError as exc:
            if exc.code is not NvmlErrorCode.NOT_SUPPORTED:
                raise
            arch_code = -1
        return GpuInfo(
            index=index,
            uuid=str(self._call("nvmlDeviceGetUUID", h)),
            name=str(self._call("nvmlDeviceGetName", h)),
            memory_total_mib=int(memory.total) // (1024 * 1024),
            architecture=decode.architecture(self._lib, arch_code),
            pci_device_id=int(pci.pciDeviceId) >> 16,  # pciDeviceId = device id << 16 | vendor id
            minor_number=int(self._call("nvmlDeviceGetMinorNumber", h)),
            mig_capable=self._mig_mode_or_none(h) is not None,
        )

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.device_count())]

    # -- MIG mode -------------------------------------------------------------------------------------

    def _mig_mode_or_none(self, handle: Any) -> MigMode | None:
        try:
            current, pending = self._call("nvmlDeviceGetMigMode", handle)
        except NvmlError as exc:
            if exc.code is NvmlErrorCode.NOT_SUPPORTED:
                return None
            raise
        return MigMode(current=bool(current), pending=bool(pending))

    def mig_mode(self, index: int) -> MigMode:
        """Current and pending MIG mode; NvmlError(NOT_SUPPORTED) on GPUs without MIG."""
        current, pending = self._call("nvmlDeviceGetMigMode", self._handle(index))
        return MigMode(current=bool(current), pending=bool(pending))

    def set_mig_mode(self, index: int, enabled: bool) -> NvmlErrorCode | None:
        """Request a MIG mode; returns None on success, else the activation failure (not raised)."""
        mode = self._lib.NVML_DEVICE_MIG_ENABLE if enabled else self._lib.NVML_DEVICE_MIG_DISABLE
        status = int(self._call("nvmlDeviceSetMigMode", self._handle(index), mode))
        self._profiles.pop(index, None)  # profile info is only stable for the lifetime of a MIG mode
        return None if status == 0 else NvmlErrorCode.from_int(status)

    # -- GPU-instance profiles ------------------------------------------------------------------------

    def _placements(self, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        fn = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        self._call(fn, handle, profile_id, None, ctypes.byref(count))
        buffer = (self._lib.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(fn, handle, profile_id, buffer, ctypes.byref(count))
        return tuple(Placement(int(buffer[i].start), int(buffer[i].size)) for i in range(count.value))

    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        """Every GI profile the GPU supports, with all its possible placements."""
        cached = self._profiles.get(index)
        if cached is not None:
            return list(cached)
        h = self._handle(index)
        profiles: list[GiProfileInfo] = []
        for enum_index in range(int(self._lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, enum_index, 2)
            except NvmlError as exc:
                if exc.code in _SKIP_PROFILE:
                    continue
                raise
            placements = self._placements(h, int(info.id))
            profiles.append(decode.gi_profile_info(enum_index, info, placements))
        if profiles:  # an empty answer may only mean MIG is off; ask again next time
            self._profiles[index] = profiles
        return list(profiles)

    def gi_profile_by_id(self, index: int, profile_id: int) -> GiProfileInfo:
        for profile in self.gi_profiles(index):
            if profile.profile_id == profile_id:
                return profile
        # Let NVML produce its own verdict for an id the enumeration did not yield.
        self._call("nvmlDeviceGetGpuInstanceProfileInfoById", self._handle(index), profile_id)
        raise NvmlError("nvmlDeviceGetGpuInstanceProfileInfoById", NvmlErrorCode.NOT_SUPPORTED)

    def gi_remaining_capacity(self, index: int, profile_id: int) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceRemainingCapacity", self._handle(index), profile_id))

    # -- GPU instances ----------------------------------------------------------------------------------

    def _gi_value(self, index: int, gi_handle: Any) -> GpuInstance:
        return decode.gpu_instance(index, self._call("nvmlGpuInstanceGetInfo", gi_handle))

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        """Create a GI of `profile_id` at memory slice `start` (always with an explicit placement)."""
        profile = self.gi_profile_by_id(index, profile_id)
        placement = self._lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, profile.memory_slices
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            self._handle(index),
            profile_id,
            ctypes.byref(placement),
        )
        return self._gi_value(index, gi)

    def _gi_handles(self, index: int, profile: GiProfileInfo) -> Iterator[Any]:
        buffer = (self._lib.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
        count = ctypes.c_uint(0)
        self._call(
            "nvmlDeviceGetGpuInstances", self._handle(index), profile.profile_id, buffer, ctypes.byref(count)
        )
        return (buffer[i] for i in range(count.value))

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        """All GIs on the GPU (empty when MIG is off)."""
        mode = self._mig_mode_or_none(self._handle(index))
        if mode is None or not mode.current:
            return []
        found = [
            self._gi_value(index, h)
            for profile in self.gi_profiles(index)
            for h in self._gi_handles(index, profile)
        ]
        return sorted(found, key=lambda gi: gi.gi_id)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call("nvmlGpuInstanceDestroy", self._gi_handle(index, gi_id))

    # -- compute instances ------------------------------------------------------------------------------

    def _ci_profiles_for(self, index: int, gi_handle: Any) -> list[CiProfile]:
        gi_profile_id = int(self._call("nvmlGpuInstanceGetInfo", gi_handle).profileId)
        key = (index, gi_profile_id)
        cached = self._ci_profile_cache.get(key)
        if cached is None:
            cached = [decode.ci_profile(p) for p in self._ci_profiles(gi_handle)]
            self._ci_profile_cache[key] = cached
        return cached

    def _ci_profiles(self, gi_handle: Any) -> list[Any]:
        found = []
        shared = self._lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for enum_index in range(int(self._lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                found.append(
                    self._call(
                        "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi_handle, enum_index, shared, 2
                    )
                )
            except NvmlError as exc:
                if exc.code not in _SKIP_PROFILE:
                    raise
        return found

    def create_compute_instance(self, index: int, gi_id: int) -> ComputeInstance:
        """Create the CI that spans the whole GI `gi_id` (see `decode.full_ci_profile`)."""
        gi = self._gi_handle(index, gi_id)
        gi_profile = self.gi_profile_by_id(index, int(self._call("nvmlGpuInstanceGetInfo", gi).profileId))
        full = decode.full_ci_profile(self._ci_profiles_for(index, gi), gi_profile)
        if full is None:
            raise NvmlError("nvmlGpuInstanceGetComputeInstanceProfileInfo", NvmlErrorCode.NOT_SUPPORTED)
        ci = self._call("nvmlGpuInstanceCreateComputeInstance", gi, full.profile_id)
        return decode.compute_instance(index, gi_id, self._call("nvmlComputeInstanceGetInfo", ci))

    def compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]:
        gi = self._gi_handle(index, gi_id)
        found: list[ComputeInstance] = []
        for profile in self._ci_profiles_for(index, gi):
            buffer = (self._lib.c_nvmlComputeInstance_t * max(profile.instance_count, 1))()
            count = ctypes.c_uint(0)
            self._call(
                "nvmlGpuInstanceGetComputeInstances", gi, profile.profile_id, buffer, ctypes.byref(count)
            )
            for i in range(count.value):
                info = self._call("nvmlComputeInstanceGetInfo", buffer[i])
                found.append(decode.compute_instance(index, gi_id, info))
        return sorted(found, key=lambda ci: ci.ci_id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", self._gi_handle(index, gi_id), ci_id)
        self._call("nvmlComputeInstanceDestroy", ci)

    # -- MIG devices ------------------------------------------------------------------------------------

    def _mig_handles(self, index: int) -> Iterator[tuple[Any, int, int]]:
        h = self._handle(index)
        try:
            count = int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))
        except NvmlError as exc:
            if exc.code is NvmlErrorCode.NOT_SUPPORTED:
                return
            raise
        for i in range(count):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
            except NvmlError as exc:
                if exc.code in _EMPTY_MIG_INDEX:  # indices may be sparse
                    continue
                raise
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig))
            yield mig, gi_id, int(self._call("nvmlDeviceGetComputeInstanceId", mig))

    def mig_devices(self, index: int) -> list[MigDevice]:
        return [
            MigDevice(gpu_index=index, gi_id=gi, ci_id=ci, uuid=str(self._call("nvmlDeviceGetUUID", mig)))
            for mig, gi, ci in self._mig_handles(index)
        ]

    def _mig_handle(self, index: int, gi_id: int, ci_id: int) -> Any:
        for mig, gi, ci in self._mig_handles(index):
            if (gi, ci) == (gi_id, ci_id):
                return mig
        raise NvmlError(
            "nvmlDeviceGetMigDeviceHandleByIndex", NvmlErrorCode.NOT_FOUND, f"GI {gi_id} CI {ci_id}"
        )

    def mig_uuid(self, index: int, gi_id: int, ci_id: int) -> str:
        return str(self._call("nvmlDeviceGetUUID", self._mig_handle(index, gi_id, ci_id)))

    def running_process_count(self, index: int, gi_id: int, ci_id: int) -> int:
        """Compute processes on the MIG device of (GI, CI)."""
        mig = self._mig_handle(index, gi_id, ci_id)
        return len(self._call("nvmlDeviceGetComputeRunningProcesses", mig))

    # -- health -----------------------------------------------------------------------------------------

    def wait_health_events(self, timeout_ms: int) -> list[HealthEvent]:
        """Wait up to `timeout_ms` for XID / double-bit ECC events; returns [] on timeout."""
        return self._health.wait(timeout_ms)
