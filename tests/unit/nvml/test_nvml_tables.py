"""Every simulator table row must carry the NVIDIA profile name the go-nvlib rule produces."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import pytest

from driver.nvml.sim import SKUS
from driver.nvml.sim.hardware import CI_ENUM_BY_SLICES, GiProfileRow, Variant, ci_profiles
from driver.nvml.types import Architecture

_SUFFIX = {
    Variant.PLAIN: "",
    Variant.ME: "+me",
    Variant.ME_ALL: "+me.all",
    Variant.NO_ME: "-me",
    Variant.GFX: "+gfx",
}


def expected_name(compute_slices: int, memory_mib: int, total_mib: int, variant: Variant) -> str:
    """go-nvlib: GB = round_half_away(ceil(mem/total*8)/8 * ceil(total/1024))."""
    eighths = math.ceil(memory_mib / total_mib * 8)
    gb = Decimal(eighths) / 8 * math.ceil(total_mib / 1024)
    rounded = int(gb.quantize(Decimal(1), rounding=ROUND_HALF_UP))  # Go's math.Round, not banker's
    return f"{compute_slices}g.{rounded}gb{_SUFFIX[variant]}"


ROWS = [(key, row) for key, sku in SKUS.items() for row in sku.profiles]


@pytest.mark.parametrize(("key", "r"), ROWS, ids=[f"{k}:{r.name}" for k, r in ROWS])
def test_row_name_follows_go_nvlib_rule(key: str, r: GiProfileRow) -> None:
    sku = SKUS[key]
    assert sku.profile_by_id(r.profile_id) is r
    assert r.name == expected_name(r.compute_slices, r.memory_mib, sku.memory_total_mib, r.variant)
    assert r.nvml_name == f"MIG {r.name}"


def test_half_away_rounding_cases() -> None:
    assert expected_name(1, 22528, 183359, Variant.PLAIN) == "1g.23gb"  # 22.5 -> 23
    assert expected_name(3, 71168, 143771, Variant.PLAIN) == "3g.71gb"  # 70.5 -> 71


@pytest.mark.parametrize("key", sorted(SKUS))
def test_table_geometry_is_consistent(key: str) -> None:
    sku = SKUS[key]
    ids = [r.profile_id for r in sku.profiles]
    enums = [r.enum_index for r in sku.profiles]
    assert len(set(ids)) == len(ids) and len(set(enums)) == len(enums)
    for r in sku.profiles:
        assert r.starts, r.name
        assert all(s + r.memory_slices <= sku.memory_slices for s in r.starts), r.name
        assert r.compute_slices <= sku.compute_slices
        # Unconfirmed rows must say what is uncertain.
        assert r.confirmed or r.note
        # The CI profile spanning the whole GI (all its slices and SMs; the variant when two do) is the
        # size's own profile, or on a 1g double-memory GI the SKU's REV2 default.
        full = [c for c in ci_profiles(sku, r) if c.slices == r.compute_slices and c.sms == r.sms]
        assert full, r.name
        wanted = sku.rev2_full_ci_profile if r.enum_index == 9 else CI_ENUM_BY_SLICES[r.compute_slices]
        assert max(c.profile_id for c in full) == wanted, r.name


def test_sku_identities() -> None:
    expected = {
        "A30-24GB": ("NVIDIA A30", 0x20B7, 24576, Architecture.AMPERE),
        "A100-40GB": ("NVIDIA A100-SXM4-40GB", 0x20B0, 40960, Architecture.AMPERE),
        "A100-PCIE-40GB": ("NVIDIA A100-PCIE-40GB", 0x20F1, 40960, Architecture.AMPERE),
        "A100-80GB": ("NVIDIA A100-SXM4-80GB", 0x20B2, 81920, Architecture.AMPERE),
        "H100-80GB": ("NVIDIA H100 80GB HBM3", 0x2330, 81559, Architecture.HOPPER),
        "H100-PCIE-80GB": ("NVIDIA H100 PCIe", 0x2331, 81559, Architecture.HOPPER),
        "H100-94GB": ("NVIDIA H100 NVL", 0x2321, 95830, Architecture.HOPPER),
        "H100-96GB": ("NVIDIA GH200 480GB", 0x2342, 97871, Architecture.HOPPER),
        "H20-96GB": ("NVIDIA H20", 0x2329, 97871, Architecture.HOPPER),
        "H200-141GB": ("NVIDIA H200", 0x2335, 143771, Architecture.HOPPER),
        "H200-NVL-141GB": ("NVIDIA H200 NVL", 0x233B, 143771, Architecture.HOPPER),
        "B200-180GB": ("NVIDIA B200", 0x2901, 183359, Architecture.BLACKWELL),
        "RTX-PRO-6000": (
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            0x2BB5,
            97887,
            Architecture.BLACKWELL,
        ),
        # Boards without a capture (docs/hardware.md, "Models without a capture").
        "A800-40GB": ("NVIDIA A800-SXM4-40GB", 0x20F8, 40960, Architecture.AMPERE),
        "A800-PCIE-40GB": ("NVIDIA A800 40GB PCIe", 0x20F6, 40960, Architecture.AMPERE),
        "A800-80GB": ("NVIDIA A800-SXM4-80GB", 0x20F3, 81920, Architecture.AMPERE),
        "A800-PCIE-80GB": ("NVIDIA A800 80GB PCIe", 0x20F5, 81920, Architecture.AMPERE),
        "H800-80GB": ("NVIDIA H800", 0x2324, 81559, Architecture.HOPPER),
        "H800-PCIE-80GB": ("NVIDIA H800 PCIe", 0x2322, 81559, Architecture.HOPPER),
        "H20-141GB": ("NVIDIA H20-3e", 0x232C, 143771, Architecture.HOPPER),
        "GB200-186GB": ("NVIDIA GB200", 0x2941, 189471, Architecture.BLACKWELL),
        "RTX-PRO-6000-WS": (
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            0x2BB1,
            97887,
            Architecture.BLACKWELL,
        ),
        "RTX-PRO-6000-MAXQ": (
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            0x2BB4,
            97887,
            Architecture.BLACKWELL,
        ),
    }
    got = {k: (s.product_name, s.pci_device_id, s.memory_total_mib, s.architecture) for k, s in SKUS.items()}
    assert got == expected
    assert (SKUS["A30-24GB"].memory_slices, SKUS["A30-24GB"].compute_slices) == (4, 4)
    assert (SKUS["RTX-PRO-6000"].memory_slices, SKUS["RTX-PRO-6000"].compute_slices) == (12, 4)
    assert (SKUS["H200-141GB"].memory_slices, SKUS["H200-141GB"].compute_slices) == (8, 7)


def test_seven_slice_family_ids_and_placements() -> None:
    for key in ("A100-40GB", "H100-80GB", "H200-141GB", "B200-180GB", "H20-96GB", "GB200-186GB", "A800-80GB"):
        by_id = {r.profile_id: (r.enum_index, r.memory_slices, r.starts) for r in SKUS[key].profiles}
        assert by_id == {
            19: (0, 1, (0, 1, 2, 3, 4, 5, 6)),
            20: (7, 1, (0, 1, 2, 3, 4, 5, 6)),
            15: (9, 2, (0, 2, 4, 6)),
            14: (1, 2, (0, 2, 4)),
            9: (2, 4, (0, 4)),
            5: (3, 4, (0,)),
            0: (4, 8, (0,)),
        }, key


def test_ci_profiles_follow_size_heuristic() -> None:
    seven = SKUS["A100-40GB"].profile_by_id(0)
    four = SKUS["A100-40GB"].profile_by_id(5)
    assert seven is not None and four is not None
    a100 = SKUS["A100-40GB"]
    assert [(c.slices, c.profile_id) for c in ci_profiles(a100, seven)] == [
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 3),
        (7, 4),
    ]
    assert [c.slices for c in ci_profiles(a100, four)] == [1, 2, 4]
    # The A100's 1g.10gb has one 1-slice CI profile: the plain one.
    double = a100.profile_by_id(15)
    assert double is not None
    assert [(c.profile_id, c.sms) for c in ci_profiles(a100, double)] == [(0, 14)]


@pytest.mark.parametrize(("key", "gi_sms", "plain_sms"), [("H100-80GB", 26, 16), ("H100-96GB", 26, 16)])
def test_hopper_double_memory_1g_reports_ci_profile_7_as_full(key: str, gi_sms: int, plain_sms: int) -> None:
    """1g.20gb (H100) / 1g.24gb (GH200): CI profile 7 spans the GI; profile 0 is an ordinary 1g slice."""
    sku = SKUS[key]
    double = sku.profile_by_id(15)
    assert double is not None and double.sms == gi_sms
    assert [(c.profile_id, c.slices, c.sms) for c in ci_profiles(sku, double)] == [
        (0, 1, plain_sms),
        (7, 1, gi_sms),
    ]


def _facts(key: str, name: str) -> tuple[float, int, int, int, int]:
    row = next(r for r in SKUS[key].profiles if r.name == name)
    return (row.memory_mib / 1024, row.sms, row.ce, row.dec, row.jpeg)


def test_corrections_from_public_captures() -> None:
    """The values the -lgip audit corrected (docs/hardware.md)."""
    pcie = [r.sms for r in SKUS["H100-PCIE-80GB"].profiles]
    assert pcie == [14, 14, 14, 30, 46, 62, 114]
    assert [r.sms for r in SKUS["H100-80GB"].profiles] == [16, 16, 26, 32, 60, 64, 132]
    gh200 = {r.name: r.memory_mib / 1024 for r in SKUS["H100-96GB"].profiles}
    assert (gh200["1g.24gb"], gh200["2g.24gb"], gh200["3g.48gb"], gh200["4g.48gb"]) == (23, 23, 46.5, 46.5)
    assert gh200["7g.96gb"] == 93
    assert _facts("A100-80GB", "1g.10gb")[0] == 9.5 and _facts("A100-80GB", "7g.80gb")[0] == 79
    assert _facts("A30-24GB", "1g.6gb")[3] == 1
    assert _facts("B200-180GB", "2g.45gb")[3:] == (2, 2)
