"""Writing the in-memory simulator's state back to its file (backend spec `sim-memory:<path>`).

The file-backed mode makes every simulated NVML call, read-only queries included, a locked
load/copy/save/rename of the node's one state file, so a node's calls run one at a time at a cost
(milliseconds each) that real NVML queries do not have. The plugin's benchmarks then measure the
simulator. `sim-memory:` loads the file once into a `MemoryState` (per-GPU locks, latency slept per
GPU) and keeps the file current only where it matters to other processes: after each call that changed
a GPU (MIG mode, GI/CI create/destroy), before that call returns. So tests and benchmarks that read the
file (`SimAdmin.snapshot`, `instances()`) still see the hardware, and a killed plugin's successor
loads what a real driver would have kept: every change whose result a caller could have seen.

What the file does not get: read-only calls write nothing, so its call counts are those of the last
change; and what other processes write to it after the load (faults, latencies, events, processes) is
never read, and is overwritten by the next change. Tests of those keep the file-backed mode.

Each write is atomic (rename) but not fsynced: a simulated GPU needs to survive a killed process, not
a power loss. Writes are serialised by one lock, and each GPU's part is the one its last change left
(taken under that GPU's lock), so a write never shows a GPU in the middle of another call.
"""

from __future__ import annotations

import threading
from typing import Any

from driver.nvml.sim.state import GpuState, SimState, StateFile, plain


class WriteBack:
    """The file a `MemoryState` writes its changes to, and each GPU's state as last written."""

    def __init__(self, store: StateFile, state: SimState) -> None:
        self._store = store
        self._gpus: list[Any] = [plain(gpu) for gpu in state.gpus]
        self._lock = threading.Lock()

    @staticmethod
    def _meta(state: SimState) -> dict[str, Any]:
        return {name: plain(value) for name, value in vars(state).items() if name != "gpus"}

    def store(self, index: int, gpu: GpuState, state: SimState, meta_lock: threading.Lock) -> None:
        """Write the state with GPU `index` as it is now; the caller holds that GPU's lock.

        The bookkeeping (serial counter, call counts) is read under this write's lock, so a later
        write never carries an older serial counter than an instance the file already holds.
        """
        with self._lock:
            self._gpus[index] = plain(gpu)
            with meta_lock:
                raw = self._meta(state)
            raw["gpus"] = list(self._gpus)
            self._store.store_raw(raw)

    def store_all(self, state: SimState) -> None:
        """Write everything; the caller holds every GPU lock and the bookkeeping lock (`SimAdmin`)."""
        with self._lock:
            self._gpus = [plain(gpu) for gpu in state.gpus]
            raw = self._meta(state)
            raw["gpus"] = list(self._gpus)
            self._store.store_raw(raw)
