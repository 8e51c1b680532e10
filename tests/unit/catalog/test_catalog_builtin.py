"""Discovery when NVML refuses profile queries with MIG off (Hopper+): built-in table or whole GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from driver.catalog.builtin import builtin_profile_infos, builtin_sku, row_confidence
from driver.catalog.discover import discover, discover_all
from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import CatalogWarningKind, ProfileOrigin
from driver.nvml.port import Nvml
from driver.nvml.sim import SKUS, MigOffQueries, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import GiProfileInfo, GpuInfo, MigMode

REFUSE, ANSWER = MigOffQueries.REFUSE, MigOffQueries.ANSWER


@pytest.fixture(scope="module")
def nvml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nvml]:
    path = Path(tmp_path_factory.mktemp("builtin")) / "state.json"
    init_sim_state(
        path,
        [
            SimGpuSpec("H100-80GB", mig_enabled=False, mig_off_queries=REFUSE),
            SimGpuSpec("H100-PCIE-80GB", mig_enabled=False, mig_off_queries=REFUSE),
            SimGpuSpec("H100-80GB", mig_enabled=False, mig_off_queries=ANSWER),
            SimGpuSpec("A100-40GB", mig_enabled=False),
            SimGpuSpec("B200-180GB", mig_enabled=False, mig_off_queries=REFUSE),
        ],
    )
    with open_sim(path) as port:
        yield port


@pytest.mark.parametrize(("index", "sku"), [(0, "H100-80GB"), (1, "H100-PCIE-80GB"), (4, "B200-180GB")])
def test_refused_known_model_uses_builtin_table_of_that_exact_model(nvml: Nvml, index: int, sku: str) -> None:
    with structlog.testing.capture_logs() as logs:
        cat = discover(nvml, index)
    assert cat.origin is ProfileOrigin.BUILTIN and cat.awaits_nvml
    # Exactly what NVML reports for that SKU once MIG is on (the simulated catalog asks NVML).
    nvml_view = simulated_catalog(sku)
    assert cat.all_profiles == nvml_view.all_profiles
    assert cat.profiles == nvml_view.profiles and cat.profiles
    assert (cat.memory_slices, cat.compute_slices) == (8, 7)
    assert [w.kind for w in cat.warnings] == [CatalogWarningKind.PROFILES_FROM_BUILTIN]
    assert sku in cat.warnings[0].message
    assert any(e.get("kind") == "profiles-from-builtin" and e["gpu"] == index for e in logs)


def test_pcie_and_sxm_are_not_mixed_up(nvml: Nvml) -> None:
    sxm, pcie = discover(nvml, 0), discover(nvml, 1)
    assert [p.name for p in sxm.all_profiles] == [p.name for p in pcie.all_profiles]
    assert max(p.multiprocessors for p in sxm.all_profiles) == 132
    assert max(p.multiprocessors for p in pcie.all_profiles) == 114


def test_answering_gpu_is_read_from_nvml(nvml: Nvml) -> None:
    cat = discover(nvml, 2)
    assert cat.origin is ProfileOrigin.NVML and not cat.awaits_nvml
    assert cat.warnings == () and len(cat.all_profiles) == 7


def test_ampere_with_mig_off_still_whole_gpu_only(nvml: Nvml) -> None:
    cat = discover(nvml, 3)
    assert cat.origin is ProfileOrigin.NVML and cat.all_profiles == ()
    assert [w.kind for w in cat.warnings] == [CatalogWarningKind.MIG_UNAVAILABLE]


class _Renamed:
    """The port with every GPU renamed to a model flexmig does not know."""

    def __init__(self, port: Nvml, name: str) -> None:
        self.port = port
        self.name = name

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.port.device_count())]

    def gpu(self, index: int) -> GpuInfo:
        return dataclasses.replace(self.port.gpu(index), name=self.name)

    def gi_profiles(self, index: int) -> list[GiProfileInfo]:
        return self.port.gi_profiles(index)

    def mig_mode(self, index: int) -> MigMode:
        return self.port.mig_mode(index)


def test_refused_unknown_model_publishes_whole_gpu_and_says_why(nvml: Nvml) -> None:
    with structlog.testing.capture_logs() as logs:
        cat = discover(_Renamed(nvml, "NVIDIA H100X-TEST"), 0)
    assert cat.origin is ProfileOrigin.REFUSED and cat.awaits_nvml
    assert cat.profiles == () and cat.all_profiles == ()
    kinds = [w.kind for w in cat.warnings]
    assert kinds == [CatalogWarningKind.UNKNOWN_MODEL, CatalogWarningKind.MIG_UNAVAILABLE]
    assert "refuses MIG profile queries while MIG mode is off" in cat.warnings[1].message
    assert "whole GPU only" in cat.warnings[1].message
    assert any("not in flexmig's built-in profile table" in e["event"] for e in logs)


def test_discover_all_mixes_origins(nvml: Nvml) -> None:
    origins = [c.origin for c in discover_all(nvml)]
    builtin, from_nvml = ProfileOrigin.BUILTIN, ProfileOrigin.NVML
    assert origins == [builtin, builtin, from_nvml, from_nvml, builtin]


def test_builtin_lookup_is_exact() -> None:
    h100 = builtin_sku("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.key == "H100-80GB"
    assert builtin_sku("H100 PCIe") is SKUS["H100-PCIE-80GB"]
    assert builtin_sku("NVIDIA H20") is SKUS["H20-96GB"]
    assert builtin_sku("NVIDIA H2") is None and builtin_sku("H100") is None
    assert builtin_profile_infos("NVIDIA H100X") is None
    infos = builtin_profile_infos("NVIDIA GH200 480GB")
    assert infos is not None and {i.profile_id for i in infos} == {19, 20, 15, 14, 9, 5, 0}


def test_row_confidence() -> None:
    assert row_confidence("A100-40GB", 9) == row_confidence("A100-40GB", 0)
    confirmed = row_confidence("A100-40GB", 9)
    assert confirmed is not None and confirmed.confirmed and confirmed.note == ""
    unsure = row_confidence("B200-180GB", 9)
    assert unsure is not None and not unsure.confirmed and "[U]" in unsure.note
    assert row_confidence("B200-180GB", 77) is None and row_confidence("X", 0) is None
