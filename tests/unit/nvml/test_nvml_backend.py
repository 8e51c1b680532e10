"""Backend selection and the real pynvml backend on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from driver.nvml.backend import nvml_spec_from_env, open_nvml
from driver.nvml.sim import SimGpuSpec, init_sim_state
from driver.nvml.types import NvmlError, NvmlErrorCode

REPO = Path(__file__).resolve().parents[3]


def _has_nvidia_gpu() -> bool:
    return Path("/dev/nvidiactl").exists()


def test_spec_validation() -> None:
    for bad in ("", "sim:", "sim-memory:", "fake", "SIM:/x"):
        allowed = r"\"real\", \"sim:<state file path>\" or \"sim-memory:<state file path>\""
        with pytest.raises(ValueError, match=r"FLEXMIG_NVML.*" + allowed):
            open_nvml(bad)


def test_sim_spec(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    init_sim_state(path, [SimGpuSpec("H100-80GB")])
    with open_nvml(f"sim:{path}") as nvml:
        assert nvml.gpu(0).name == "NVIDIA H100 80GB HBM3"


def test_sim_memory_spec(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    init_sim_state(path, [SimGpuSpec("H100-80GB")])
    with open_nvml(f"sim-memory:{path}") as nvml:
        assert nvml.gpu(0).name == "NVIDIA H100 80GB HBM3"
    # A missing state file fails at init, as a missing driver does, not when the backend is opened.
    missing = open_nvml(f"sim-memory:{tmp_path / 'absent.json'}")
    with pytest.raises(NvmlError) as exc:
        missing.init()
    assert exc.value.code is NvmlErrorCode.DRIVER_NOT_LOADED


def test_spec_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEXMIG_NVML", raising=False)
    assert nvml_spec_from_env() == "real"
    assert nvml_spec_from_env(default="sim:/x") == "sim:/x"
    monkeypatch.setenv("FLEXMIG_NVML", "sim:/tmp/a.json")
    assert nvml_spec_from_env() == "sim:/tmp/a.json"


def test_pynvml_is_imported_lazily() -> None:
    code = "import sys, driver.nvml.backend, driver.nvml.port; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(_has_nvidia_gpu(), reason="an NVIDIA driver is present")
def test_real_backend_without_gpu_fails_cleanly() -> None:
    nvml = open_nvml("real")
    with pytest.raises(NvmlError) as exc:
        nvml.init()
    assert exc.value.code in (NvmlErrorCode.DRIVER_NOT_LOADED, NvmlErrorCode.LIBRARY_NOT_FOUND)
    assert exc.value.function == "nvmlInit"
