"""NVIDIA's profile naming rule (go-nvlib), checked against names NVIDIA's tools print."""

from __future__ import annotations

from fractions import Fraction

import pytest

from driver.catalog.naming import (
    GiProfileEnum,
    is_valid_profile_name,
    memory_gb,
    profile_name,
    profile_suffix,
    suffix_for_enum,
)

E = GiProfileEnum


@pytest.mark.parametrize(
    ("slices", "memory_mib", "total_mib", "enum_index", "expected"),
    [
        # A100-SXM4-40GB, NVML memorySizeMB values from `nvidia-smi mig -lgip`.
        (1, 4864, 40960, E.SLICE_1, "1g.5gb"),
        (1, 4864, 40960, E.SLICE_1_REV1, "1g.5gb+me"),
        (1, 9856, 40960, E.SLICE_1_REV2, "1g.10gb"),
        (2, 9856, 40960, E.SLICE_2, "2g.10gb"),
        (3, 19968, 40960, E.SLICE_3, "3g.20gb"),
        (4, 19968, 40960, E.SLICE_4, "4g.20gb"),
        (7, 40192, 40960, E.SLICE_7, "7g.40gb"),
        # A100-80GB: the full profile is 7g.80gb (the user guide's "7g.79gb" is not NVIDIA's name).
        (7, 81152, 81920, E.SLICE_7, "7g.80gb"),
        # H100 80GB HBM3 (81559 MiB total rounds up to 80 GiB).
        (1, 9984, 81559, E.SLICE_1, "1g.10gb"),
        (7, 81152, 81559, E.SLICE_7, "7g.80gb"),
        # H200: 141 GiB x 4/8 = 70.5 rounds half away from zero to 71.
        (3, 71168, 143771, E.SLICE_3, "3g.71gb"),
        (2, 33024, 143771, E.SLICE_2, "2g.35gb"),
        (1, 16384, 143771, E.SLICE_1, "1g.18gb"),
        # A30, 4-slice GPU.
        (2, 11968, 24576, E.SLICE_2_REV1, "2g.12gb+me"),
        # RTX PRO 6000 variants.
        (1, 24192, 97887, E.SLICE_1_ALL_ME, "1g.24gb+me.all"),
        (2, 48512, 97887, E.SLICE_2_ALL_ME, "2g.48gb+me.all"),
        (1, 24192, 97887, E.SLICE_1_GFX, "1g.24gb+gfx"),
        (4, 97408, 97887, E.SLICE_4_GFX, "4g.96gb+gfx"),
        (1, 24192, 97887, E.SLICE_1_NO_ME, "1g.24gb-me"),
        (2, 48512, 97887, E.SLICE_2_NO_ME, "2g.48gb-me"),
    ],
)
def test_profile_names(slices: int, memory_mib: int, total_mib: int, enum_index: int, expected: str) -> None:
    assert profile_name(slices, memory_mib, total_mib, enum_index) == expected
    assert is_valid_profile_name(expected)


def test_b200_half_rounds_away_from_zero() -> None:
    # 1/8 of a 180 GiB GPU is 22.5: Go's math.Round gives 23, Python's round() would give 22.
    assert memory_gb(22528, 183359) == 23
    assert profile_name(1, 22528, 183359) == "1g.23gb"


def test_exact_eighths_do_not_round_up() -> None:
    # Exactly a quarter of the GPU must stay 2/8 (float arithmetic can push it over).
    assert memory_gb(10240, 40960) == 10
    assert memory_gb(10241, 40960) == 15


def test_compute_instance_name_form() -> None:
    assert profile_name(3, 19968, 40960, compute_slices=1) == "1c.3g.20gb"
    assert profile_name(3, 19968, 40960, compute_slices=3) == "3g.20gb"


def test_every_variant_suffix() -> None:
    assert {e: suffix_for_enum(e) for e in E} == {
        E.SLICE_1: "",
        E.SLICE_2: "",
        E.SLICE_3: "",
        E.SLICE_4: "",
        E.SLICE_7: "",
        E.SLICE_8: "",
        E.SLICE_6: "",
        E.SLICE_1_REV1: "+me",
        E.SLICE_2_REV1: "+me",
        E.SLICE_1_REV2: "",
        E.SLICE_1_GFX: "+gfx",
        E.SLICE_2_GFX: "+gfx",
        E.SLICE_4_GFX: "+gfx",
        E.SLICE_3_GFX: "+gfx",
        E.SLICE_1_NO_ME: "-me",
        E.SLICE_2_NO_ME: "-me",
        E.SLICE_1_ALL_ME: "+me.all",
        E.SLICE_2_ALL_ME: "+me.all",
    }


@pytest.mark.parametrize(
    "name", ["1g.5gb", "1c.3g.20gb", "7g.141gb", "1g.24gb+me.all", "2g.48gb-me", "4g.96gb+gfx", "1g.5gb+me"]
)
def test_valid_names(name: str) -> None:
    assert is_valid_profile_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "1g", "1g.5", "1g.5GB", "g.5gb", "1g.5gb+ME", "1g.5gb+me.al", "1g.5gb ", "3g.20gb+me+gfx", "1.5gb"],
)
def test_invalid_names(name: str) -> None:
    assert not is_valid_profile_name(name)


def test_profile_suffix() -> None:
    assert profile_suffix("1g.24gb+me.all") == "+me.all"
    assert profile_suffix("1g.24gb-me") == "-me"
    assert profile_suffix("3g.20gb") == ""
    assert profile_suffix("garbage") == ""


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        memory_gb(1, 0)
    with pytest.raises(ValueError):
        memory_gb(-1, 1024)
    with pytest.raises(ValueError):
        profile_name(0, 1, 1024)


def test_round_half_away_matches_definition() -> None:
    # Brute-force the formula with exact fractions for a range of sizes: the result is always the
    # nearest integer to ceil(8 * fraction) / 8 * whole GiB, halves upward.
    for total in (24576, 40960, 81559, 97887, 143771, 183359):
        gib = -(-total // 1024)
        for eighths in range(1, 9):
            mem = total * eighths // 8
            value = Fraction(-(-mem * 8 // total), 8) * gib
            expected = int(value) + (1 if value - int(value) >= Fraction(1, 2) else 0)
            assert memory_gb(mem, total) == expected
