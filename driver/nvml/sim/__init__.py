"""File-backed NVML simulator: a pynvml-compatible library plus an admin API for tests."""

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
    init_sim_state,
)
from driver.nvml.sim.hardware import SKUS, CiProfileRow, GiProfileRow, Sku, Variant
from driver.nvml.sim.library import SimulatedNvmlLibrary
from driver.nvml.sim.state import MigOffQueries


def open_sim(path: str | os.PathLike[str]) -> Nvml:
    """An uninitialised `Nvml` over the simulator state at `path`."""
    return Nvml(SimulatedNvmlLibrary(os.fspath(path)), description=f"sim:{os.fspath(path)}")


__all__ = [
    "SKUS",
    "CiProfileRow",
    "GiProfileRow",
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
    "init_sim_state",
    "open_sim",
]
