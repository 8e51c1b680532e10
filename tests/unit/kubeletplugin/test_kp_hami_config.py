"""HAMi v2.10's device config and nodeconfig as written, read by the kubelet plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_kp_preparer_pure import _args, _base
from test_kp_slices import NODE, catalogs_for

from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.config import ConfigError, load_config
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

DATA = Path(__file__).resolve().parents[2] / "data" / "hami-v2.10"


def test_hami_v210_files_load_unchanged(tmp_path: Path) -> None:
    base = {**_base(tmp_path), "node_name": "mig-node-a"}
    cfg = load_config(
        _args(**base, device_config=str(DATA / "device-config.yaml"), node_config=str(DATA / "config.json")),
        env={},
    )
    assert cfg.allowlist.profiles_for("NVIDIA A100-SXM4-40GB") == ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")
    assert cfg.node_config.device_split_count == 10
    assert (cfg.node_config.memory_scaling, cfg.node_config.core_scaling) == (1.0, 1.0)
    assert cfg.unused_device_keys == ("cambricon", "hygon", "nvidia.overwriteEnv")
    # The guide's node is MIG-NODE-A (not a valid node name, so it never matches): auto for this one.
    assert cfg.node_config.operating_mode is OperatingMode.AUTO


def test_configmap_itself_is_accepted(tmp_path: Path) -> None:
    text = (DATA / "device-config.yaml").read_text()
    cm = tmp_path / "cm.yaml"
    cm.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "data": {"device-config.yaml": text}})
    )
    cfg = load_config(_args(**_base(tmp_path), device_config=str(cm)), env={})
    assert cfg.unused_device_keys == ("cambricon", "hygon", "nvidia.overwriteEnv")


def _device(tmp_path: Path, nvidia: dict[str, object]) -> str:
    path = tmp_path / "device.yaml"
    path.write_text(yaml.safe_dump({"nvidia": {"migProfileAllowlist": [], **nvidia}}))
    return str(path)


def test_device_split_count_precedence(tmp_path: Path) -> None:
    dev = _device(tmp_path, {"deviceSplitCount": 4})
    assert (
        load_config(_args(**_base(tmp_path), device_config=dev), env={}).node_config.device_split_count == 4
    )
    flag = load_config(_args(**_base(tmp_path), device_config=dev, device_split_count="6"), env={})
    assert flag.node_config.device_split_count == 6
    env = load_config(_args(**_base(tmp_path), device_config=dev), env={"FLEXMIG_DEVICE_SPLIT_COUNT": "7"})
    assert env.node_config.device_split_count == 7
    node_cfg = tmp_path / "config.json"
    node_cfg.write_text(json.dumps({"nodeconfig": [{"name": "node-a", "devicesplitcount": 3}]}))
    per_node = load_config(_args(**_base(tmp_path), device_config=dev, node_config=str(node_cfg)), env={})
    assert per_node.node_config.device_split_count == 3


def test_scalings_shape_the_shared_device(tmp_path: Path) -> None:
    dev = _device(tmp_path, {"deviceMemoryScaling": 0.5, "deviceCoreScaling": 2})
    node_cfg = tmp_path / "config.json"
    node_cfg.write_text(json.dumps({"nodeconfig": [{"name": "node-a", "operatingmode": "hami-core"}]}))
    cfg = load_config(_args(**_base(tmp_path), device_config=dev, node_config=str(node_cfg)), env={})
    # Above 1 (HAMi-core oversubscription) acts as 1: never more than the GPU has.
    assert (cfg.node_config.memory_scaling, cfg.node_config.core_scaling) == (0.5, 1.0)
    cats = catalogs_for("H100-80GB", 1)
    ns = build_node_slices(cats, NODE, 1, NodeConfig(NODE, OperatingMode.HAMI_CORE, memory_scaling=0.5), {})
    [dev_] = [d for s in ns.slices for d in s.body["spec"].get("devices", [])]
    assert dev_["capacity"]["memory"]["value"] == f"{cats[0].gpu.memory_total_mib // 2}Mi"
    # A per-node devicecorescaling overrides the device config's.
    node_cfg.write_text(
        json.dumps(
            {"nodeconfig": [{"name": "node-a", "operatingmode": "hami-core", "deviceCoreScaling": 0.3}]}
        )
    )
    cfg = load_config(_args(**_base(tmp_path), device_config=dev, node_config=str(node_cfg)), env={})
    assert cfg.node_config.core_scaling == 0.3
    ns = build_node_slices(cats, NODE, 1, NodeConfig(NODE, OperatingMode.HAMI_CORE, core_scaling=0.3), {})
    [dev_] = [d for s in ns.slices for d in s.body["spec"].get("devices", [])]
    assert dev_["capacity"]["cores"]["value"] == "30"
    assert dev_["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] == "30"


@pytest.mark.parametrize(
    ("nvidia", "needle"),
    [
        ({"deviceSplitCount": 0}, "nvidia.deviceSplitCount: 0 is not a valid device split count"),
        ({"deviceMemoryScaling": 0}, "nvidia.deviceMemoryScaling: 0 is not a valid scaling"),
        ({"deviceCoreScaling": "x"}, "nvidia.deviceCoreScaling: 'x' is not a valid scaling"),
        (
            {"migProfileAllowlist": [{"models": ["A30"], "profiles": ["2g.10g"]}]},
            "nvidia.migProfileAllowlist",
        ),
    ],
)
def test_bad_device_config_names_the_key(tmp_path: Path, nvidia: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=f"--device-config .*{needle}"):
        load_config(_args(**_base(tmp_path), device_config=_device(tmp_path, nvidia)), env={})


def test_nodeconfig_keys_without_effect_are_reported(tmp_path: Path) -> None:
    node_cfg = tmp_path / "config.json"
    entry = {"name": "node-a", "operatingmode": "mig", "migstrategy": "none", "libCudaLogLevel": 1}
    node_cfg.write_text(json.dumps({"nodeconfig": [entry]}))
    cfg = load_config(_args(**_base(tmp_path), node_config=str(node_cfg)), env={})
    assert cfg.unused_device_keys == ("nodeconfig[0].migstrategy", "nodeconfig[0].libCudaLogLevel")
