"""The simulator's fast mode: the state lives in this process's memory, with one lock per GPU.

The file-backed mode (`state.StateFile`) makes every simulated NVML call a locked read-modify-write of
one JSON file, so a second process (a test, a restarted plugin) sees the same "hardware" and a crash
keeps it; the price is that every call on the node waits for every other. This mode applies the same
hardware rules (`rules`) to the same `SimState`, but

- calls on different GPUs run in parallel: each holds only its GPU's lock, as the driver reconfigures
  one GPU at a time [U: per-GPU serialisation of MIG changes in the real driver is assumed];
- the configured latency is slept while holding that GPU's lock, after the call's effect is applied,
  so latencies add up per GPU, not per node;
- call counting, armed faults, latencies and pending events sit behind one short lock, taken only for
  the bookkeeping and never while sleeping;
- nothing survives the process, unless the state was loaded with `from_file(path, write_back=True)`
  (backend spec `sim-memory:<path>`, see `writeback.py`): then every call that changed a GPU writes the
  state back to the file before it returns, so other processes and a restarted one see the hardware.
  Faults, latencies and events set on the file after the load are not seen; crash tests and fault
  tests keep using the file-backed mode.

A failed call leaves its GPU untouched, as in the file mode: the calls that change a GPU
(`MUTATING_CALLS`) first copy the GPU's state and put the copy back when they raise. Every other call
only reads GPU state.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pynvml

from driver.nvml.sim.state import CiState, EventState, GiState, GpuState, ProcessState, SimState, StateFile
from driver.nvml.sim.writeback import WriteBack

T = TypeVar("T")

MUTATING_CALLS = frozenset(
    {
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        "nvmlComputeInstanceDestroy",
    }
)


def _clone_gpu(gpu: GpuState) -> GpuState:
    # By hand rather than copy.deepcopy: this runs on every mutating call and is ~10x cheaper.
    return GpuState(
        sku=gpu.sku,
        uuid=gpu.uuid,
        mig_current=gpu.mig_current,
        mig_pending=gpu.mig_pending,
        gis=[
            GiState(
                gi.id, gi.profile_id, gi.start, gi.size, gi.serial, [CiState(**vars(ci)) for ci in gi.cis]
            )
            for gi in gpu.gis
        ],
        processes=[ProcessState(p.pid, p.gi_id, p.ci_id) for p in gpu.processes],
        mig_off_queries=gpu.mig_off_queries,
    )


class MemoryState:
    """In-process simulator state shared by every library (`open_sim`) and `SimAdmin` built on it."""

    def __init__(self, state: SimState, write_back: StateFile | None = None) -> None:
        self._state = state
        self._meta = threading.Lock()  # call counts, faults, latencies, events
        self._gpu_locks = [threading.Lock() for _ in state.gpus]
        self._write_back = WriteBack(write_back, state) if write_back is not None else None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, write_back: bool = False) -> MemoryState:
        """Load a state file (e.g. one written by `init_sim_state`). Later changes stay in memory, or
        with `write_back` are also written back to the file by each call that made them."""
        store = StateFile(path)
        if not store.exists():
            raise FileNotFoundError(f"simulator state {os.fspath(path)} does not exist")
        return cls(store.read(), store if write_back else None)

    def exists(self) -> bool:
        return True

    def gpu_count(self) -> int:
        return len(self._gpu_locks)

    def call(self, name: str, op: Callable[[SimState], T], gpu: int | None) -> T:
        """Run one simulated call: count it, apply an armed fault or `op`, sleep its latency.

        `gpu` is the GPU the call addresses (None: none, or not decodable; such calls touch no GPU
        state, and `op` then runs under the bookkeeping lock).
        """
        st = self._state
        with self._meta:
            code = st.take_fault(name, st.count_call(name))
            delay = st.latency_for(name)
        if code is not None:
            if delay > 0:
                time.sleep(delay)
            raise pynvml.NVMLError(code)
        if gpu is None or not 0 <= gpu < len(self._gpu_locks):
            with self._meta:
                result = op(st)
            if delay > 0:
                time.sleep(delay)
            return result
        with self._gpu_locks[gpu]:
            saved = _clone_gpu(st.gpus[gpu]) if name in MUTATING_CALLS else None
            try:
                result = op(st)
            except pynvml.NVMLError:
                if saved is not None:
                    st.gpus[gpu] = saved
                if delay > 0:
                    time.sleep(delay)
                raise
            if saved is not None and self._write_back is not None:
                # Before the latency and the return, still under the GPU's lock: once a caller sees the
                # result, the file holds it, so a killed plugin's successor finds what a driver keeps.
                self._write_back.store(gpu, st.gpus[gpu], st, self._meta)
            if delay > 0:
                time.sleep(delay)
            return result

    def call_counts(self) -> dict[str, int]:
        """Calls so far per function; unlike `read`, this never waits for a GPU busy in a call."""
        with self._meta:
            return dict(self._state.call_counts)

    def pop_event(self, match: Callable[[list[EventState]], EventState | None]) -> EventState | None:
        """Remove and return the first pending event `match` picks."""
        with self._meta:
            event = match(self._state.events)
            if event is not None:
                self._state.events.remove(event)
            return event

    @contextlib.contextmanager
    def _everything(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for lock in self._gpu_locks:  # ascending, like every multi-GPU holder
                stack.enter_context(lock)
            stack.enter_context(self._meta)
            yield

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SimState]:
        """The live state with every lock held (for `SimAdmin`); an exception undoes all changes."""
        with self._everything():
            before = copy.deepcopy(self._state)
            try:
                yield self._state
            except BaseException:
                vars(self._state).update(vars(before))
                raise
            if self._write_back is not None:
                self._write_back.store_all(self._state)

    def read(self) -> SimState:
        """A consistent deep copy."""
        with self._everything():
            return copy.deepcopy(self._state)
