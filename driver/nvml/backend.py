"""Choosing the NVML backend: the real `pynvml` bindings or the simulator.

`sim:<path>` is the file-backed simulator: every call a locked transaction on the state file, shared
with other processes (tests arming faults while the plugin runs). `sim-memory:<path>` loads that file
once into this process, runs calls under per-GPU locks as hardware does, and writes changes back to
the file before each changing call returns (driver/nvml/sim/writeback.py): for benchmarks, where the
file mode's per-call cost would be measured instead of flexmig's.
"""

from __future__ import annotations

import importlib
import os

from driver.nvml.port import Nvml

ENV_VAR = "FLEXMIG_NVML"
_SIM_PREFIX = "sim:"
_SIM_MEMORY_PREFIX = "sim-memory:"
_ALLOWED = '"real", "sim:<state file path>" or "sim-memory:<state file path>"'


def nvml_spec_from_env(default: str = "real") -> str:
    """The backend spec from $FLEXMIG_NVML, or `default` when unset or empty."""
    return os.environ.get(ENV_VAR, "").strip() or default


def open_nvml(spec: str) -> Nvml:
    """An uninitialised `Nvml` for `spec`; call `init()` (or use it as a context manager)."""
    if spec == "real":
        # Imported here so that merely importing flexmig never needs nvidia-ml-py; the shared library
        # itself is only loaded by nvmlInit, which fails with LIBRARY_NOT_FOUND / DRIVER_NOT_LOADED.
        return Nvml(importlib.import_module("pynvml"), description="real")
    if spec.startswith(_SIM_MEMORY_PREFIX) and spec[len(_SIM_MEMORY_PREFIX) :].strip():
        from driver.nvml.sim import MemoryState, open_sim

        path = spec[len(_SIM_MEMORY_PREFIX) :].strip()
        if not os.path.exists(path):
            # No state to load: the file mode's library fails `init()` with DRIVER_NOT_LOADED, which
            # is how callers learn of a missing simulator (as of a missing driver) in either mode.
            return open_sim(path)
        return open_sim(MemoryState.from_file(path, write_back=True), description=f"sim-memory:{path}")
    if spec.startswith(_SIM_PREFIX) and spec[len(_SIM_PREFIX) :].strip():
        from driver.nvml.sim import open_sim

        return open_sim(spec[len(_SIM_PREFIX) :].strip())
    raise ValueError(f"{ENV_VAR}: invalid NVML backend {spec!r}; allowed: {_ALLOWED}")
