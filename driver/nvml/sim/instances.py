"""Simulated compute-instance and MIG-device-handle functions of the pynvml surface."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from driver.nvml.sim import rules
from driver.nvml.sim.events import EventMixin
from driver.nvml.sim.handles import HandleRef, Kind, make, out_param, parse
from driver.nvml.sim.hardware import ci_profiles
from driver.nvml.sim.state import SimState

_ANY = 0xFFFFFFFF


class InstanceMixin(EventMixin):
    # -- compute instances --------------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        def op(st: SimState) -> Any:
            _, gpu, gi = self._gpu_instance(st, device)
            if version not in (1, 2):
                rules.fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT or engProfile != 0:
                rules.fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gi_row = rules.gi_row(gpu, gi)
            row = next((r for r in ci_profiles(rules.sku_of(gpu), gi_row) if r.enum_index == profile), None)
            if row is None:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if version == 2:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
                prefix = f"{row.slices}c." if row.slices != gi_row.compute_slices else ""
                info.name = f"MIG {prefix}{gi_row.name}".encode()
            else:
                info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
            info.id, info.sliceCount, info.instanceCount = row.profile_id, row.slices, row.max_instances
            info.multiprocessorCount, info.sharedCopyEngineCount = row.sms, gi_row.ce
            info.sharedDecoderCount, info.sharedEncoderCount = gi_row.dec, gi_row.enc
            info.sharedJpegCount, info.sharedOfaCount = gi_row.jpeg, gi_row.ofa
            return info

        return self._invoke("nvmlGpuInstanceGetComputeInstanceProfileInfo", op, on=device)

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def _create_ci(self, name: str, gpu_instance: Any, profile_id: int, start: int | None) -> Any:
        def op(st: SimState) -> Any:
            index, gpu, gi = self._gpu_instance(st, gpu_instance)
            return self._ci_handle(index, gi, rules.create_ci(st, gpu, gi, profile_id, start))

        return self._invoke(name, op, on=gpu_instance)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        return self._create_ci("nvmlGpuInstanceCreateComputeInstance", gpuInstance, profileId, None)

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gpuInstance: Any, profileId: int, placement: Any
    ) -> Any:
        if isinstance(placement, ctypes.Structure):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        start = int(out_param(placement).start)
        return self._create_ci(
            "nvmlGpuInstanceCreateComputeInstanceWithPlacement", gpuInstance, profileId, start
        )

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        def op(st: SimState) -> int:
            _, gpu, gi, ci = self._mig_or_ci(st, computeInstance, Kind.COMPUTE_INSTANCE)
            rules.destroy_ci(gpu, gi, ci)
            return int(pynvml.NVML_SUCCESS)

        return self._invoke("nvmlComputeInstanceDestroy", op, on=computeInstance)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        def op(st: SimState) -> int:
            index, gpu, gi = self._gpu_instance(st, gpuInstance)
            rows = ci_profiles(rules.sku_of(gpu), rules.gi_row(gpu, gi))
            row = next((r for r in rows if r.profile_id == profileId), None)
            if row is None:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            items = [self._ci_handle(index, gi, ci) for ci in gi.cis if ci.profile_id == profileId]
            self._fill_array(computeInstancesRef, countRef, items, row.max_instances)
            return int(pynvml.NVML_SUCCESS)

        return self._invoke("nvmlGpuInstanceGetComputeInstances", op, on=gpuInstance)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Any, computeInstanceId: int) -> Any:
        def op(st: SimState) -> Any:
            index, _, gi = self._gpu_instance(st, gpuInstance)
            return self._ci_handle(index, gi, rules.find_ci(gi, computeInstanceId))

        return self._invoke("nvmlGpuInstanceGetComputeInstanceById", op, on=gpuInstance)

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        def op(st: SimState) -> Any:
            index, _, gi, ci = self._mig_or_ci(st, computeInstance, Kind.COMPUTE_INSTANCE)
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.device = make(HandleRef(Kind.DEVICE, index))
            info.gpuInstance = self._gi_handle(index, gi)
            info.id, info.profileId = ci.id, ci.profile_id
            info.placement.start, info.placement.size = ci.start, ci.size
            return info

        return self._invoke("nvmlComputeInstanceGetInfo", op, on=computeInstance)

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    # -- MIG device handles -------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        def op(st: SimState) -> int:
            gpu = self._device(st, device)[1]
            return rules.sku_of(gpu).compute_slices if gpu.mig_current else 0

        return self._invoke("nvmlDeviceGetMaxMigDeviceCount", op, on=device)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        def op(st: SimState) -> Any:
            gpu_index, gpu = self._device(st, device)
            rules.require_mig_on(gpu)
            devices = rules.mig_device_list(gpu)
            if not 0 <= index < rules.sku_of(gpu).compute_slices:
                rules.fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index >= len(devices):
                rules.fail(pynvml.NVML_ERROR_NOT_FOUND)
            gi, ci = devices[index]
            return self._mig_handle(gpu_index, gi, ci)

        return self._invoke("nvmlDeviceGetMigDeviceHandleByIndex", op, on=device)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        def op(st: SimState) -> Any:
            # pynvml returns the c_uint itself, not its value.
            return ctypes.c_uint(int(parse(device, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.MIG_DEVICE))

        return self._invoke("nvmlDeviceIsMigDeviceHandle", op, on=device)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        def op(st: SimState) -> int:
            if parse(device, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.DEVICE:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._mig_or_ci(st, device, Kind.MIG_DEVICE)[2].id

        return self._invoke("nvmlDeviceGetGpuInstanceId", op, on=device)

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        def op(st: SimState) -> int:
            if parse(device, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.DEVICE:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self._mig_or_ci(st, device, Kind.MIG_DEVICE)[3].id

        return self._invoke("nvmlDeviceGetComputeInstanceId", op, on=device)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        def op(st: SimState) -> Any:
            index = self._mig_or_ci(st, migDevice, Kind.MIG_DEVICE)[0]
            return make(HandleRef(Kind.DEVICE, index))

        return self._invoke("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", op, on=migDevice)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        def op(st: SimState) -> list[Any]:
            if parse(handle, Kind.DEVICE, Kind.MIG_DEVICE).kind is Kind.DEVICE:
                gpu = self._device(st, handle)[1]
                procs = list(gpu.processes)
            else:
                _, gpu, gi, ci = self._mig_or_ci(st, handle, Kind.MIG_DEVICE)
                procs = [p for p in gpu.processes if p.gi_id == gi.id and p.ci_id == ci.id]
            out = []
            for p in procs:
                info = pynvml.c_nvmlProcessInfo_v3_t()
                info.pid, info.usedGpuMemory = p.pid, 0
                info.gpuInstanceId = _ANY if p.gi_id is None else p.gi_id
                info.computeInstanceId = _ANY if p.ci_id is None else p.ci_id
                out.append(pynvml.nvmlStructToFriendlyObject(info))
            return out

        return self._invoke("nvmlDeviceGetComputeRunningProcesses", op, on=handle)

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
