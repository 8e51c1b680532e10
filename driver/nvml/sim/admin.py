"""Test/operator control of the simulator (not part of the pynvml surface).

`init_sim_state` writes a fresh state file (`init_memory_sim` builds the same state in memory, the fast
mode of `driver.nvml.sim.memory`); `SimAdmin` changes it the way the outside world would (processes
starting, GPU resets, reboots, XIDs) or configures latency and faults. Every method is one locked
transaction, so it is safe to use while plugin processes (or, in memory, threads) are calling the
simulated library.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml

from driver.nvml.sim import rules
from driver.nvml.sim.hardware import SKUS
from driver.nvml.sim.memory import MemoryState
from driver.nvml.sim.state import (
    EventState,
    FaultState,
    GpuState,
    MigOffQueries,
    ProcessState,
    SimState,
    StateFile,
)
from driver.nvml.types import HealthEventKind, NvmlError, NvmlErrorCode

_EVENT_TYPES = {
    HealthEventKind.XID: pynvml.nvmlEventTypeXidCriticalError,
    HealthEventKind.ECC_DOUBLE_BIT: pynvml.nvmlEventTypeDoubleBitEccError,
    HealthEventKind.ECC_SINGLE_BIT: pynvml.nvmlEventTypeSingleBitEccError,
}


@dataclass(frozen=True, slots=True)
class SimGpuSpec:
    sku: str  # a key of `SKUS`, e.g. "A100-40GB"
    mig_enabled: bool = True
    uuid: str | None = None  # default: derived deterministically from the seed and the GPU index
    # Hopper and newer only: answer or refuse MIG profile queries while MIG mode is off.
    mig_off_queries: MigOffQueries = MigOffQueries.ANSWER


@dataclass(frozen=True, slots=True)
class SimComputeInstanceView:
    ci_id: int
    profile_id: int
    start: int
    size: int
    mig_uuid: str


@dataclass(frozen=True, slots=True)
class SimGpuInstanceView:
    gi_id: int
    profile_id: int
    profile_name: str
    start: int
    size: int
    compute_instances: tuple[SimComputeInstanceView, ...]


@dataclass(frozen=True, slots=True)
class SimGpuView:
    index: int
    sku: str
    uuid: str
    mig_current: bool
    mig_pending: bool
    gpu_instances: tuple[SimGpuInstanceView, ...]
    processes: tuple[tuple[int, int | None, int | None], ...]  # (pid, gi id, ci id)


@dataclass(frozen=True, slots=True)
class SimSnapshot:
    gpus: tuple[SimGpuView, ...]
    pending_events: int
    armed_faults: tuple[tuple[str, int, int], ...]  # (function, absolute call number, code)


def _build_state(gpus: Sequence[SimGpuSpec], default_latency_s: float, seed: str) -> SimState:
    states: list[GpuState] = []
    for index, spec in enumerate(gpus):
        if spec.sku not in SKUS:
            raise ValueError(
                f"gpus[{index}].sku: unknown SKU {spec.sku!r}; allowed: {', '.join(sorted(SKUS))}"
            )
        if not isinstance(spec.mig_off_queries, MigOffQueries):
            allowed = ", ".join(m.value for m in MigOffQueries)
            raise ValueError(
                f"gpus[{index}].mig_off_queries: {spec.mig_off_queries!r} is not valid; allowed: {allowed}"
            )
        uuid = spec.uuid or rules.gpu_uuid(seed, index)
        gpu = GpuState(spec.sku, uuid, spec.mig_enabled, spec.mig_enabled)
        gpu.mig_off_queries = spec.mig_off_queries.value
        states.append(gpu)
    if default_latency_s < 0:
        raise ValueError(f"default_latency_s: {default_latency_s} must be >= 0")
    return SimState(gpus=states, default_latency_s=default_latency_s)


def init_sim_state(
    path: str | os.PathLike[str],
    gpus: Sequence[SimGpuSpec],
    *,
    default_latency_s: float = 0.0,
    overwrite: bool = False,
    seed: str = "flexmig-sim",
) -> None:
    """Create the state file describing `gpus` (no instances, no processes)."""
    state = _build_state(gpus, default_latency_s, seed)
    StateFile(path).create(state, overwrite=overwrite)


def init_memory_sim(
    gpus: Sequence[SimGpuSpec], *, default_latency_s: float = 0.0, seed: str = "flexmig-sim"
) -> MemoryState:
    """The same GPUs as `init_sim_state` would write, held in this process only (the fast mode)."""
    return MemoryState(_build_state(gpus, default_latency_s, seed))


def _as_nvml_error(function: str, exc: pynvml.NVMLError) -> NvmlError:
    return NvmlError(function, NvmlErrorCode.from_int(int(exc.value)))


class SimAdmin:
    """Out-of-band control of a simulator state file, or of an in-memory simulator."""

    def __init__(self, source: str | os.PathLike[str] | MemoryState) -> None:
        self._store: StateFile | MemoryState = (
            source if isinstance(source, MemoryState) else StateFile(source)
        )

    def set_latency(self, default_s: float | None = None, **per_function_s: float) -> None:
        """Set the default per-call latency and/or per-function overrides (seconds)."""
        with self._store.transaction() as st:
            if default_s is not None:
                st.default_latency_s = default_s
            st.latency_s.update(per_function_s)

    def clear_latency(self) -> None:
        with self._store.transaction() as st:
            st.default_latency_s = 0.0
            st.latency_s.clear()

    def inject_fault(self, function: str, nth: int, code: NvmlErrorCode | int) -> None:
        """Make the `nth` call of `function` from now (1 = the next one) fail with `code`."""
        if nth < 1:
            raise ValueError("nth must be >= 1")
        with self._store.transaction() as st:
            at = st.call_counts.get(function, 0) + nth
            st.faults.append(FaultState(function=function, at_call=at, code=int(code)))

    def clear_faults(self) -> None:
        with self._store.transaction() as st:
            st.faults.clear()

    def call_counts(self) -> dict[str, int]:
        if isinstance(self._store, MemoryState):
            return self._store.call_counts()
        return dict(self._store.read().call_counts)

    def add_process(self, gpu_index: int, gi_id: int | None, ci_id: int | None, pid: int) -> None:
        """A process starts on a MIG device (or on the whole GPU when gi_id/ci_id are None)."""
        with self._store.transaction() as st:
            gpu = self._gpu(st, gpu_index)
            if gi_id is not None:
                try:
                    gi = rules.find_gi(gpu, gi_id)
                    if ci_id is None:
                        raise ValueError("ci_id is required with gi_id")
                    rules.find_ci(gi, ci_id)
                except pynvml.NVMLError as exc:
                    raise ValueError(f"gpu {gpu_index} has no GI {gi_id} / CI {ci_id}") from exc
            gpu.processes.append(ProcessState(pid=pid, gi_id=gi_id, ci_id=ci_id))

    def remove_process(self, gpu_index: int, pid: int) -> None:
        with self._store.transaction() as st:
            gpu = self._gpu(st, gpu_index)
            gpu.processes = [p for p in gpu.processes if p.pid != pid]

    def inject_health_event(
        self,
        gpu_index: int,
        kind: HealthEventKind = HealthEventKind.XID,
        *,
        xid: int = 0,
        gi_id: int | None = None,
        ci_id: int | None = None,
    ) -> None:
        """Queue a one-shot event; the next matching `nvmlEventSetWait` consumes it."""
        if kind not in _EVENT_TYPES:
            raise ValueError(f"kind: {kind!r} cannot be injected; allowed: {[k.value for k in _EVENT_TYPES]}")
        with self._store.transaction() as st:
            self._gpu(st, gpu_index)
            data = xid if kind is HealthEventKind.XID else 0
            st.events.append(EventState(gpu_index, int(_EVENT_TYPES[kind]), data, gi_id, ci_id))

    def set_mig_off_queries(self, gpu_index: int, behaviour: MigOffQueries) -> None:
        """Whether GPU `gpu_index` (Hopper or newer) answers MIG profile queries while MIG is off."""
        if not isinstance(behaviour, MigOffQueries):
            allowed = ", ".join(m.value for m in MigOffQueries)
            raise ValueError(f"behaviour: {behaviour!r} is not valid; allowed: {allowed}")
        with self._store.transaction() as st:
            self._gpu(st, gpu_index).mig_off_queries = behaviour.value

    def reset_gpu(self, index: int) -> None:
        """GPU reset: clears instances; Ampere keeps MIG mode (applying a pending change), Hopper and
        newer come back with MIG off. NvmlError(IN_USE) while processes run."""
        with self._store.transaction() as st:
            gpu = self._gpu(st, index)
            try:
                rules.reset(gpu)
            except pynvml.NVMLError as exc:
                raise _as_nvml_error("nvmlDeviceResetGpu", exc) from exc

    def reboot(self) -> None:
        """Node reboot: processes die, GI/CI configurations are lost.

        Ampere persists MIG mode (a pending change is applied, as a reboot resets the GPU); Hopper and
        newer do not persist it and boot with MIG off.
        """
        with self._store.transaction() as st:
            for gpu in st.gpus:
                gpu.processes.clear()
                rules.reset(gpu)
            st.events.clear()

    def snapshot(self) -> SimSnapshot:
        st = self._store.read()
        return SimSnapshot(
            gpus=tuple(self._view(i, g) for i, g in enumerate(st.gpus)),
            pending_events=len(st.events),
            armed_faults=tuple((f.function, f.at_call, f.code) for f in st.faults),
        )

    @staticmethod
    def _view(index: int, gpu: GpuState) -> SimGpuView:
        sku = SKUS[gpu.sku]
        gis = []
        for gi in gpu.gis:
            row = sku.profile_by_id(gi.profile_id)
            cis = tuple(
                SimComputeInstanceView(
                    ci.id, ci.profile_id, ci.start, ci.size, rules.mig_uuid(gpu.uuid, gi.id, ci.id)
                )
                for ci in gi.cis
            )
            name = row.name if row is not None else "?"
            gis.append(SimGpuInstanceView(gi.id, gi.profile_id, name, gi.start, gi.size, cis))
        procs = tuple((p.pid, p.gi_id, p.ci_id) for p in gpu.processes)
        return SimGpuView(index, gpu.sku, gpu.uuid, gpu.mig_current, gpu.mig_pending, tuple(gis), procs)

    @staticmethod
    def _gpu(st: SimState, index: int) -> GpuState:
        if not 0 <= index < len(st.gpus):
            raise ValueError(f"gpu_index: {index} out of range (0..{len(st.gpus) - 1})")
        return st.gpus[index]
