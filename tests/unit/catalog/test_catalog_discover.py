"""Discovery through the NVML port on the simulator: names, axes, allowlist filtering, warnings."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, parse_allowlist
from driver.catalog.discover import discover, discover_all
from driver.catalog.simulated import UnknownModelError, resolve_sku, simulated_catalog
from driver.catalog.types import CatalogWarningKind
from driver.nvml.port import Nvml
from driver.nvml.sim import SKUS, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import GiProfileInfo, GpuInfo, NvmlError, NvmlErrorCode


@pytest.fixture(scope="module")
def nvml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nvml]:
    path = Path(tmp_path_factory.mktemp("discover")) / "state.json"
    init_sim_state(
        path,
        [
            SimGpuSpec(sku="A100-40GB"),
            SimGpuSpec(sku="H200-141GB"),
            SimGpuSpec(sku="A100-40GB", mig_enabled=False),
        ],
    )
    with open_sim(path) as port:
        yield port


@pytest.mark.parametrize("sku", sorted(SKUS))
def test_every_sku(sku: str) -> None:
    cat = simulated_catalog(sku)
    hw = SKUS[sku]
    # The rule-derived names agree with the names NVIDIA's tools print (the simulator's tables).
    assert {p.name for p in cat.all_profiles} == {row.name for row in hw.profiles}
    assert cat.memory_slices == hw.memory_slices and cat.compute_slices == hw.compute_slices
    assert cat.gpu.name == hw.product_name
    # Every default allowlisted name exists on its model: no warnings, and the allowed profiles are
    # exactly the default entry's, smallest first.
    assert cat.warnings == ()
    expected = DEFAULT_MIG_PROFILE_ALLOWLIST.profiles_for(hw.product_name)
    assert expected is not None
    assert {p.name for p in cat.profiles} == set(expected)
    mems = [p.memory_mib for p in cat.profiles]
    assert mems == sorted(mems)
    for p in cat.all_profiles:
        row = hw.profile_by_id(p.gi_profile_id)
        assert row is not None
        assert (p.compute_slices, p.memory_slices, p.memory_mib, p.instance_count) == (
            row.compute_slices,
            row.memory_slices,
            row.memory_mib,
            row.max_instances,
        )
        assert [pl.start for pl in p.placements] == list(row.starts)
        assert all(pl.size == p.memory_slices for pl in p.placements)


def test_models_resolve_by_key_or_nvml_name() -> None:
    assert resolve_sku("a100-40gb") == "A100-40GB"
    assert resolve_sku("NVIDIA H200") == "H200-141GB"
    assert resolve_sku("H200 NVL") == "H200-NVL-141GB"
    with pytest.raises(UnknownModelError) as info:
        resolve_sku("H2")
    assert "A30-24GB (NVIDIA A30)" in str(info.value)


def test_discover_all_and_mig_off(nvml: Nvml) -> None:
    with structlog.testing.capture_logs() as logs:
        cats = discover_all(nvml)
    assert [c.model for c in cats] == ["A100-40GB", "H200-141GB", "A100-40GB"]
    assert [p.name for p in cats[1].profiles] == ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]
    off = cats[2]
    assert off.profiles == () and off.all_profiles == () and off.memory_slices == 0
    assert [w.kind for w in off.warnings] == [CatalogWarningKind.MIG_UNAVAILABLE]
    assert any(e["log_level"] == "warning" and e["gpu"] == 2 for e in logs)


def test_allowlisted_profile_not_offered_is_reported(nvml: Nvml) -> None:
    allow = parse_allowlist([{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "1g.6gb", "4g.20gb"]}])
    with structlog.testing.capture_logs() as logs:
        cat = discover(nvml, 0, allow)
    assert [p.name for p in cat.profiles] == ["1g.5gb", "4g.20gb"]
    (warning,) = cat.warnings
    assert warning.kind is CatalogWarningKind.PROFILE_NOT_OFFERED and warning.profile == "1g.6gb"
    assert "A100-40GB" in warning.message and "1g.5gb, 1g.5gb+me, 1g.10gb" in warning.message
    assert any(e.get("profile") == "1g.6gb" and e.get("model") == "A100-40GB" for e in logs)


def test_model_without_entry_gets_whole_gpu_only(nvml: Nvml) -> None:
    allow = parse_allowlist([{"models": ["H20"], "profiles": ["1g.12gb"]}])
    cat = discover(nvml, 1, allow)  # the H200 must not pick up the H20 entry
    assert cat.profiles == () and len(cat.all_profiles) == 7
    assert [w.kind for w in cat.warnings] == [CatalogWarningKind.NO_ALLOWLIST_ENTRY]


class _Renamed:
    """The port with GPU 0 renamed: a model flexmig does not know, same NVML facts."""

    def __init__(self, port: Nvml, name: str) -> None:
        self.port = port
        self.name = name

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(0)]

    def gpu(self, index: int) -> GpuInfo:
        return dataclasses.replace(self.port.gpu(index), name=self.name)

    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        return self.port.gi_profiles(index)


class _Failing(_Renamed):
    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        raise NvmlError("nvmlDeviceGetGpuInstanceProfileInfo", NvmlErrorCode.UNKNOWN)


def test_unknown_model_works_from_nvml_facts(nvml: Nvml) -> None:
    source = _Renamed(nvml, "NVIDIA A100X-TEST")
    cat = discover(source, 0)
    assert cat.model == "NVIDIA A100X-TEST" and len(cat.all_profiles) == 7 and cat.memory_slices == 8
    assert [w.kind for w in cat.warnings] == [
        CatalogWarningKind.UNKNOWN_MODEL,
        CatalogWarningKind.NO_ALLOWLIST_ENTRY,
    ]
    # An admin can still allow profiles for it by its exact NVML name.
    allow = parse_allowlist([{"models": ["NVIDIA A100X-TEST"], "profiles": ["3g.20gb"]}])
    cat = discover(source, 0, allow)
    assert [p.name for p in cat.profiles] == ["3g.20gb"]
    assert [w.kind for w in cat.warnings] == [CatalogWarningKind.UNKNOWN_MODEL]


def test_profile_query_failure_is_a_warning(nvml: Nvml) -> None:
    cat = discover(_Failing(nvml, "NVIDIA A100-SXM4-40GB"), 0)
    assert cat.all_profiles == ()
    assert [w.kind for w in cat.warnings] == [CatalogWarningKind.MIG_UNAVAILABLE]
    assert "NVML_ERROR_UNKNOWN" in cat.warnings[0].message
