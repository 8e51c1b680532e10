"""ResourceSlice builder: API limits and the counter model, on 8- and 16-GPU nodes of every model."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from kubernetes.client import V1ResourceSlice

from api.constants import DRIVER_NAME, mig_device_name
from driver.catalog.discover import discover_all
from driver.catalog.types import GpuCatalog
from driver.nvml.sim.hardware import SKUS, Sku
from driver.nvml.types import GiProfileInfo, GpuInfo, Placement
from kubeletplugin.publish.gpudevices import capacity_counter_totals
from kubeletplugin.publish.slicelimits import is_dns_label, is_dns_subdomain, validate_pool
from kubeletplugin.publish.slices import NodeSlices, build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = "worker-a.example.internal"
MIG_NODE = NodeConfig(name=NODE, operating_mode=OperatingMode.MIG)


class _SkuSource:
    """A ProfileSource over the simulator's hardware tables (what the NVML port reports for them)."""

    def __init__(self, sku: Sku, count: int) -> None:
        self.sku = sku
        self._gpus = [
            GpuInfo(
                index=i,
                uuid=f"GPU-{i:08x}-0000-4000-8000-{sku.pci_device_id:012x}",
                name=sku.product_name,
                memory_total_mib=sku.memory_total_mib,
                architecture=sku.architecture,
                pci_device_id=sku.pci_device_id,
                minor_number=i,
                mig_capable=True,
            )
            for i in range(count)
        ]

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def gpu(self, index: int) -> GpuInfo:
        return self._gpus[index]

    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        return [
            GiProfileInfo(
                enum_index=r.enum_index,
                profile_id=r.profile_id,
                compute_slices=r.compute_slices,
                memory_slices=r.memory_slices,
                instance_count=r.max_instances,
                memory_mib=r.memory_mib,
                multiprocessors=r.sms,
                copy_engines=r.ce,
                decoders=r.dec,
                encoders=r.enc,
                jpegs=r.jpeg,
                ofas=r.ofa,
                placements=tuple(Placement(s, r.memory_slices) for s in r.starts),
                nvml_name=r.nvml_name,
            )
            for r in self.sku.profiles
        ]


def catalogs_for(sku_key: str, count: int, *, every_profile: bool = True) -> list[GpuCatalog]:
    """Realistic catalogs through catalog discovery; `every_profile` lifts the allowlist (worst case)."""
    cats = discover_all(_SkuSource(SKUS[sku_key], count))
    if every_profile:
        cats = [dataclasses.replace(c, profiles=c.all_profiles) for c in cats]
    return cats


def build(cats: list[GpuCatalog], mig_on: bool = False, node: NodeConfig = MIG_NODE) -> NodeSlices:
    return build_node_slices(cats, NODE, 3, node, {c.gpu.index: mig_on for c in cats}, node_uid="uid-1")


def _devices(ns: NodeSlices) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in ns.slices for d in s.body["spec"].get("devices", [])}


def _counter_sets(ns: NodeSlices) -> dict[str, dict[str, Any]]:
    return {cs["name"]: cs["counters"] for s in ns.slices for cs in s.body["spec"].get("sharedCounters", [])}


def _check_model(ns: NodeSlices, cats: list[GpuCatalog]) -> None:
    assert validate_pool([s.body for s in ns.slices]) == []
    devices, sets = _devices(ns), _counter_sets(ns)
    for s in ns.slices:
        assert is_dns_subdomain(s.name) and s.name == s.body["metadata"]["name"]
        spec = s.body["spec"]
        assert spec["driver"] == DRIVER_NAME and spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": len(ns.slices)}
        assert bool(spec.get("devices")) != bool(spec.get("sharedCounters"))
        assert len(spec.get("devices", [])) <= 64 and len(spec.get("sharedCounters", [])) <= 8
        # The client model accepts the shape (camelCase keys, known fields only).
        assert V1ResourceSlice.from_dict(s.body) is not None
    for name, dev in devices.items():
        assert is_dns_label(name)
        assert len(dev["attributes"]) + len(dev["capacity"]) <= 32
        assert len(dev.get("consumesCounters", [])) <= 2
    for cat in cats:
        i = cat.gpu.index
        set_name = f"gpu-{i}-counter-set"
        counters = sets[set_name]
        assert all(is_dns_label(c) for c in counters) and len(counters) <= 32
        whole = devices[f"gpu-{i}"]
        assert whole["consumesCounters"] == [{"counterSet": set_name, "counters": counters}]
        migs = []
        for prof in cat.profiles:
            for pl in prof.placements:
                dev = devices[mig_device_name(i, prof.name, prof.gi_profile_id, pl.start)]
                (consumption,) = dev["consumesCounters"]
                assert consumption["counterSet"] == set_name
                slices = {c for c in consumption["counters"] if c.startswith("memory-slice-")}
                assert slices == {f"memory-slice-{k}" for k in range(pl.start, pl.end)}
                assert dev["attributes"]["parentUUID"] == {"string": cat.gpu.uuid}
                assert dev["attributes"]["profile"] == {"string": prof.name}
                assert dev["capacity"]["memory"] == {"value": f"{prof.memory_mib}Mi"}
                migs.append((pl, slices))
        for a, (pa, sa) in enumerate(migs):
            for pb, sb in migs[a + 1 :]:
                # Overlapping placements must share a counter; disjoint ones must not share a slice.
                assert bool(sa & sb) == pa.overlaps(pb)
        whole_counters = set(counters)
        assert all(slices <= whole_counters and slices for _, slices in migs)


MODELS = sorted(SKUS)


@pytest.mark.parametrize("gpus", [8, 16])
@pytest.mark.parametrize("sku", MODELS)
def test_every_model_fits_the_limits(sku: str, gpus: int) -> None:
    cats = catalogs_for(sku, gpus)
    ns = build(cats, mig_on=True) if SKUS[sku].architecture.mig_toggle_needs_reset else build(cats)
    devs = _devices(ns)
    per_gpu = sum(len(p.placements) for p in cats[0].profiles)
    whole = 0 if SKUS[sku].architecture.mig_toggle_needs_reset else 1
    assert len(devs) == gpus * (per_gpu + whole)
    # Counter slices first (8 sets each), then devices packed per GPU into slices of <= 64.
    gpus_per_slice = 64 // (per_gpu + whole)
    assert len(ns.slices) == math.ceil(gpus / 8) + math.ceil(gpus / gpus_per_slice)
    if whole:
        _check_model(ns, cats)
    else:
        assert validate_pool([s.body for s in ns.slices]) == []


@pytest.mark.parametrize("sku", ["H100-80GB", "B200-180GB", "RTX-PRO-6000"])
def test_counter_model_hopper_plus(sku: str) -> None:
    cats = catalogs_for(sku, 16)
    _check_model(build(cats), cats)


def test_a100_with_mig_off_publishes_whole_gpu_only() -> None:
    cats = catalogs_for("A100-40GB", 8)
    ns = build(cats, mig_on=False)
    assert set(_devices(ns)) == {f"gpu-{i}" for i in range(8)}
    assert _counter_sets(ns) == {}
    assert all("consumesCounters" not in d for d in _devices(ns).values())
    assert all(not g.mig_devices and g.whole for g in ns.gpus)


def test_a100_with_mig_on_publishes_mig_devices_only() -> None:
    cats = catalogs_for("A100-40GB", 2)
    devs = _devices(build(cats, mig_on=True))
    assert "gpu-0" not in devs and "gpu-0-mig-7g40gb-0-0" in devs and "gpu-1-mig-1g5gb-19-6" in devs


def test_hopper_publishes_mig_devices_regardless_of_mode() -> None:
    cats = catalogs_for("H100-80GB", 1)
    assert _devices(build(cats, mig_on=False)) == _devices(build(cats, mig_on=True))


def test_filterdevices_and_operating_mode() -> None:
    cats = catalogs_for("H100-80GB", 4)
    node = NodeConfig(
        NODE, OperatingMode.MIG, filter_uuids=frozenset({cats[1].gpu.uuid}), filter_indexes=frozenset({3})
    )
    ns = build(cats, node=node)
    assert {d["attributes"]["index"]["int"] for d in _devices(ns).values()} == {0, 2}
    assert set(_counter_sets(ns)) == {"gpu-0-counter-set", "gpu-2-counter-set"}
    assert [g.reason for g in ns.gpus if g.gpu_index in (1, 3)] == ["excluded by filterdevices"] * 2
    # mps nodes publish nothing; hami-core nodes only shared GPUs (test_kp_hamicore_slices.py).
    ns = build(cats, node=NodeConfig(NODE, OperatingMode.MPS))
    assert ns.slices == () and all(not g.whole and not g.shared for g in ns.gpus)
    ns = build(cats, node=NodeConfig(NODE, OperatingMode.HAMI_CORE))
    assert set(_devices(ns)) == {f"gpu-{i}-shared" for i in range(4)} and not _counter_sets(ns)


def test_allowlist_limits_mig_devices() -> None:
    cats = catalogs_for("A100-40GB", 1, every_profile=False)
    allowed = {p.name for p in cats[0].profiles}
    devs = _devices(build(cats, mig_on=True))
    assert {d["attributes"]["profile"]["string"] for d in devs.values()} == allowed


def test_attributes_and_capacity_of_whole_and_mig() -> None:
    cats = catalogs_for("H100-80GB", 1)
    devs = _devices(build(cats))
    whole = devs["gpu-0"]
    assert whole["attributes"]["type"] == {"string": "gpu"}
    assert whole["attributes"]["uuid"] == {"string": cats[0].gpu.uuid}
    assert whole["capacity"]["memory"] == {"value": f"{SKUS['H100-80GB'].memory_total_mib}Mi"}
    mig = devs["gpu-0-mig-3g40gb-9-4"]
    attrs = mig["attributes"]
    assert attrs["type"] == {"string": "mig"} and "uuid" not in attrs
    assert (attrs["giProfileId"], attrs["placementStart"], attrs["placementSize"]) == (
        {"int": 9},
        {"int": 4},
        {"int": 4},
    )
    assert attrs["architecture"] == {"string": "hopper"} and attrs["index"] == {"int": 0}
    # The parent's slice totals, for "at least p% of the GPU" selectors (contract C1).
    assert (attrs["memorySlices"], attrs["gpuMemorySlices"]) == ({"int": 4}, {"int": 8})
    assert (attrs["computeSlices"], attrs["gpuComputeSlices"]) == ({"int": 3}, {"int": 7})
    assert set(mig["capacity"]) == {
        "memory",
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegs",
        "ofas",
    }


def test_capacity_counters_admit_every_valid_layout_and_stay_tight() -> None:
    cat = catalogs_for("A100-40GB", 1)[0]
    totals = capacity_counter_totals(cat)
    by_name = {p.name: p for p in cat.profiles}
    # Maximal A100 layouts (the oracle of tests/unit/test_oracle.py): each must fit every capacity counter.
    layouts = [
        ["7g.40gb"],
        ["4g.20gb", "3g.20gb"],
        ["3g.20gb", "3g.20gb"],
        ["2g.10gb", "2g.10gb", "3g.20gb"],
        ["1g.5gb"] * 7,
        ["1g.10gb"] * 4,
        ["1g.5gb+me", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"],
    ]
    for layout in layouts:
        profs = [by_name[n] for n in layout]
        assert sum(p.memory_mib for p in profs) <= totals["memory"]
        assert sum(p.multiprocessors for p in profs) <= totals["multiprocessors"]
        assert sum(p.copy_engines for p in profs) <= totals["copy-engines"]
        assert sum(p.decoders for p in profs) <= totals["decoders"]
        assert sum(p.ofas for p in profs) <= totals["ofas"]
    # Tight: the single +me instance is the only OFA user, and 7g holds every SM.
    assert totals["ofas"] == 1 and totals["multiprocessors"] == by_name["7g.40gb"].multiprocessors


def test_deterministic_names_and_generation() -> None:
    cats = catalogs_for("A100-80GB", 16)
    a, b = build(cats, mig_on=True), build(cats, mig_on=True)
    assert a == b
    assert a.names == tuple(f"{NODE}-{DRIVER_NAME}-{k}" for k in range(len(a.slices)))
    assert a.slices[0].body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_long_node_name_stays_a_dns_subdomain() -> None:
    node = ("n" * 60 + ".") * 4 + "x"
    ns = build_node_slices(catalogs_for("H100-80GB", 1), node, 0, NodeConfig(node, OperatingMode.MIG), {})
    assert all(is_dns_subdomain(s.name) and len(s.name) <= 253 for s in ns.slices)
    assert len(set(ns.names)) == len(ns.names)


def test_small_slice_limit_splits_devices() -> None:
    cats = catalogs_for("A100-40GB", 2)
    ns = build_node_slices(cats, NODE, 1, MIG_NODE, {0: True, 1: True}, max_devices_per_slice=10)
    assert validate_pool([s.body for s in ns.slices]) == []
    assert all(len(s.body["spec"].get("devices", [])) <= 10 for s in ns.slices)


def test_invalid_inputs() -> None:
    cats = catalogs_for("H100-80GB", 1)
    with pytest.raises(ValueError, match="generation"):
        build_node_slices(cats, NODE, -1, MIG_NODE, {})
    with pytest.raises(ValueError, match="duplicate GPU indexes"):
        build_node_slices(cats * 2, NODE, 0, MIG_NODE, {})
    with pytest.raises(ValueError, match="max_devices_per_slice"):
        build_node_slices(cats, NODE, 0, MIG_NODE, {}, max_devices_per_slice=65)


def test_validate_pool_reports_violations() -> None:
    ns = build(catalogs_for("H100-80GB", 1))
    bodies = [dict(s.body) for s in ns.slices]
    dev_slice = next(b for b in bodies if b["spec"].get("devices"))
    spec = dict(dev_slice["spec"])
    spec["devices"] = spec["devices"] * 4  # duplicates and > 64 devices
    dev_slice["spec"] = spec
    problems = validate_pool(bodies)
    assert any("exceed 64" in p for p in problems) and any("not unique" in p for p in problems)


@pytest.mark.parametrize("sku", ["A100-40GB", "H100-80GB", "A30-24GB", "RTX-PRO-6000"])
def test_through_simulator_and_discovery(tmp_path: Any, sku: str) -> None:
    """The same checks on catalogs discovered through the NVML port over the simulator."""
    from driver.nvml.sim import SimGpuSpec, init_sim_state, open_sim

    state = tmp_path / "sim.json"
    init_sim_state(state, [SimGpuSpec(sku=sku, mig_enabled=True) for _ in range(8)])
    with open_sim(state) as nvml:
        cats = [dataclasses.replace(c, profiles=c.all_profiles) for c in discover_all(nvml)]
        modes = {g.index: nvml.mig_mode(g.index).current for g in nvml.gpus()}
    ns = build_node_slices(cats, NODE, 3, MIG_NODE, modes)
    if SKUS[sku].architecture.mig_toggle_needs_reset:
        assert validate_pool([s.body for s in ns.slices]) == []
        assert all(not g.whole and g.mig_devices for g in ns.gpus)
    else:
        _check_model(ns, cats)
