"""MIG mode policy on the node (docs/kubelet-plugin.md, "Decisions worth knowing"; docs/hardware.md).

- Hopper and newer switch MIG mode without a reset: turn it on at the first MIG prepare of an idle GPU
  and off again once its last GPU instance is gone, so the whole-GPU device stays usable.
- Ampere (and anything whose architecture we do not know) needs a GPU reset: never toggle. Its MIG
  devices are only published while MIG is already on, so a MIG prepare there with MIG off means the
  mode changed behind our back; that is reported, not fixed.

A failed toggle is reported (claim error, log line, `flexmig_node_mig_mode_changes_total{result=
"failed"}`) and never retried in a loop: the failure is remembered for `retry_after_s`, during which
prepares of that GPU fail fast with the same message instead of calling NVML again. kubelet's own
backoff then spaces out later attempts. Callers hold the GPU's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import structlog
from prometheus_client import Counter

from driver.nvml.types import GpuInfo, NvmlError
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.prepare.nvmlops import NvmlOps

log = structlog.get_logger(__name__)

DEFAULT_RETRY_AFTER_S = 60.0


class MigModeError(Exception):
    """MIG mode is not what a prepare needs and flexmig may not or could not change it."""


class MigModeManager:
    def __init__(
        self,
        ops: NvmlOps,
        gpus: Mapping[int, GpuInfo],
        metrics: NodeMetrics,
        *,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ops = ops
        self._gpus = dict(gpus)
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._failed: dict[tuple[int, bool], tuple[float, str]] = {}
        self._lock = threading.Lock()
        self.changes = Counter(
            "flexmig_node_mig_mode_changes_total",
            "MIG mode switches the plugin attempted, by GPU, target mode and result",
            ["gpu", "mode", "result"],
            registry=metrics.registry,
        )

    def can_toggle(self, index: int) -> bool:
        gpu = self._gpus[index]
        return gpu.mig_capable and not gpu.architecture.mig_toggle_needs_reset

    def ensure_for_mig(self, index: int) -> None:
        """MIG mode must be on for a MIG device on GPU `index`; switch it on where allowed."""
        mode = self._ops.mig_mode(index)
        if mode.current and not mode.change_pending:
            return
        if not self.can_toggle(index):
            raise MigModeError(
                f"MIG mode is off on GPU {index} ({self._gpus[index].name}); this GPU needs a reset to"
                " switch it, which flexmig never does: an administrator must enable MIG and reset the GPU"
                + (" (a mode change is pending a reset)" if mode.change_pending else "")
            )
        self._switch(index, True)

    def ensure_for_whole(self, index: int) -> None:
        """A whole-GPU device needs MIG off; on Hopper+ an idle GPU left in MIG mode is switched off."""
        gpu = self._gpus[index]
        if not gpu.mig_capable:
            return
        mode = self._ops.mig_mode(index)
        if not mode.current:
            return
        if not self.can_toggle(index):
            raise MigModeError(
                f"GPU {index} is in MIG mode and needs a reset to leave it; whole GPU unusable"
            )
        if self._ops.gpu_instances_or_none(index):
            raise MigModeError(f"GPU {index} still has MIG instances; the whole GPU is not free")
        self._switch(index, False)

    def release(self, index: int) -> None:
        """After instances were destroyed: on Hopper+, switch MIG off once no GPU instance is left.

        Never raises: the claim that freed the GPU was unprepared successfully whatever happens here.
        """
        if not self.can_toggle(index):
            return
        try:
            mode = self._ops.mig_mode(index)
            if not mode.current or self._ops.gpu_instances_or_none(index):
                return
            self._switch(index, False)
        except (NvmlError, MigModeError) as exc:
            log.warning(
                "could not switch MIG mode off after the last instance was destroyed",
                gpu=index,
                error=str(exc),
            )

    def _switch(self, index: int, enabled: bool) -> None:
        key = (index, enabled)
        target = "on" if enabled else "off"
        with self._lock:
            failed = self._failed.get(key)
        if failed is not None and self._clock() - failed[0] < self._retry_after_s:
            raise MigModeError(f"{failed[1]} (not retried for {self._retry_after_s:.0f}s after a failure)")
        try:
            status = self._ops.set_mig_mode(index, enabled)
            reason = None if status is None else f"activation failed with NVML_ERROR_{status.name}"
            if status is None:
                mode = self._ops.mig_mode(index)
                if mode.current != enabled:
                    reason = "the change is pending a GPU reset"
        except NvmlError as exc:
            reason = str(exc)
        if reason is None:
            with self._lock:
                self._failed.pop(key, None)
            self.changes.labels(gpu=str(index), mode=target, result="ok").inc()
            log.info("switched MIG mode", gpu=index, mode=target)
            return
        message = f"switching MIG mode {target} on GPU {index} failed: {reason}"
        with self._lock:
            self._failed[key] = (self._clock(), message)
        self.changes.labels(gpu=str(index), mode=target, result="failed").inc()
        log.error("MIG mode switch failed; not retrying in a loop", gpu=index, mode=target, reason=reason)
        raise MigModeError(message)
