"""HAMi's device ConfigMap -> ShimDefaults."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from controller.shim import ShimConfigError, ShimDefaults, parse_shim_defaults
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST

HAMI_DEVICE_CONFIG = """
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
"""


def test_hamis_shipped_config_gives_hamis_defaults() -> None:
    got = parse_shim_defaults(yaml.safe_load(HAMI_DEVICE_CONFIG))
    assert replace(got, allowlist=DEFAULT_MIG_PROFILE_ALLOWLIST) == ShimDefaults(0, 0, 1)
    # The allowlist is read too: it says which nvidia.com/mig-<profile> resources can be served.
    assert got.allowlist.to_data() == [
        {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]}
    ]


def test_bad_allowlist_names_the_field_and_hami_29_points_to_migrate_config() -> None:
    bad = {"nvidia": {"migProfileAllowlist": [{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gbx"]}]}}
    with pytest.raises(ShimConfigError, match=r"nvidia\.migProfileAllowlist\[0\]\.profiles\[0\]: '1g.5gbx'"):
        parse_shim_defaults(bad)
    v29 = {"nvidia": {"migProfileAllowlist": [{"models": ["A30"], "allowedGeometries": []}]}}
    with pytest.raises(ShimConfigError, match="flexmig migrate-config"):
        parse_shim_defaults(v29)


@pytest.mark.parametrize(
    "doc", [None, {}, {"nvidia": None}, {"nvidia": {}}, {"other": {"defaultCores": "x"}}]
)
def test_absent_means_hamis_defaults(doc: Any) -> None:
    assert parse_shim_defaults(doc) == ShimDefaults(default_memory_mib=0, default_cores=0, default_gpu_num=1)


def test_values_are_read() -> None:
    doc = {"nvidia": {"defaultMemory": 8000, "defaultCores": 30, "defaultGPUNum": 0, "deviceSplitCount": 4}}
    assert parse_shim_defaults(doc) == ShimDefaults(
        default_memory_mib=8000, default_cores=30, default_gpu_num=0
    )


def test_partial_keeps_other_defaults() -> None:
    assert parse_shim_defaults({"nvidia": {"defaultCores": 50}}) == ShimDefaults(default_cores=50)


@pytest.mark.parametrize(
    ("section", "fragments"),
    [
        ({"defaultMemory": "8000"}, ["nvidia.defaultMemory", "integer", "'8000'"]),
        ({"defaultCores": True}, ["nvidia.defaultCores", "integer"]),
        ({"defaultGPUNum": 1.0}, ["nvidia.defaultGPUNum", "integer"]),
        ({"defaultGPUNum": [1]}, ["nvidia.defaultGPUNum", "integer"]),
        ({"defaultCores": 101}, ["nvidia.defaultCores", "0..100"]),
        ({"defaultMemory": -1}, ["nvidia.defaultMemory", "out of range"]),
        ({"defaultGPUNum": 33}, ["nvidia.defaultGPUNum", "0..32"]),
    ],
)
def test_wrong_types_and_ranges_name_the_key(section: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(ShimConfigError) as info:
        parse_shim_defaults({"nvidia": section})
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("doc", [["nvidia"], "nvidia: {}", {"nvidia": ["defaultCores"]}])
def test_wrong_shape(doc: Any) -> None:
    with pytest.raises(ShimConfigError, match="mapping"):
        parse_shim_defaults(doc)
