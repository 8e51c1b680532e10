"""NVML simulator: a pynvml-compatible library plus an admin API for tests.

Two modes with the same hardware rules: file-backed (`open_sim(path)`: every call is a locked
transaction on a state file other processes share and crashes keep) and in-memory (`open_sim(memory)`
with a `MemoryState` from `init_memory_sim` or `MemoryState.from_file`: per-GPU locks, nothing shared
with other processes unless loaded with `write_back=True`, which writes each change back to the file).
Tests use the file mode unless they opt in.
"""

from __future__ import annotations

import os

from driver.nvml.port import Nvml
from driver.nvml.sim.admin import (
    SimAdmin,
    SimComputeInstanceView,
    SimGpuInstanceView,
    SimGpuSpec,
    SimGpuView,
    SimSnapshot,
    init_memory_sim,
    init_sim_state,
)
from driver.nvml.sim.hardware import SKUS, CiProfileRow, GiProfileRow, Sku, Variant
from driver.nvml.sim.library import SimulatedNvmlLibrary
from driver.nvml.sim.memory import MemoryState
from driver.nvml.sim.state import MigOffQueries


def open_sim(source: str | os.PathLike[str] | MemoryState, *, description: str | None = None) -> Nvml:
    """An uninitialised `Nvml` over the simulator state file at `source`, or over an in-memory state."""
    if isinstance(source, MemoryState):
        return Nvml(SimulatedNvmlLibrary(source), description=description or "sim:memory")
    return Nvml(SimulatedNvmlLibrary(os.fspath(source)), description=f"sim:{os.fspath(source)}")


__all__ = [
    "SKUS",
    "CiProfileRow",
    "GiProfileRow",
    "MemoryState",
    "MigOffQueries",
    "SimAdmin",
    "SimComputeInstanceView",
    "SimGpuInstanceView",
    "SimGpuSpec",
    "SimGpuView",
    "SimSnapshot",
    "SimulatedNvmlLibrary",
    "Sku",
    "Variant",
    "init_memory_sim",
    "init_sim_state",
    "open_sim",
]
