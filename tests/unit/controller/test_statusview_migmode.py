"""`flexmig status` names an Ampere GPU whose MIG mode is off (its node published `migMode: off` on the
whole GPU) with the fix, in text and in JSON; a Hopper GPU, which switches at prepare, is not named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from controller.state.inventory import Inventory
from controller.views.statusdata import status_document
from controller.views.statusmodel import collect_allocations
from controller.views.statusview import render
from driver.catalog.discover import discover_all
from driver.nvml.sim import SimGpuSpec, init_sim_state, open_sim
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = "n1"


def _slices(tmp_path: Path) -> list[dict[str, Any]]:
    state = tmp_path / "sim.json"
    init_sim_state(
        state, [SimGpuSpec("A100-40GB", mig_enabled=False), SimGpuSpec("H100-80GB", mig_enabled=False)]
    )
    nvml = open_sim(state)
    nvml.init()
    with structlog.testing.capture_logs():
        catalogs = discover_all(nvml)
    modes = {g.index: nvml.mig_mode(g.index).current for g in nvml.gpus()}
    built = build_node_slices(catalogs, NODE, 1, NodeConfig(NODE, OperatingMode.MIG), modes)
    return [s.body for s in built.slices]


def _block(text: str, index: int) -> str:
    return next(b for b in text.split("\n\n") if b.startswith(f"{NODE}  GPU {index} "))


def test_text_names_mig_mode_off_with_the_fix(tmp_path: Path) -> None:
    text = render(Inventory(_slices(tmp_path)), collect_allocations([]))
    a100 = _block(text, 0)
    assert "MIG mode off" in a100 and "nvidia-smi -i 0 -mig 1" in a100 and "reset" in a100
    assert "MIG mode off" not in _block(text, 1)


def test_json_carries_mig_mode(tmp_path: Path) -> None:
    doc = status_document(Inventory(_slices(tmp_path)), collect_allocations([]))
    by_index = {g["index"]: g for g in doc["gpus"]}
    assert by_index[0]["migMode"] == "off" and by_index[0]["migModeChangeNeedsReset"] is True
    assert by_index[1]["migMode"] is None and by_index[1]["migModeChangeNeedsReset"] is False
