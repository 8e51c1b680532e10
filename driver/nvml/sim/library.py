"""`SimulatedNvmlLibrary`: a pynvml-compatible object backed by the simulator state file (or, in the
fast mode, by a `MemoryState` in this process: see driver/nvml/sim/memory.py).

It has the same function names, argument conventions (ctypes arrays, `byref` output counts and
placements), return types (pynvml's own ctypes structs) and errors (`pynvml.NVMLError(code)`, which
yields the per-code subclass) as the pynvml module, for every function `driver.nvml.port.Nvml` uses.
Constants and struct classes are forwarded from pynvml. Each call runs as one locked transaction on
the state file (in memory: under its GPU's lock): count the call, apply an armed fault, else apply the
hardware rules; a failed call leaves the hardware state untouched. The configured latency is slept
after the transaction, so a process killed during it has had its effect applied without seeing the
result, as with a real driver.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeVar

import pynvml

from driver.nvml.sim import rules
from driver.nvml.sim.handles import HandleRef, Kind, make, out_param, parse
from driver.nvml.sim.instances import InstanceMixin
from driver.nvml.sim.state import SimState

T = TypeVar("T")
_MIB = 1024 * 1024
_ARCH = {"ampere": pynvml.NVML_DEVICE_ARCH_AMPERE, "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER}
_ARCH["blackwell"] = pynvml.NVML_DEVICE_ARCH_BLACKWELL
_ANY = 0xFFFFFFFF
# Forwarded from pynvml so callers find constants, struct classes and error classes on this object.
_FORWARDED_PREFIXES = ("NVML_", "c_nvml", "nvmlEventType", "NVMLError", "nvmlFriendlyObject")


class SimulatedNvmlLibrary(InstanceMixin):
    """Drop-in for the `pynvml` module, simulating the GPUs described by the state file at `path`."""

    NVMLError = pynvml.NVMLError

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_FORWARDED_PREFIXES):
            return getattr(pynvml, name)
        raise AttributeError(f"the NVML simulator does not implement {name}")

    # -- library lifetime and device queries --------------------------------------------------------

    def nvmlInit(self) -> None:
        self._invoke("nvmlInit", lambda st: None, needs_init=False)
        self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._invoke("nvmlShutdown", lambda st: None)
        self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        return self._invoke("nvmlDeviceGetCount", lambda st: len(st.gpus))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        def op(st: SimState) -> Any:
            rules.gpu_at(st, index)
            return make(HandleRef(Kind.DEVICE, index))

        return self._invoke("nvmlDeviceGetHandleByIndex", op, on=index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        def op(st: SimState) -> str:
            ref = parse(handle, Kind.DEVICE, Kind.MIG_DEVICE)
            if ref.kind is Kind.DEVICE:
                return rules.sku_of(self._device(st, handle)[1]).product_name
            _, gpu, gi, _ = self._mig_or_ci(st, handle, Kind.MIG_DEVICE)
            sku = rules.sku_of(gpu)
            return f"{sku.product_name} MIG {rules.gi_row(gpu, gi).name}"

        return self._invoke("nvmlDeviceGetName", op, on=handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        def op(st: SimState) -> str:
            if parse(handle, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.DEVICE:
                return self._device(st, handle)[1].uuid
            _, gpu, gi, ci = self._mig_or_ci(st, handle, Kind.MIG_DEVICE)
            return rules.mig_uuid(gpu.uuid, gi.id, ci.id)

        return self._invoke("nvmlDeviceGetUUID", op, on=handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        def op(st: SimState) -> Any:
            if parse(handle, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.DEVICE:
                mib = rules.sku_of(self._device(st, handle)[1]).memory_total_mib
            else:
                _, gpu, gi, _ = self._mig_or_ci(st, handle, Kind.MIG_DEVICE)
                mib = rules.gi_row(gpu, gi).memory_mib
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.free, mem.used = mib * _MIB, mib * _MIB, 0
            return mem

        return self._invoke("nvmlDeviceGetMemoryInfo", op, on=handle)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        def op(st: SimState) -> Any:
            index, gpu = self._device(st, handle)
            info = pynvml.nvmlPciInfo_t()
            bus_id = f"00000000:{0x10 + index:02X}:00.0".encode()
            info.busIdLegacy, info.busId, info.bus = bus_id, bus_id, 0x10 + index
            info.pciDeviceId = (rules.sku_of(gpu).pci_device_id << 16) | 0x10DE  # device << 16 | vendor
            return info

        return self._invoke("nvmlDeviceGetPciInfo", op, on=handle)

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._invoke("nvmlDeviceGetMinorNumber", lambda st: self._device(st, handle)[0], on=handle)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        def op(st: SimState) -> int:
            return int(_ARCH[rules.sku_of(self._device(st, handle)[1]).architecture.value])

        return self._invoke("nvmlDeviceGetArchitecture", op, on=handle)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        def op(st: SimState) -> list[int]:
            gpu = self._device(st, handle)[1]
            return [int(gpu.mig_current), int(gpu.mig_pending)]

        return self._invoke("nvmlDeviceGetMigMode", op, on=handle)

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        def op(st: SimState) -> int:
            if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
                rules.fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return rules.set_mig_mode(self._device(st, handle)[1], mode == pynvml.NVML_DEVICE_MIG_ENABLE)

        return self._invoke("nvmlDeviceSetMigMode", op, on=handle)

    # -- GPU instances ------------------------------------------------------------------------------

    @staticmethod
    def _gi_info_struct(row: Any, version: int) -> Any:
        info = (
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlGpuInstanceProfileInfo_t()
        )
        info.id, info.isP2pSupported, info.sliceCount = row.profile_id, 0, row.compute_slices
        info.instanceCount, info.multiprocessorCount = row.max_instances, row.sms
        info.copyEngineCount, info.decoderCount, info.encoderCount = row.ce, row.dec, row.enc
        info.jpegCount, info.ofaCount, info.memorySizeMB = row.jpeg, row.ofa, row.memory_mib
        if version == 2:
            info.name = row.nvml_name.encode()
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        def op(st: SimState) -> Any:
            gpu = self._device(st, device)[1]
            if version not in (1, 2):
                rules.fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
                rules.fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            rules.require_mig_query(gpu)
            row = rules.sku_of(gpu).profile_by_enum(profile)
            if row is None:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._gi_info_struct(row, version)

        return self._invoke("nvmlDeviceGetGpuInstanceProfileInfo", op, on=device)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: Any, profileId: int) -> Any:
        def op(st: SimState) -> Any:
            gpu = self._device(st, device)[1]
            rules.require_mig_query(gpu)
            return self._gi_info_struct(rules.profile_by_id(gpu, profileId), 2)

        return self._invoke("nvmlDeviceGetGpuInstanceProfileInfoById", op, on=device)

    nvmlDeviceGetGpuInstanceProfileInfoByIdV = nvmlDeviceGetGpuInstanceProfileInfoById

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        def op(st: SimState) -> int:
            gpu = self._device(st, device)[1]
            rules.require_mig_query(gpu)
            row = rules.profile_by_id(gpu, profileId)
            count = out_param(countRef)
            if placementsRef is None:  # count-only query
                count.value = len(row.starts)
                return int(pynvml.NVML_SUCCESS)
            items = []
            for start in row.starts:
                item = pynvml.c_nvmlGpuInstancePlacement_t()
                item.start, item.size = start, row.memory_slices
                items.append(item)
            self._fill_array(placementsRef, countRef, items, len(items))
            return int(pynvml.NVML_SUCCESS)

        return self._invoke("nvmlDeviceGetGpuInstancePossiblePlacements", op, on=device)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        def op(st: SimState) -> int:
            gpu = self._device(st, device)[1]
            rules.require_mig_on(gpu)
            return rules.remaining_capacity(gpu, rules.profile_by_id(gpu, profileId))

        return self._invoke("nvmlDeviceGetGpuInstanceRemainingCapacity", op, on=device)

    def _create_gi(self, name: str, device: Any, profile_id: int, start: int | None) -> Any:
        def op(st: SimState) -> Any:
            index, gpu = self._device(st, device)
            return self._gi_handle(index, rules.create_gi(st, gpu, profile_id, start))

        return self._invoke(name, op, on=device)

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        return self._create_gi("nvmlDeviceCreateGpuInstance", device, profileId, None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        # pynvml hands `placement` to C unchanged, so only a byref()/pointer() to the struct is valid.
        if isinstance(placement, ctypes.Structure):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        target = out_param(placement)
        return self._create_gi(
            "nvmlDeviceCreateGpuInstanceWithPlacement", device, profileId, int(target.start)
        )

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        def op(st: SimState) -> int:
            _, gpu, gi = self._gpu_instance(st, gpuInstance)
            rules.destroy_gi(gpu, gi)
            return int(pynvml.NVML_SUCCESS)

        return self._invoke("nvmlGpuInstanceDestroy", op, on=gpuInstance)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        def op(st: SimState) -> int:
            index, gpu = self._device(st, device)
            rules.require_mig_on(gpu)
            row = rules.profile_by_id(gpu, profileId)
            items = [self._gi_handle(index, gi) for gi in gpu.gis if gi.profile_id == profileId]
            self._fill_array(gpuInstancesRef, countRef, items, row.max_instances)
            return int(pynvml.NVML_SUCCESS)

        return self._invoke("nvmlDeviceGetGpuInstances", op, on=device)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        def op(st: SimState) -> Any:
            index, gpu = self._device(st, device)
            rules.require_mig_on(gpu)
            return self._gi_handle(index, rules.find_gi(gpu, gpuInstanceId))

        return self._invoke("nvmlDeviceGetGpuInstanceById", op, on=device)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        def op(st: SimState) -> Any:
            index, _, gi = self._gpu_instance(st, gpuInstance)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = make(HandleRef(Kind.DEVICE, index))
            info.id, info.profileId = gi.id, gi.profile_id
            info.placement.start, info.placement.size = gi.start, gi.size
            return info

        return self._invoke("nvmlGpuInstanceGetInfo", op, on=gpuInstance)
