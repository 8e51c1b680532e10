"""The Ampere MIG-mode precondition, reported on the node (docs/kubelet-plugin.md, "MIG mode on Ampere").

An Ampere GPU (A100, A30) only switches MIG mode with a GPU reset, which flexmig never does
(kubeletplugin/prepare/migmode.py): with MIG off it publishes the whole GPU and no MIG device, and
stays so until an administrator runs `nvidia-smi -i <index> -mig 1` and resets the GPU. Hopper and
newer switch at prepare, so their MIG mode is never a problem here.

`MigModeMonitor.check` (at start and on every periodic reconcile pass) reads each MIG-capable GPU's
mode and reports a GPU that is *blocked*: MIG wanted (a `mig`-mode GPU, not filtered, its model given
profiles by the allowlist), MIG off, reset needed. On a hami-core node MIG off is what is wanted, so
nothing is reported there. Reported through the gauges `flexmig_node_gpu_mig_mode{gpu,uuid,model}` and
`flexmig_node_gpu_mig_mode_needs_reset{...}` (every check), a log warning (at start and when the mode
changes, never every pass) and one `MigModeOff` Warning event on the Node per GPU per plugin start.
The whole-GPU device carries the same fact for `flexmig status` (kubeletplugin/publish/gpudevices.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from driver.catalog.allowlist import MigProfileAllowlist
from driver.catalog.types import GpuCatalog
from driver.nvml.types import GpuInfo, MigMode, NvmlError
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

log = structlog.get_logger(__name__)

MIG_MODE_OFF_EVENT = "MigModeOff"


class MigModeSource(Protocol):
    def mig_mode(self, index: int) -> MigMode: ...


def enable_step(index: int) -> str:
    """The administrator's fix for GPU `index`, as one sentence."""
    return (
        f"run `nvidia-smi -i {index} -mig 1`, then reset the GPU (`nvidia-smi -i {index} -r` with no"
        " process using it) or reboot the node, then restart the flexmig kubelet plugin on this node"
    )


def mig_wanted(gpu: GpuInfo, node: NodeConfig, allowlist: MigProfileAllowlist) -> bool:
    """MIG should be usable on this GPU: a MIG-capable `mig`-mode GPU, not filtered, model allowed MIG."""
    if not gpu.mig_capable or node.is_filtered(gpu.index, gpu.uuid):
        return False
    return node.gpu_mode(gpu.mig_capable) is OperatingMode.MIG and bool(allowlist.profiles_for(gpu.name))


@dataclass(frozen=True, slots=True)
class MigModeState:
    mode: MigMode
    blocked: bool  # wanted, off, and only an administrator's enable + reset can change that


class MigModeMonitor:
    def __init__(
        self,
        source: MigModeSource,
        catalogs: Sequence[GpuCatalog],
        node: NodeConfig,
        allowlist: MigProfileAllowlist,
        metrics: NodeMetrics,
        post_event: Callable[[str, str], object],
    ) -> None:
        self._source = source
        self._catalogs = [c for c in catalogs if c.gpu.mig_capable]
        self._wanted = {c.gpu.index: mig_wanted(c.gpu, node, allowlist) for c in self._catalogs}
        self._metrics = metrics
        self._post_event = post_event
        self._last: dict[int, MigModeState] = {}
        self._evented: set[int] = set()

    def blocked(self) -> list[int]:
        """Indices of the GPUs last seen blocked."""
        return sorted(i for i, st in self._last.items() if st.blocked)

    def check(self) -> None:
        """Read every MIG-capable GPU's mode; update the gauges, log changes, post new events."""
        for cat in self._catalogs:
            gpu = cat.gpu
            try:
                mode = self._source.mig_mode(gpu.index)
            except NvmlError as exc:  # keep the last answer; the next pass asks again
                log.debug("cannot read MIG mode", gpu=gpu.index, error=str(exc))
                continue
            blocked = self._wanted[gpu.index] and gpu.architecture.mig_toggle_needs_reset and not mode.current
            labels = {"gpu": str(gpu.index), "uuid": gpu.uuid, "model": cat.model}
            self._metrics.gpu_mig_mode.labels(**labels).set(int(mode.current))
            self._metrics.gpu_mig_mode_needs_reset.labels(**labels).set(int(blocked))
            state = MigModeState(mode, blocked)
            previous = self._last.get(gpu.index)
            self._last[gpu.index] = state
            if state == previous:
                continue
            if blocked:
                self._warn(cat, mode)
            elif previous is not None and previous.blocked:
                log.info("MIG mode is now on", gpu=gpu.index, uuid=gpu.uuid, model=cat.model)

    def _warn(self, cat: GpuCatalog, mode: MigMode) -> None:
        gpu = cat.gpu
        pending = mode.pending  # the enable was already run; only the reset is left
        log.warning(
            "MIG mode off: this GPU needs MIG mode enabled and a GPU reset before flexmig can offer"
            " its MIG devices; only the whole GPU is published",
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=cat.model,
            enable_pending_reset=pending,
            fix=enable_step(gpu.index),
        )
        if gpu.index in self._evented:
            return
        self._evented.add(gpu.index)
        self._post_event(
            MIG_MODE_OFF_EVENT,
            f"GPU {gpu.index} ({cat.model}, {gpu.name}, {gpu.uuid}) has MIG mode off"
            + (" (enabled, pending a reset)" if pending else "")
            + ". This GPU needs a reset to switch MIG mode, which flexmig never does, so only the whole"
            f" GPU is offered and none of its MIG devices. To offer MIG: {enable_step(gpu.index)}.",
        )
