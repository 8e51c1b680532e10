"""Plumbing shared by the simulated library: the per-call transaction and handle resolution.

Each call runs either as one locked transaction on the state file (file mode) or on the in-process
state under its GPU's lock (`MemoryState`, the fast mode); the call sites say which GPU they address.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from driver.nvml.sim import rules
from driver.nvml.sim.handles import HandleRef, Kind, make, out_param, parse
from driver.nvml.sim.memory import MemoryState
from driver.nvml.sim.state import CiState, GiState, GpuState, SimState, StateFile

T = TypeVar("T")


class LibraryCore:
    """Runs each simulated call as one locked transaction on the state file, or on a `MemoryState`."""

    def __init__(self, source: str | MemoryState) -> None:
        self._memory = source if isinstance(source, MemoryState) else None
        self._store = StateFile(source) if isinstance(source, str) else None
        self._init_count = 0

    # -- plumbing -----------------------------------------------------------------------------------

    @staticmethod
    def _gpu_of(on: Any) -> int | None:
        """The GPU index an index or handle addresses; None for none or an undecodable handle (the
        call then fails the same way in both modes, inside `op`)."""
        if on is None or isinstance(on, int):
            return on
        try:
            ref = parse(on, Kind.DEVICE, Kind.GPU_INSTANCE, Kind.COMPUTE_INSTANCE, Kind.MIG_DEVICE)
        except pynvml.NVMLError:
            return None
        return ref.gpu

    def _invoke(
        self, name: str, op: Callable[[SimState], T], *, needs_init: bool = True, on: Any = None
    ) -> T:
        """Run simulated call `name`; `on` is the GPU index or handle it addresses, if any."""
        if needs_init and self._init_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if self._memory is not None:
            return self._memory.call(name, op, self._gpu_of(on))
        assert self._store is not None
        if not self._store.exists():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        error: pynvml.NVMLError | None = None
        result: Any = None
        with self._store.transaction() as st:
            code = st.take_fault(name, st.count_call(name))
            delay = st.latency_for(name)
            if code is not None:
                error = pynvml.NVMLError(code)
            else:
                before = copy.deepcopy(st)
                try:
                    result = op(st)
                except pynvml.NVMLError as exc:
                    vars(st).update(vars(before))  # keep the call count, drop partial changes
                    error = exc
        if delay > 0:
            time.sleep(delay)
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]

    @staticmethod
    def _device(st: SimState, handle: Any) -> tuple[int, GpuState]:
        ref = parse(handle, Kind.DEVICE)
        return ref.gpu, rules.gpu_at(st, ref.gpu)

    @staticmethod
    def _gpu_instance(st: SimState, handle: Any) -> tuple[int, GpuState, GiState]:
        ref = parse(handle, Kind.GPU_INSTANCE)
        gpu = rules.gpu_at(st, ref.gpu)
        gi = rules.find_gi(gpu, ref.gi)
        if not ref.matches_serial(gi.serial):
            rules.fail(pynvml.NVML_ERROR_NOT_FOUND)
        return ref.gpu, gpu, gi

    @staticmethod
    def _mig_or_ci(st: SimState, handle: Any, kind: Kind) -> tuple[int, GpuState, GiState, CiState]:
        ref = parse(handle, kind)
        gpu = rules.gpu_at(st, ref.gpu)
        gi = rules.find_gi(gpu, ref.gi)
        ci = rules.find_ci(gi, ref.ci)
        if not ref.matches_serial(ci.serial):
            rules.fail(pynvml.NVML_ERROR_NOT_FOUND)
        return ref.gpu, gpu, gi, ci

    @staticmethod
    def _gi_handle(index: int, gi: GiState) -> Any:
        return make(HandleRef(Kind.GPU_INSTANCE, index, gi.id, 0, gi.serial))

    @staticmethod
    def _ci_handle(index: int, gi: GiState, ci: CiState) -> Any:
        return make(HandleRef(Kind.COMPUTE_INSTANCE, index, gi.id, ci.id, ci.serial))

    @staticmethod
    def _mig_handle(index: int, gi: GiState, ci: CiState) -> Any:
        return make(HandleRef(Kind.MIG_DEVICE, index, gi.id, ci.id, ci.serial))

    @staticmethod
    def _fill_array(array: Any, count_ref: Any, items: list[Any], minimum_capacity: int) -> None:
        count = out_param(count_ref)
        if array is None or len(array) < max(minimum_capacity, len(items)):
            count.value = len(items)
            rules.fail(
                pynvml.NVML_ERROR_INSUFFICIENT_SIZE
                if array is not None
                else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        for i, item in enumerate(items):
            array[i] = item
        count.value = len(items)
