from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driver.nvml.port import Nvml
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim

SimFactory = Callable[..., tuple[Nvml, SimAdmin, Path]]


@pytest.fixture
def make_sim(tmp_path: Path) -> Iterator[SimFactory]:
    """Create a state file for the given SKUs and return (initialised port, admin, path)."""
    opened: list[Nvml] = []

    def factory(*skus: str, mig_enabled: bool = True) -> tuple[Nvml, SimAdmin, Path]:
        path = tmp_path / "sim.json"
        init_sim_state(path, [SimGpuSpec(s, mig_enabled=mig_enabled) for s in skus], overwrite=True)
        nvml = open_sim(path)
        nvml.init()
        opened.append(nvml)
        return nvml, SimAdmin(path), path

    yield factory
    for nvml in opened:
        nvml.shutdown()
