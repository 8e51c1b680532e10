"""Choosing the NVML backend: the real `pynvml` bindings or the file-backed simulator."""

from __future__ import annotations

import importlib
import os

from driver.nvml.port import Nvml

ENV_VAR = "FLEXMIG_NVML"
_SIM_PREFIX = "sim:"
_ALLOWED = '"real" or "sim:<state file path>"'


def nvml_spec_from_env(default: str = "real") -> str:
    """The backend spec from $FLEXMIG_NVML, or `default` when unset or empty."""
    return os.environ.get(ENV_VAR, "").strip() or default


def open_nvml(spec: str) -> Nvml:
    """An uninitialised `Nvml` for `spec`; call `init()` (or use it as a context manager)."""
    if spec == "real":
        # Imported here so that merely importing flexmig never needs nvidia-ml-py; the shared library
        # itself is only loaded by nvmlInit, which fails with LIBRARY_NOT_FOUND / DRIVER_NOT_LOADED.
        return Nvml(importlib.import_module("pynvml"), description="real")
    if spec.startswith(_SIM_PREFIX) and spec[len(_SIM_PREFIX) :].strip():
        from driver.nvml.sim import open_sim

        return open_sim(spec[len(_SIM_PREFIX) :].strip())
    raise ValueError(f"{ENV_VAR}: invalid NVML backend {spec!r}; allowed: {_ALLOWED}")
