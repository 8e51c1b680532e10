from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driver.nvml.port import Nvml
from driver.nvml.sim import MemoryState, SimAdmin, SimGpuSpec, init_sim_state, open_sim

SimFactory = Callable[..., tuple[Nvml, SimAdmin, Path]]


@pytest.fixture
def sim_mode() -> str:
    """The simulator mode `make_sim` builds: "file" here; a module opts into the in-memory mode too by
    overriding this fixture with params=["file", "memory"]."""
    return "file"


@pytest.fixture
def make_sim(tmp_path: Path, sim_mode: str) -> Iterator[SimFactory]:
    """Create a state file for the given SKUs and return (initialised port, admin, path).

    In "memory" mode the port and admin share an in-memory state loaded from that file, which then no
    longer follows it (tests that reopen `path` stay file-only)."""
    opened: list[Nvml] = []

    def factory(*skus: str, mig_enabled: bool = True) -> tuple[Nvml, SimAdmin, Path]:
        path = tmp_path / "sim.json"
        init_sim_state(path, [SimGpuSpec(s, mig_enabled=mig_enabled) for s in skus], overwrite=True)
        if sim_mode == "memory":
            memory = MemoryState.from_file(path)
            nvml, admin = open_sim(memory), SimAdmin(memory)
        else:
            nvml, admin = open_sim(path), SimAdmin(path)
        nvml.init()
        opened.append(nvml)
        return nvml, admin, path

    yield factory
    for nvml in opened:
        nvml.shutdown()
