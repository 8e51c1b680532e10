"""The Ampere MIG-mode precondition on the NVML simulator: the whole-GPU attributes, the gauges, the log
warning and the Node event appear for an A100 with MIG off on a mig node, and not on a hami-core node,
not where the allowlist gives the model no profile, and not for a Hopper GPU (it switches at prepare)."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from api import devicecontract as dc
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist, parse_allowlist
from driver.catalog.discover import discover_all
from driver.catalog.types import GpuCatalog
from driver.nvml.port import Nvml
from driver.nvml.sim import SimGpuSpec, init_sim_state, open_sim
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.agent.migmodecheck import MIG_MODE_OFF_EVENT, MigModeMonitor
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = "n1"
MIG = NodeConfig(NODE, OperatingMode.MIG)
HAMI = NodeConfig(NODE, OperatingMode.HAMI_CORE)


@pytest.fixture
def nvml(tmp_path: Path) -> Nvml:
    """GPU 0: A100 with MIG off; GPU 1: H100 with MIG off; GPU 2: A100 with MIG on."""
    state = tmp_path / "sim.json"
    init_sim_state(
        state,
        [
            SimGpuSpec("A100-40GB", mig_enabled=False),
            SimGpuSpec("H100-80GB", mig_enabled=False),
            SimGpuSpec("A100-40GB", mig_enabled=True),
        ],
    )
    sim = open_sim(state)
    sim.init()
    return sim


def _catalogs(nvml: Nvml) -> list[GpuCatalog]:
    with structlog.testing.capture_logs():  # the A100's "no MIG profiles" warning is not under test
        return discover_all(nvml)


def _whole(nvml: Nvml, node: NodeConfig, index: int) -> dict[str, Any] | None:
    modes = {g.index: nvml.mig_mode(g.index).current for g in nvml.gpus()}
    built = build_node_slices(_catalogs(nvml), NODE, 0, node, modes)
    devices = [d for s in built.slices for d in s.body["spec"].get("devices") or []]
    return next((d for d in devices if d["name"] == f"gpu-{index}"), None)


class _Node:
    """A monitor with its metrics, the events it posted and the warnings it logged."""

    def __init__(self, nvml: Nvml, node: NodeConfig, allowlist: MigProfileAllowlist) -> None:
        self.metrics = NodeMetrics()
        self.events: list[tuple[str, str]] = []
        self.monitor = MigModeMonitor(
            nvml,
            _catalogs(nvml),
            node,
            allowlist,
            self.metrics,
            lambda reason, message: self.events.append((reason, message)),
        )
        self.nvml = nvml

    def check(self) -> list[MutableMapping[str, Any]]:
        with structlog.testing.capture_logs() as logs:
            self.monitor.check()
        return [e for e in logs if e["log_level"] == "warning"]

    def gauge(self, name: str, index: int) -> float | None:
        gpu = self.nvml.gpu(index)
        model = "A100-40GB" if "A100" in gpu.name else "H100-80GB"
        labels = {"gpu": str(index), "uuid": gpu.uuid, "model": model}
        return self.metrics.registry.get_sample_value(name, labels)


def test_whole_gpu_attributes(nvml: Nvml) -> None:
    a100 = _whole(nvml, MIG, 0)
    assert a100 is not None
    assert a100["attributes"][dc.ATTR_MIG_MODE] == {"string": "off"}
    assert a100["attributes"][dc.ATTR_MIG_MODE_CHANGE_NEEDS_RESET] == {"bool": True}
    # Hopper switches at prepare: its start-time mode would go stale, so it is not published.
    h100 = _whole(nvml, MIG, 1)
    assert h100 is not None
    assert h100["attributes"][dc.ATTR_MIG_MODE_CHANGE_NEEDS_RESET] == {"bool": False}
    assert dc.ATTR_MIG_MODE not in h100["attributes"]
    assert _whole(nvml, MIG, 2) is None  # A100 with MIG on: MIG devices only


def test_mig_off_ampere_reported_once(nvml: Nvml) -> None:
    node = _Node(nvml, MIG, DEFAULT_MIG_PROFILE_ALLOWLIST)
    warnings = node.check()
    assert [(w["gpu"], w["model"]) for w in warnings] == [(0, "A100-40GB")]
    assert "MIG mode off" in warnings[0]["event"] and "nvidia-smi -i 0 -mig 1" in warnings[0]["fix"]
    assert node.gauge("flexmig_node_gpu_mig_mode", 0) == 0
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 0) == 1
    assert node.gauge("flexmig_node_gpu_mig_mode", 1) == 0  # Hopper: off, and no problem
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 1) == 0
    assert node.gauge("flexmig_node_gpu_mig_mode", 2) == 1
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 2) == 0
    (event,) = node.events
    reason, message = event
    uuid = nvml.gpu(0).uuid
    assert reason == MIG_MODE_OFF_EVENT
    assert "GPU 0 " in message and uuid in message and "A100-40GB" in message
    assert "nvidia-smi -i 0 -mig 1" in message and "reset" in message
    assert node.monitor.blocked() == [0]

    assert node.check() == []  # nothing changed: no warning every loop
    assert len(node.events) == 1

    nvml.set_mig_mode(0, True)  # the administrator enabled it; the reset is still to come
    (again,) = node.check()
    assert again["gpu"] == 0 and again["enable_pending_reset"] is True
    assert len(node.events) == 1  # one event per GPU per plugin start
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 0) == 1


def test_hami_core_node_wants_mig_off(nvml: Nvml) -> None:
    node = _Node(nvml, HAMI, DEFAULT_MIG_PROFILE_ALLOWLIST)
    assert node.check() == []
    assert node.events == []
    assert node.gauge("flexmig_node_gpu_mig_mode", 0) == 0
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 0) == 0


def test_model_without_allowed_profiles_not_reported(nvml: Nvml) -> None:
    only_h100 = parse_allowlist([{"models": ["H100-SXM5-80GB"], "profiles": ["1g.10gb"]}])
    node = _Node(nvml, MIG, only_h100)
    assert node.check() == []
    assert node.events == []
    assert node.gauge("flexmig_node_gpu_mig_mode_needs_reset", 0) == 0


def test_filtered_gpu_not_reported(nvml: Nvml) -> None:
    node = _Node(
        nvml,
        NodeConfig(NODE, OperatingMode.MIG, filter_indexes=frozenset({0})),
        DEFAULT_MIG_PROFILE_ALLOWLIST,
    )
    assert node.check() == []
    assert node.events == []
