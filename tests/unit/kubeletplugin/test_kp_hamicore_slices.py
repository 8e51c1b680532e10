"""hami-core nodes: the `gpu-<i>-shared` devices (contract C1 of
docs/architecture.md), devicesplitcount and the HAMi-core flags."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import V1ResourceSlice
from test_kp_slices import NODE, catalogs_for

from driver.nvml.sim.hardware import SKUS
from kubeletplugin.publish.slicelimits import validate_pool
from kubeletplugin.publish.slices import NodeSlices, build_node_slices
from kubeletplugin.settings.config import ConfigError, add_flags, load_config
from kubeletplugin.settings.nodeconfig import (
    DEFAULT_DEVICE_SPLIT_COUNT,
    NodeConfig,
    NodeConfigError,
    OperatingMode,
    node_config_for,
    parse_device_plugin_config,
)

HAMI_NODE = NodeConfig(NODE, OperatingMode.HAMI_CORE)


def _devices(ns: NodeSlices) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in ns.slices for d in s.body["spec"].get("devices", [])}


def _build(
    model: str, count: int, node: NodeConfig = HAMI_NODE, mig_on: dict[int, bool] | None = None
) -> NodeSlices:
    return build_node_slices(catalogs_for(model, count), NODE, 2, node, mig_on or {})


def test_shared_device_shape_is_contract_c1() -> None:
    ns = _build("H100-80GB", 1)
    cat = catalogs_for("H100-80GB", 1)[0]
    [dev] = _devices(ns).values()
    total = f"{SKUS['H100-80GB'].memory_total_mib}Mi"
    assert dev == {
        "name": "gpu-0-shared",
        "allowMultipleAllocations": True,
        "attributes": {
            "type": {"string": "hami-core"},
            "uuid": {"string": cat.gpu.uuid},
            "productName": {"string": cat.gpu.name},
            "model": {"string": "H100-80GB"},
            "architecture": {"string": "hopper"},
            "index": {"int": 0},
            "splitCount": {"int": DEFAULT_DEVICE_SPLIT_COUNT},
            "enforced": {"bool": True},
        },
        "capacity": {
            "memory": {
                "value": total,
                "requestPolicy": {"default": total, "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
            "shares": {"value": "10", "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
    }
    [pub] = ns.gpus
    assert pub.shared and not pub.whole and pub.mig_devices == 0 and "10 shares" in pub.reason


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB", "A30-24GB", "B200-180GB", "RTX-PRO-6000"])
def test_sixteen_gpu_node_is_publishable(model: str) -> None:
    ns = _build(model, 16)
    assert validate_pool([s.body for s in ns.slices]) == []
    devices = _devices(ns)
    assert set(devices) == {f"gpu-{i}-shared" for i in range(16)}
    for s in ns.slices:
        spec = s.body["spec"]
        assert "sharedCounters" not in spec  # no counters on a hami-core node
        assert V1ResourceSlice.from_dict(s.body) is not None
    for dev in devices.values():
        assert "consumesCounters" not in dev
        assert len(dev["attributes"]) + len(dev["capacity"]) <= 32


def test_split_count_filter_and_mig_mode() -> None:
    cats = catalogs_for("H100-80GB", 4)
    node = NodeConfig(
        NODE,
        OperatingMode.HAMI_CORE,
        filter_uuids=frozenset({cats[1].gpu.uuid}),
        device_split_count=4,
    )
    # GPU 3 is in MIG mode: flexmig does not switch it off on a hami-core node, so it is left out.
    ns = build_node_slices(cats, NODE, 0, node, {3: True})
    devices = _devices(ns)
    assert set(devices) == {"gpu-0-shared", "gpu-2-shared"}
    assert devices["gpu-0-shared"]["attributes"]["splitCount"] == {"int": 4}
    assert devices["gpu-0-shared"]["capacity"]["shares"]["value"] == "4"
    reasons = {g.gpu_index: g.reason for g in ns.gpus}
    assert reasons[1] == "excluded by filterdevices"
    assert "MIG mode is on" in reasons[3] and "does not change MIG mode" in reasons[3]
    assert [g.shared for g in ns.gpus] == [True, False, True, False]


def test_mig_node_is_unchanged_by_hami_core() -> None:
    # A mig node never publishes a shared device, and a hami-core node never a MIG or whole device.
    mig = _devices(_build("H100-80GB", 1, NodeConfig(NODE, OperatingMode.MIG)))
    assert "gpu-0" in mig and not any(n.endswith("-shared") for n in mig)
    assert all("gpuMemorySlices" in d["attributes"] for n, d in mig.items() if "-mig-" in n)
    assert set(_devices(_build("H100-80GB", 1))) == {"gpu-0-shared"}


# --- nodeconfig `devicesplitcount` -----------------------------------------------------------------


def test_devicesplitcount_per_node_and_default() -> None:
    doc = {
        "nodeconfig": [
            {"name": "a", "operatingmode": "hami-core", "devicesplitcount": 4},
            {"name": "b", "operatingmode": "hami-core", "deviceSplitCount": 7},  # HAMi ignores case
            {"name": "c", "operatingmode": "hami-core"},
        ]
    }
    cfg = parse_device_plugin_config(json.dumps(doc), default_split_count=3)
    assert (cfg["a"].device_split_count, cfg["b"].device_split_count, cfg["c"].device_split_count) == (
        4,
        7,
        3,
    )
    assert cfg["a"].publishes_shared and not cfg["a"].publishes_mig
    assert node_config_for(doc, "z", default_split_count=5).device_split_count == 5
    assert node_config_for(None, "z").device_split_count == DEFAULT_DEVICE_SPLIT_COUNT


@pytest.mark.parametrize("bad", [0, -1, "10", 1.5, True, None])
def test_devicesplitcount_rejects(bad: object) -> None:
    doc = {"nodeconfig": [{"name": "a", "devicesplitcount": bad}]}
    with pytest.raises(NodeConfigError, match=r"nodeconfig\[0\] \(node 'a'\).devicesplitcount.*integer >= 1"):
        parse_device_plugin_config(json.dumps(doc))


def test_devicesplitcount_twice_is_an_error() -> None:
    doc = {"nodeconfig": [{"name": "a", "devicesplitcount": 2, "DeviceSplitCount": 3}]}
    with pytest.raises(NodeConfigError, match="more than once"):
        parse_device_plugin_config(json.dumps(doc))


# --- flags ------------------------------------------------------------------------------------------


def _args(**kw: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args([x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", v)])


def _base(tmp_path: Path) -> dict[str, str]:
    boot = tmp_path / "boot_id"
    boot.write_text("b\n")
    sim = tmp_path / "sim.json"
    sim.write_text("{}")
    return {"node_name": "node-a", "boot_id_path": str(boot), "nvml": f"sim:{sim}"}


def test_flags_defaults_and_overrides(tmp_path: Path) -> None:
    cfg = load_config(_args(**_base(tmp_path)), env={})
    assert cfg.node_config.device_split_count == 10
    assert (str(cfg.hami_core_library), str(cfg.hami_core_dir)) == (
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu",
    )
    node_cfg = tmp_path / "config.json"
    node_cfg.write_text('{"nodeconfig": [{"name": "node-a", "devicesplitcount": 2}]}')
    cfg = load_config(
        _args(**_base(tmp_path), device_split_count="6", hami_core_library="/opt/hami/libvgpu.so"),
        env={"FLEXMIG_HAMI_CORE_DIR": "/var/lib/hami"},
    )
    assert cfg.node_config.device_split_count == 6 and str(cfg.hami_core_dir) == "/var/lib/hami"
    assert str(cfg.hami_core_library) == "/opt/hami/libvgpu.so"
    cfg = load_config(_args(**_base(tmp_path), device_split_count="6", node_config=str(node_cfg)), env={})
    assert cfg.node_config.device_split_count == 2  # the node's entry wins over the flag


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"device_split_count": "0"}, "--device-split-count (env FLEXMIG_DEVICE_SPLIT_COUNT): '0'"),
        ({"device_split_count": "ten"}, "allowed: an integer >= 1"),
        ({"hami_core_library": "libvgpu.so"}, "--hami-core-library"),
        ({"hami_core_dir": "vgpu"}, "--hami-core-dir"),
    ],
)
def test_flag_errors_name_the_flag(tmp_path: Path, override: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_args(**{**_base(tmp_path), **override}), env={})
    assert needle in str(err.value)
