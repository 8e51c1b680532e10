"""Exact GPU model matching (never a substring test)."""

from __future__ import annotations

import pytest

from driver.catalog.models import (
    KNOWN_MODELS,
    model_for_nvml_name,
    names_match,
    normalize_model_name,
    resolve_model,
)
from driver.nvml.sim.hardware import SKUS


def test_h200_is_not_h20() -> None:
    # HAMi's substring match gives H200 nodes the H20 profile list; ours must not.
    assert not names_match("H20", "NVIDIA H200")
    assert not names_match("H20", "NVIDIA H200 NVL")
    assert names_match("H20", "NVIDIA H20")
    h200 = model_for_nvml_name("NVIDIA H200")
    assert h200 is not None and h200.key == "H200-141GB"
    h20 = model_for_nvml_name("NVIDIA H20")
    assert h20 is not None and h20.key == "H20-96GB"


def test_every_simulated_sku_has_a_model_by_its_nvml_name() -> None:
    for key, sku in SKUS.items():
        model = model_for_nvml_name(sku.product_name)
        assert model is not None, sku.product_name
        assert key in model.skus
        assert resolve_model(key) is model


def test_prefix_and_case_are_optional() -> None:
    assert model_for_nvml_name("A100-SXM4-40GB") is model_for_nvml_name("NVIDIA A100-SXM4-40GB")
    assert resolve_model("nvidia h100 nvl") is resolve_model("H100-94GB")
    assert resolve_model("  H100   on  GH200 ") is resolve_model("H100-96GB")
    assert normalize_model_name(" NVIDIA  H200 NVL") == "h200 nvl"


@pytest.mark.parametrize(
    ("alias", "key"),
    [
        ("A100-SXM4-40GB", "A100-40GB"),
        ("A100-40GB-PCIe", "A100-40GB"),
        ("A100-PCIE-40GB", "A100-40GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("A100-80GB-PCIe", "A100-80GB"),
        ("A100-PCIE-80GB", "A100-80GB"),
        ("H100-PCIE-80GB", "H100-80GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("H100-PCIE-94GB", "H100-94GB"),
        ("H100-SXM5-94GB", "H100-94GB"),
        ("H20", "H20-96GB"),
        ("H100 on GH200", "H100-96GB"),
        ("H200 NVL", "H200-141GB"),
        ("H200-SXM5", "H200-141GB"),
        ("B200", "B200-180GB"),
        ("RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
        ("A30", "A30-24GB"),
    ],
)
def test_user_guide_aliases(alias: str, key: str) -> None:
    model = resolve_model(alias)
    assert model is not None and model.key == key


@pytest.mark.parametrize(
    "name", ["H2", "H200X", "A100", "NVIDIA", "", "H100", "GH200", "B20", "RTX PRO 6000"]
)
def test_partial_names_do_not_match(name: str) -> None:
    assert resolve_model(name) is None


def test_unknown_config_string_matches_only_that_exact_gpu_name() -> None:
    assert names_match("NVIDIA Z999 Test", "NVIDIA Z999 Test")
    assert names_match("Z999 Test", "NVIDIA Z999 Test")
    assert not names_match("Z999", "NVIDIA Z999 Test")
    # A known alias never matches an unknown GPU, and vice versa.
    assert not names_match("B200", "NVIDIA B200X")


def test_grouped_models_share_the_entry() -> None:
    assert names_match("A100-PCIE-40GB", "NVIDIA A100-SXM4-40GB")
    assert names_match("H200-SXM5", "NVIDIA H200 NVL")
    assert not names_match("A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB")


def test_identifiers_are_unique_across_models() -> None:
    seen: dict[str, str] = {}
    for model in KNOWN_MODELS:
        for ident in model.identifiers():
            norm = normalize_model_name(ident)
            assert seen.setdefault(norm, model.key) == model.key, ident


def test_model_profiles_equal_every_board_table() -> None:
    # The controller reads GpuModel.profiles (it has no simulator); they must be the hardware's names.
    for model in KNOWN_MODELS:
        assert model.profiles, model.key
        for key in model.skus:
            assert tuple(r.name for r in SKUS[key].profiles) == model.profiles, key


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A800-SXM4-40GB", "A800-40GB"),
        ("A800 40GB PCIe", "A800-40GB"),
        ("a800-80gb-pcie", "A800-80GB"),
        ("NVIDIA H800", "H800-80GB"),
        ("H800 PCIe", "H800-80GB"),
        ("H20-3e", "H20-141GB"),
        ("NVIDIA GB200", "GB200-186GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000"),
        ("RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000"),
    ],
)
def test_added_models_resolve(name: str, key: str) -> None:
    model = resolve_model(name)
    assert model is not None and model.key == key


def test_a800_is_not_an_a100() -> None:
    # Same MIG tables, different boards: an A100 allowlist entry must not reach an A800.
    assert not names_match("A100-SXM4-80GB", "NVIDIA A800-SXM4-80GB")
    assert not names_match("H100-SXM5-80GB", "NVIDIA H800")
