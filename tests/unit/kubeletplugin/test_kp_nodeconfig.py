"""HAMi-style nodeconfig parsing."""

from __future__ import annotations

import json

import pytest

from kubeletplugin.settings.nodeconfig import (
    NodeConfig,
    NodeConfigError,
    OperatingMode,
    node_config_for,
    parse_device_plugin_config,
)

UUID = "GPU-0b5d2a8e-1c3f-4e5a-9b7c-6d8e9f0a1b2c"
HAMI_CONFIG = {
    "nodeconfig": [
        {
            "name": "node-a",
            "operatingmode": "mig",
            "migstrategy": "none",
            "devicesplitcount": 10,
            "filterdevices": {"uuid": [UUID], "index": [3]},
        },
        {"name": "node-b", "operatingmode": "hami-core"},
    ]
}


def test_parses_hami_file() -> None:
    cfg = parse_device_plugin_config(json.dumps(HAMI_CONFIG))
    a = cfg["node-a"]
    assert a.publishes_mig and a.filter_uuids == {UUID} and a.filter_indexes == {3}
    assert a.is_filtered(3, "GPU-y") and a.is_filtered(0, UUID) and not a.is_filtered(0, "GPU-y")
    assert not cfg["node-b"].publishes_mig


def test_node_without_entry_gets_default() -> None:
    # An unlisted node decides per GPU (auto); a listed one without operatingmode is HAMi's hami-core.
    assert node_config_for(HAMI_CONFIG, "node-z") == NodeConfig("node-z", OperatingMode.AUTO)
    assert node_config_for(None, "n", OperatingMode.MIG).publishes_mig
    assert node_config_for({}, "n").operating_mode is OperatingMode.AUTO
    assert node_config_for({"nodeconfig": [{"name": "n"}]}, "n").operating_mode is OperatingMode.HAMI_CORE


def test_auto_mode_is_decided_per_gpu() -> None:
    auto = NodeConfig("n", OperatingMode.AUTO)
    assert auto.gpu_mode(mig_capable=True) is OperatingMode.MIG
    assert auto.gpu_mode(mig_capable=False) is OperatingMode.HAMI_CORE
    for mode in (OperatingMode.MIG, OperatingMode.HAMI_CORE, OperatingMode.MPS):
        assert NodeConfig("n", mode).gpu_mode(mig_capable=True) is mode
        assert NodeConfig("n", mode).gpu_mode(mig_capable=False) is mode


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ({"nodeconfig": {}}, "nodeconfig must be a list"),
        ({"nodeconfig": ["x"]}, r"nodeconfig\[0\] must be an object"),
        ({"nodeconfig": [{"operatingmode": "mig"}]}, r"nodeconfig\[0\].name"),
        (
            {"nodeconfig": [{"name": "a", "operatingmode": "MIG"}]},
            r"operatingmode 'MIG' is not one of: auto, hami-core, mig, mps",
        ),
        ({"nodeconfig": [{"name": "a", "filterdevice": {}}]}, r"unknown keys \['filterdevice'\]"),
        ({"nodeconfig": [{"name": "a", "filterdevices": []}]}, "filterdevices must be an object"),
        ({"nodeconfig": [{"name": "a", "filterdevices": {"uuids": []}}]}, r"unknown keys \['uuids'\]"),
        (
            {"nodeconfig": [{"name": "a", "filterdevices": {"uuid": "GPU-x"}}]},
            "filterdevices.uuid must be a list",
        ),
        ({"nodeconfig": [{"name": "a", "filterdevices": {"uuid": [""]}}]}, r"filterdevices.uuid\[0\]"),
        (
            {"nodeconfig": [{"name": "a", "filterdevices": {"index": 1}}]},
            "filterdevices.index must be a list",
        ),
        ({"nodeconfig": [{"name": "a", "filterdevices": {"index": [0, -1]}}]}, r"filterdevices.index\[1\]"),
        ({"nodeconfig": [{"name": "a", "filterdevices": {"index": [True]}}]}, r"filterdevices.index\[0\]"),
        (
            {"nodeconfig": [{"name": "a"}, {"name": "a"}]},
            r"nodeconfig\[1\].name 'a' is listed more than once",
        ),
    ],
)
def test_rejects_with_field_names(doc: object, message: str) -> None:
    with pytest.raises(NodeConfigError, match=message):
        parse_device_plugin_config(doc if isinstance(doc, str) else json.dumps(doc))


def test_error_names_the_node() -> None:
    with pytest.raises(NodeConfigError, match=r"nodeconfig\[0\] \(node 'gpu-7'\).operatingmode"):
        node_config_for({"nodeconfig": [{"name": "gpu-7", "operatingmode": "time-slicing"}]}, "other")
