"""The NVML calls the node agent makes, with every failure counted by function and code.

A thin layer over `driver.nvml.port.Nvml`: same calls, same exceptions, plus the
`flexmig_node_nvml_errors_total{call, code}` counter, so no call site can forget to count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from driver.nvml.port import Nvml
from driver.nvml.types import ComputeInstance, GpuInfo, GpuInstance, MigMode, NvmlError, NvmlErrorCode
from kubeletplugin.agent.metrics import NodeMetrics

T = TypeVar("T")

# Codes that mean "there is nothing there" for lookups and destroys: the instance is gone
# (NOT_FOUND), or MIG is off so no instance can exist (NOT_SUPPORTED, also INVALID_ARGUMENT
# for an id NVML does not consider valid in the current mode).
GONE_CODES = frozenset({NvmlErrorCode.NOT_FOUND, NvmlErrorCode.NOT_SUPPORTED, NvmlErrorCode.INVALID_ARGUMENT})


class NvmlOps:
    def __init__(self, nvml: Nvml, metrics: NodeMetrics) -> None:
        self.nvml = nvml
        self._metrics = metrics

    def _counted(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except NvmlError as exc:
            self._metrics.nvml_errors.labels(call=exc.function, code=exc.code.name).inc()
            raise

    def gpu_info(self, index: int) -> GpuInfo:
        return self._counted(lambda: self.nvml.gpu(index))

    def mig_mode(self, index: int) -> MigMode:
        return self._counted(lambda: self.nvml.mig_mode(index))

    def set_mig_mode(self, index: int, enabled: bool) -> NvmlErrorCode | None:
        status = self._counted(lambda: self.nvml.set_mig_mode(index, enabled))
        if status is not None:
            self._metrics.nvml_errors.labels(call="nvmlDeviceSetMigMode", code=status.name).inc()
        return status

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        return self._counted(lambda: self.nvml.gpu_instances(index))

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        return self._counted(lambda: self.nvml.create_gpu_instance(index, profile_id, start))

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._counted(lambda: self.nvml.destroy_gpu_instance(index, gi_id))

    def create_compute_instance(self, index: int, gi_id: int) -> ComputeInstance:
        return self._counted(lambda: self.nvml.create_compute_instance(index, gi_id))

    def compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]:
        return self._counted(lambda: self.nvml.compute_instances(index, gi_id))

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        self._counted(lambda: self.nvml.destroy_compute_instance(index, gi_id, ci_id))

    def running_processes(self, index: int, gi_id: int, ci_id: int) -> int:
        """Compute processes on the MIG device of (GI, CI) (nvmlDeviceGetComputeRunningProcesses)."""
        return self._counted(lambda: self.nvml.running_process_count(index, gi_id, ci_id))

    def mig_uuid(self, index: int, gi_id: int, ci_id: int) -> str:
        return self._counted(lambda: self.nvml.mig_uuid(index, gi_id, ci_id))

    def gpu_instances_or_none(self, index: int) -> list[GpuInstance]:
        """GIs on the GPU; [] when MIG is off or the GPU does not do MIG."""
        try:
            return self.gpu_instances(index)
        except NvmlError as exc:
            if exc.code in GONE_CODES:
                return []
            raise
