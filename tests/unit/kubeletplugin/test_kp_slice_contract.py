"""The published device contract (api/devicecontract.py) from both sides: what the node writes into its
ResourceSlices uses only the contract's names, and the controller's inventory reads back what was meant."""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_kp_slices import NODE, catalogs_for

from api import devicecontract as dc
from api.constants import MEMORY_SLICE_COUNTER_PREFIX, DeviceKind, parse_device_name
from controller.state.inventory import Inventory
from driver.policy.model import GpuRef
from kubeletplugin.publish.slicelimits import is_dns_label
from kubeletplugin.publish.slices import NodeSlices, build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
ATTRIBUTES = {v for k, v in vars(dc).items() if k.startswith("ATTR_")}
CAPACITIES = {v for k, v in vars(dc).items() if k.startswith("CAP_")}
COUNTERS = {d.counter for d in dc.DIMENSIONS}


def _slices(model: str, mode: OperatingMode, mig_on: bool) -> NodeSlices:
    cats = catalogs_for(model, 2, every_profile=False)
    return build_node_slices(cats, NODE, 1, NodeConfig(NODE, mode), {c.gpu.index: mig_on for c in cats})


def _devices(ns: NodeSlices) -> list[dict[str, Any]]:
    return [d for s in ns.slices for d in s.body["spec"].get("devices", [])]


def test_contract_names_are_what_the_api_accepts() -> None:
    # Attribute and capacity names are C identifiers (<= 32), counter names DNS labels.
    assert all(_C_IDENTIFIER.fullmatch(n) for n in ATTRIBUTES | CAPACITIES), ATTRIBUTES | CAPACITIES
    assert all(is_dns_label(n) for n in COUNTERS)
    assert set(dc.SHARED_CAPACITY_NAMES) <= CAPACITIES
    assert tuple(d.capacity for d in dc.DIMENSIONS if d != dc.MEMORY_DIMENSION) == dc.ENGINE_CAPACITIES
    assert dc.dimension_quantity(dc.MEMORY_DIMENSION, 5) == "5Mi"
    assert dc.dimension_quantity(dc.DIMENSIONS[1], 5) == "5"


@pytest.mark.parametrize(
    ("model", "mode", "mig_on"),
    [
        ("H100-80GB", OperatingMode.MIG, False),
        ("A100-40GB", OperatingMode.MIG, True),
        ("H100-80GB", OperatingMode.HAMI_CORE, False),
    ],
)
def test_the_node_publishes_only_contract_names(model: str, mode: OperatingMode, mig_on: bool) -> None:
    ns = _slices(model, mode, mig_on)
    devices = _devices(ns)
    assert devices
    for dev in devices:
        assert set(dev["attributes"]) <= ATTRIBUTES, dev["name"]
        assert set(dev["capacity"]) <= CAPACITIES, dev["name"]
        for use in dev.get("consumesCounters", ()):
            for counter in use["counters"]:
                assert counter in COUNTERS or counter.startswith(MEMORY_SLICE_COUNTER_PREFIX), counter
    types = {dev["attributes"][dc.ATTR_TYPE]["string"] for dev in devices}
    kinds = {parse_device_name(dev["name"]).kind for dev in devices}
    expected = {
        DeviceKind.MIG: dc.TYPE_MIG,
        DeviceKind.WHOLE: dc.TYPE_WHOLE_GPU,
        DeviceKind.SHARED: dc.TYPE_SHARED,
    }
    assert types == {expected[k] for k in kinds}


@pytest.mark.parametrize(("model", "mig_on"), [("H100-80GB", False), ("A100-40GB", True)])
def test_the_controller_reads_back_every_published_profile(model: str, mig_on: bool) -> None:
    cats = catalogs_for(model, 2, every_profile=False)
    ns = build_node_slices(
        cats, NODE, 1, NodeConfig(NODE, OperatingMode.MIG), {c.gpu.index: mig_on for c in cats}
    )
    inv = Inventory([s.body for s in ns.slices])
    for cat in cats:
        got = inv.gpus[GpuRef(NODE, cat.gpu.index)].catalog
        assert (got.gpu.uuid, got.gpu.name, got.model, got.gpu.architecture) == (
            cat.gpu.uuid,
            cat.gpu.name,
            cat.model,
            cat.gpu.architecture,
        )
        assert got.memory_slices == cat.memory_slices and got.compute_slices == cat.compute_slices

        def shape(p: Any) -> tuple[Any, ...]:
            return (
                p.name,
                p.gi_profile_id,
                p.memory_slices,
                p.compute_slices,
                p.memory_mib,
                p.multiprocessors,
                p.copy_engines,
                p.decoders,
                p.encoders,
                p.jpegs,
                p.ofas,
                p.placements,
            )

        assert sorted(map(shape, got.profiles)) == sorted(map(shape, cat.profiles))


def test_the_controller_reads_back_a_shared_gpu() -> None:
    ns = _slices("H100-80GB", OperatingMode.HAMI_CORE, False)
    inv = Inventory([s.body for s in ns.slices])
    cat = catalogs_for("H100-80GB", 1)[0]
    info = inv.shared[GpuRef(NODE, 0)]
    assert info.uuid == cat.gpu.uuid
    assert set(info.capacity) == set(dc.SHARED_CAPACITY_NAMES)
    total = info.total()
    assert (total.memory_mib, total.cores, total.shares) == (cat.gpu.memory_total_mib, 100, info.split_count)
