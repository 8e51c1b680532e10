"""Built-in catalogs (NVML refused with MIG off) are checked against NVML once MIG is on.

Runs the plugin's own pieces (discovery, the slice builder, the inventory) over the NVML simulator in
both behaviours of its MIG-off switch; the republish decision is what the publisher gets from the
builder it calls on every sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from api.constants import mig_device_name, whole_gpu_device_name
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist, parse_allowlist
from driver.catalog.discover import discover_all
from driver.catalog.types import ProfileOrigin
from driver.nvml.port import Nvml
from driver.nvml.sim import MigOffQueries, SimAdmin, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import GiProfileInfo, GpuInfo, MigMode, NvmlErrorCode
from kubeletplugin.publish.inventory import CatalogVerifier, Inventory, verifying_builder
from kubeletplugin.publish.publisher import content_hash
from kubeletplugin.publish.slices import NodeSlices, build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = NodeConfig(name="node-a", operating_mode=OperatingMode.MIG)
ALLOW = DEFAULT_MIG_PROFILE_ALLOWLIST


@pytest.fixture
def nvml(tmp_path: Path) -> Iterator[Nvml]:
    path = tmp_path / "state.json"
    init_sim_state(
        path,
        [
            SimGpuSpec("H100-80GB", mig_enabled=False, mig_off_queries=MigOffQueries.REFUSE),
            SimGpuSpec("H200-141GB", mig_enabled=False, mig_off_queries=MigOffQueries.ANSWER),
        ],
    )
    with open_sim(path) as port:
        yield port


def _build(cats: Any, generation: int) -> NodeSlices:
    return build_node_slices(list(cats), NODE.name, generation, NODE, {c.gpu.index: False for c in cats})


def _device_names(slices: NodeSlices) -> set[str]:
    return {d["name"] for s in slices.slices for d in s.body["spec"].get("devices") or []}


def _setup(
    source: Any, allow: MigProfileAllowlist = ALLOW
) -> tuple[CatalogVerifier, Inventory, Any, NodeSlices]:
    cats = discover_all(source, allow)
    first = _build(cats, 0)
    inventory = Inventory.published(cats, first)
    verifier = CatalogVerifier(source, cats, allow)
    return verifier, inventory, verifying_builder(verifier, inventory, _build), first


def test_mig_devices_published_before_mig_is_on_from_builtin_table(nvml: Nvml) -> None:
    verifier, inventory, build, first = _setup(nvml)
    assert [c.origin for c in verifier.catalogs()] == [ProfileOrigin.BUILTIN, ProfileOrigin.NVML]
    names = _device_names(first)
    assert whole_gpu_device_name(0) in names
    assert mig_device_name(0, "3g.40gb", 9, 4) in names  # from the built-in table, MIG still off
    assert inventory.get(mig_device_name(0, "3g.40gb", 9, 4)) is not None
    assert verifier.pending() == [0]
    # MIG still off: nothing to check, nothing changes.
    assert content_hash(build(1)) == content_hash(first)
    assert verifier.pending() == [0]


def test_matching_nvml_confirms_without_republishing(nvml: Nvml) -> None:
    verifier, inventory, build, first = _setup(nvml)
    before = inventory.names()
    assert nvml.set_mig_mode(0, True) is None
    with structlog.testing.capture_logs() as logs:
        again = build(1)
    assert verifier.pending() == []
    assert verifier.catalogs()[0].origin is ProfileOrigin.NVML
    assert content_hash(again) == content_hash(first)  # same content: the publisher writes nothing
    assert inventory.names() == before
    assert any(e["event"] == "NVML confirms the built-in MIG profile table" for e in logs)
    # Checked once: MIG going off again does not bring the built-in table back.
    assert nvml.set_mig_mode(0, False) is None
    assert content_hash(build(2)) == content_hash(first) and verifier.pending() == []


class _Drifted:
    """NVML with MIG on reports 256 MiB less per profile than the built-in table (another driver)."""

    def __init__(self, port: Nvml, rename: str | None = None) -> None:
        self.port = port
        self.rename = rename

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.port.device_count())]

    def gpu(self, index: int) -> GpuInfo:
        info = self.port.gpu(index)
        return info if self.rename is None else dataclasses.replace(info, name=self.rename)

    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        return [dataclasses.replace(p, memory_mib=p.memory_mib - 256) for p in self.port.gi_profiles(index)]

    def mig_mode(self, index: int) -> MigMode:
        return self.port.mig_mode(index)


def test_differing_nvml_republishes_and_swaps_the_inventory(nvml: Nvml) -> None:
    source = _Drifted(nvml)
    verifier, inventory, build, first = _setup(source)
    name = mig_device_name(0, "3g.40gb", 9, 4)
    old = inventory.get(name)
    assert old is not None and old.profile is not None and old.profile.memory_mib == 40448
    assert content_hash(build(1)) == content_hash(first)
    assert nvml.set_mig_mode(0, True) is None
    with structlog.testing.capture_logs() as logs:
        again = build(2)
    assert content_hash(again) != content_hash(first)  # the publisher writes a new generation
    new = inventory.get(name)
    assert new is not None and new.profile is not None and new.profile.memory_mib == 40448 - 256
    (event,) = [e for e in logs if e["log_level"] == "warning"]
    assert event["gpu"] == 0 and "memory_mib 40448->40192" in " ".join(event["differences"])
    assert verifier.pending() == []


def test_unknown_model_gets_mig_devices_once_nvml_answers(nvml: Nvml) -> None:
    source = _Drifted(nvml, rename="NVIDIA H100X-TEST")
    allow = parse_allowlist([{"models": ["NVIDIA H100X-TEST"], "profiles": ["3g.40gb"]}])
    verifier, inventory, build, first = _setup(source, allow)
    # GPU 1 (an H200 that answers with MIG off) offers no 3g.40gb: whole GPU there too.
    assert [c.origin for c in verifier.catalogs()] == [ProfileOrigin.REFUSED, ProfileOrigin.NVML]
    assert sorted(_device_names(first)) == [whole_gpu_device_name(0), whole_gpu_device_name(1)]
    assert content_hash(build(1)) == content_hash(first)
    assert nvml.set_mig_mode(0, True) is None
    again = build(2)
    cat = verifier.catalogs()[0]
    assert cat.origin is ProfileOrigin.NVML and [p.name for p in cat.profiles] == ["3g.40gb"]
    added = {mig_device_name(0, "3g.40gb", 9, 0), mig_device_name(0, "3g.40gb", 9, 4)}
    assert _device_names(again) == _device_names(first) | added
    assert all(inventory.get(n) is not None for n in added)
    assert verifier.pending() == []


def test_verifier_keeps_waiting_through_nvml_errors(nvml: Nvml, tmp_path: Path) -> None:
    verifier, _, build, _ = _setup(nvml)
    assert nvml.set_mig_mode(0, True) is None
    SimAdmin(tmp_path / "state.json").inject_fault("nvmlDeviceGetMigMode", 1, NvmlErrorCode.UNKNOWN)
    with structlog.testing.capture_logs() as logs:
        build(1)
    assert verifier.pending() == [0]  # the error left it waiting
    assert any(e["event"].startswith("cannot check the GPU's MIG profiles") for e in logs)
    build(2)
    assert verifier.pending() == []
