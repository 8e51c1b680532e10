"""Immutable per-SKU MIG hardware tables for the NVML simulator.

Where each value comes from, and how sure it is, is written down in `docs/hardware.md`. Rows with any
value that is not confirmed by a public `nvidia-smi mig -lgip` / `-lgipp` capture ([U] unconfirmed or
[D] derived from another part) carry `confirmed=False` and a note saying which fields are uncertain.
Memory is NVML's `memorySizeMB` (MiB, i.e. the capture's GiB x 1024); `starts` are placement starts in
memory-slice units, `memory_slices` is the placement size.

These tables are also flexmig's built-in catalog (`driver/catalog/builtin.py`): a node whose NVML
refuses profile queries while MIG mode is off publishes from them until it can ask NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from driver.nvml.types import Architecture


class Variant(StrEnum):
    """Media-engine / graphics flavour of a GI profile; drives the `+me`/`+me.all` creation rules."""

    PLAIN = ""
    ME = "+me"  # REV1: holds the single media-extension engine set
    ME_ALL = "+me.all"  # takes every media engine: only -me profiles may coexist
    NO_ME = "-me"  # no media engines at all
    GFX = "+gfx"


@dataclass(frozen=True, slots=True)
class GiProfileRow:
    name: str  # NVIDIA profile name, e.g. "3g.20gb+me"; the naming-rule test checks it
    enum_index: int  # NVML_GPU_INSTANCE_PROFILE_* used to query it
    profile_id: int  # device-specific id (info.id)
    compute_slices: int
    memory_slices: int
    max_instances: int
    memory_mib: int
    sms: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]
    variant: Variant = Variant.PLAIN
    confirmed: bool = True
    note: str = ""

    @property
    def nvml_name(self) -> str:
        """`info.name` as `nvidia-smi mig -lgip` prints it."""
        return f"MIG {self.name}"


@dataclass(frozen=True, slots=True)
class Sku:
    key: str
    product_name: str  # exact nvmlDeviceGetName result
    pci_device_id: int
    memory_total_mib: int
    architecture: Architecture
    memory_slices: int  # size of the placement axis
    compute_slices: int  # GPU-wide compute-slice budget
    profiles: tuple[GiProfileRow, ...]
    # The compute-instance profile that spans a whole 1g double-memory (REV2) GI, i.e. the one
    # `nvidia-smi mig -cci` picks by default there: 7 (1_SLICE_REV1) on Hopper [C for H100 and GH200,
    # assumed for the other Hopper parts], the plain 1-slice profile 0 elsewhere [D].
    rev2_full_ci_profile: int = 0

    def profile_by_id(self, profile_id: int) -> GiProfileRow | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def profile_by_enum(self, enum_index: int) -> GiProfileRow | None:
        return next((p for p in self.profiles if p.enum_index == enum_index), None)

    @property
    def mig_query_needs_mig_enabled(self) -> bool:
        """Ampere answers MIG profile queries only with MIG on. Hopper+ may answer with MIG off too,
        or refuse like Ampere (nvml.h says NOT_SUPPORTED; unconfirmed on Hopper): the simulator has a
        per-GPU switch for that (`state.MigOffQueries`)."""
        return self.architecture.mig_toggle_needs_reset


GI_ENUM_1_SLICE_REV2 = 9  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: the 1g double-memory GI
CI_PROFILE_1_SLICE = 0  # NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
CI_PROFILE_1_SLICE_REV1 = 7  # NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1

_ALL_7 = (0, 1, 2, 3, 4, 5, 6)
_EVEN_4 = (0, 2, 4, 6)
_EVEN_3 = (0, 2, 4)
_HALVES = (0, 4)
_ZERO = (0,)
_ME, _MEALL, _NOME, _GFX = Variant.ME, Variant.ME_ALL, Variant.NO_ME, Variant.GFX

# Columns: name, enum, id, cSlices, mSlices, max, MiB, SM, CE, DEC, ENC, JPEG, OFA, starts.
_R = GiProfileRow

A100_40GB = (
    _R("1g.5gb", 0, 19, 1, 1, 7, 4864, 14, 1, 0, 0, 0, 0, _ALL_7),
    _R("1g.5gb+me", 7, 20, 1, 1, 1, 4864, 14, 1, 1, 0, 1, 1, _ALL_7, _ME),
    _R("1g.10gb", 9, 15, 1, 2, 4, 9856, 14, 1, 1, 0, 0, 0, _EVEN_4),
    _R("2g.10gb", 1, 14, 2, 2, 3, 9856, 28, 2, 1, 0, 0, 0, _EVEN_3),
    _R("3g.20gb", 2, 9, 3, 4, 2, 19968, 42, 3, 2, 0, 0, 0, _HALVES),
    _R("4g.20gb", 3, 5, 4, 4, 1, 19968, 56, 4, 2, 0, 0, 0, _ZERO),
    _R("7g.40gb", 4, 0, 7, 8, 1, 40192, 98, 7, 5, 0, 1, 1, _ZERO),
)

_A80 = "A100-80GB: ids, SMs, engines, placements [D] from the 40GB part"
_A80_M = _A80 + "; MiB [U] (only the 1g.10gb and 7g.80gb sizes are captured)"
_A80_C = _A80 + "; MiB [C] (driver 515 capture)"
A100_80GB = (
    _R("1g.10gb", 0, 19, 1, 1, 7, 9728, 14, 1, 0, 0, 0, 0, _ALL_7, confirmed=False, note=_A80_C),
    _R("1g.10gb+me", 7, 20, 1, 1, 1, 9728, 14, 1, 1, 0, 1, 1, _ALL_7, _ME, False, _A80_C),
    _R("1g.20gb", 9, 15, 1, 2, 4, 19968, 14, 1, 1, 0, 0, 0, _EVEN_4, confirmed=False, note=_A80_M),
    _R("2g.20gb", 1, 14, 2, 2, 3, 19968, 28, 2, 1, 0, 0, 0, _EVEN_3, confirmed=False, note=_A80_M),
    _R("3g.40gb", 2, 9, 3, 4, 2, 40192, 42, 3, 2, 0, 0, 0, _HALVES, confirmed=False, note=_A80_M),
    _R("4g.40gb", 3, 5, 4, 4, 1, 40192, 56, 4, 2, 0, 0, 0, _ZERO, confirmed=False, note=_A80_M),
    _R("7g.80gb", 4, 0, 7, 8, 1, 80896, 98, 7, 5, 0, 1, 1, _ZERO, confirmed=False, note=_A80_C),
)

H100_80GB = (
    _R("1g.10gb", 0, 19, 1, 1, 7, 9984, 16, 1, 1, 0, 1, 0, _ALL_7),
    _R("1g.10gb+me", 7, 20, 1, 1, 1, 9984, 16, 1, 1, 0, 1, 1, _ALL_7, _ME),
    _R("1g.20gb", 9, 15, 1, 2, 4, 20096, 26, 1, 1, 0, 1, 0, _EVEN_4),
    _R("2g.20gb", 1, 14, 2, 2, 3, 20096, 32, 2, 2, 0, 2, 0, _EVEN_3),
    _R("3g.40gb", 2, 9, 3, 4, 2, 40448, 60, 3, 3, 0, 3, 0, _HALVES),
    _R("4g.40gb", 3, 5, 4, 4, 1, 40448, 64, 4, 4, 0, 4, 0, _ZERO),
    _R("7g.80gb", 4, 0, 7, 8, 1, 81152, 132, 8, 7, 0, 7, 1, _ZERO),
)

# H100 PCIe is a smaller part than the SXM5 board (114 SMs instead of 132), so it needs its own rows:
# the SM split is captured; memory and engines are assumed equal to the SXM5 board's.
_HPCIE = "H100 PCIe: SMs [C]; MiB, engine counts [D] from H100 SXM5"
H100_PCIE_80GB = (
    _R("1g.10gb", 0, 19, 1, 1, 7, 9984, 14, 1, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_HPCIE),
    _R("1g.10gb+me", 7, 20, 1, 1, 1, 9984, 14, 1, 1, 0, 1, 1, _ALL_7, _ME, False, _HPCIE),
    _R("1g.20gb", 9, 15, 1, 2, 4, 20096, 14, 1, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_HPCIE),
    _R("2g.20gb", 1, 14, 2, 2, 3, 20096, 30, 2, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_HPCIE),
    _R("3g.40gb", 2, 9, 3, 4, 2, 40448, 46, 3, 3, 0, 3, 0, _HALVES, confirmed=False, note=_HPCIE),
    _R("4g.40gb", 3, 5, 4, 4, 1, 40448, 62, 4, 4, 0, 4, 0, _ZERO, confirmed=False, note=_HPCIE),
    _R("7g.80gb", 4, 0, 7, 8, 1, 81152, 114, 8, 7, 0, 7, 1, _ZERO, confirmed=False, note=_HPCIE),
)

_NVL = "H100 NVL: engine counts [D] from H100-80GB"
H100_94GB = (
    _R("1g.12gb", 0, 19, 1, 1, 7, 11008, 16, 1, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_NVL),
    _R("1g.12gb+me", 7, 20, 1, 1, 1, 11008, 16, 1, 1, 0, 1, 1, _ALL_7, _ME, False, _NVL),
    _R("1g.24gb", 9, 15, 1, 2, 4, 22144, 26, 1, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_NVL),
    _R("2g.24gb", 1, 14, 2, 2, 3, 22144, 32, 2, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_NVL),
    _R("3g.47gb", 2, 9, 3, 4, 2, 47488, 60, 3, 3, 0, 3, 0, _HALVES, confirmed=False, note=_NVL),
    _R("4g.47gb", 3, 5, 4, 4, 1, 47488, 64, 4, 4, 0, 4, 0, _ZERO, confirmed=False, note=_NVL),
    _R("7g.94gb", 4, 0, 7, 8, 1, 95360, 132, 8, 7, 0, 7, 1, _ZERO, confirmed=False, note=_NVL),
)

_GH = "H100-96GB (GH200): MiB, SMs, engines [C]; placements [D] (A100 geometry assumed)"
_GH12 = "H100-96GB (GH200): 1g.12gb MiB [U]; SMs, engines [C]; placements [D] (A100 geometry assumed)"
H100_96GB = (
    _R("1g.12gb", 0, 19, 1, 1, 7, 11264, 16, 1, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_GH12),
    _R("1g.12gb+me", 7, 20, 1, 1, 1, 11264, 16, 1, 1, 0, 1, 1, _ALL_7, _ME, False, _GH12),
    _R("1g.24gb", 9, 15, 1, 2, 4, 23552, 26, 1, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_GH),
    _R("2g.24gb", 1, 14, 2, 2, 3, 23552, 32, 2, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_GH),
    _R("3g.48gb", 2, 9, 3, 4, 2, 47616, 60, 3, 3, 0, 3, 0, _HALVES, confirmed=False, note=_GH),
    _R("4g.48gb", 3, 5, 4, 4, 1, 47616, 64, 4, 4, 0, 4, 0, _ZERO, confirmed=False, note=_GH),
    _R("7g.96gb", 4, 0, 7, 8, 1, 95232, 132, 8, 7, 0, 7, 1, _ZERO, confirmed=False, note=_GH),
)

# H20 has far fewer SMs than H100 in total; the per-profile split is not captured anywhere, so the
# H100 numbers stand in and every row is flagged.
_H20 = "H20: names [C]; MiB, engines, placements [U]; SMs unknown (H100 values as placeholder)"
H20_96GB = tuple(replace(r, confirmed=False, note=_H20) for r in H100_96GB)

_H200 = "H200: placements [D] (A100 geometry assumed); DEC/JPEG/OFA [D] from H100"
H200_141GB = (
    _R("1g.18gb", 0, 19, 1, 1, 7, 16384, 16, 1, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_H200),
    _R("1g.18gb+me", 7, 20, 1, 1, 1, 16384, 16, 1, 1, 0, 1, 1, _ALL_7, _ME, False, _H200),
    _R("1g.35gb", 9, 15, 1, 2, 4, 33024, 26, 1, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_H200),
    _R("2g.35gb", 1, 14, 2, 2, 3, 33024, 32, 2, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_H200),
    _R("3g.71gb", 2, 9, 3, 4, 2, 71168, 60, 3, 3, 0, 3, 0, _HALVES, confirmed=False, note=_H200),
    _R("4g.71gb", 3, 5, 4, 4, 1, 71168, 64, 4, 4, 0, 4, 0, _ZERO, confirmed=False, note=_H200),
    _R("7g.141gb", 4, 0, 7, 8, 1, 143104, 132, 8, 7, 0, 7, 1, _ZERO, confirmed=False, note=_H200),
)

_B = "B200: placements [D]; DEC/JPEG/OFA from the guide table [U]"
_B_SM = _B + "; SMs [U] (estimated from the 1g count), MiB [U]"
# 2g.45gb: DEC/JPEG 2 are from an -lgip capture; its CE 4 disagrees with the guide's 3.
_B2G = "B200: placements [D]; DEC 2 / JPEG 2 [C]; OFA [U]; CE [U] (capture 4, guide 3)"
B200_180GB = (
    _R("1g.23gb", 0, 19, 1, 1, 7, 22528, 18, 2, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_B),
    _R("1g.23gb+me", 7, 20, 1, 1, 1, 22528, 18, 2, 1, 0, 1, 1, _ALL_7, _ME, False, _B),
    _R("1g.45gb", 9, 15, 1, 2, 4, 45312, 30, 2, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_B),
    _R("2g.45gb", 1, 14, 2, 2, 3, 45312, 36, 4, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_B2G),
    _R("3g.90gb", 2, 9, 3, 4, 2, 91136, 54, 6, 1, 0, 1, 0, _HALVES, confirmed=False, note=_B_SM),
    _R("4g.90gb", 3, 5, 4, 4, 1, 91136, 72, 8, 1, 0, 1, 0, _ZERO, confirmed=False, note=_B_SM + "; R570+"),
    _R("7g.180gb", 4, 0, 7, 8, 1, 183040, 148, 16, 1, 0, 1, 1, _ZERO, confirmed=False, note=_B_SM),
)

_A30E = "A30: engine counts [U] (not in the reference)"
_A30_1G = "A30: DEC 1 [C] (driver 535 capture; the guide says 0); CE, JPEG, OFA [U]"
A30_24GB = (
    _R("1g.6gb", 0, 14, 1, 1, 4, 5952, 14, 1, 1, 0, 0, 0, (0, 1, 2, 3), confirmed=False, note=_A30_1G),
    _R("1g.6gb+me", 7, 21, 1, 1, 1, 5952, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3), _ME, False, _A30E),
    _R("2g.12gb", 1, 5, 2, 2, 2, 11968, 28, 2, 2, 0, 0, 0, (0, 2), confirmed=False, note=_A30E),
    _R("2g.12gb+me", 8, 6, 2, 2, 1, 11968, 28, 2, 2, 0, 1, 1, (0, 2), _ME, False, _A30E + "; MiB [D]"),
    _R("4g.24gb", 3, 0, 4, 4, 1, 24064, 56, 4, 4, 0, 1, 1, _ZERO, confirmed=False, note=_A30E),
)

_RTX = "RTX PRO 6000: copy-engine counts [U]"
_Q = (0, 3, 6, 9)
RTX_PRO_6000 = (
    _R("1g.24gb", 0, 14, 1, 3, 4, 24192, 46, 1, 1, 1, 1, 0, _Q, confirmed=False, note=_RTX),
    _R("1g.24gb+me", 7, 21, 1, 3, 1, 24192, 46, 1, 1, 1, 1, 1, _Q, _ME, False, _RTX),
    _R("1g.24gb+gfx", 10, 47, 1, 3, 4, 24192, 46, 1, 1, 1, 1, 0, _Q, _GFX, False, _RTX),
    _R("1g.24gb+me.all", 15, 65, 1, 3, 1, 24192, 46, 1, 4, 4, 4, 1, _Q, _MEALL, False, _RTX),
    _R("1g.24gb-me", 13, 67, 1, 3, 4, 24192, 46, 1, 0, 0, 0, 0, _Q, _NOME, False, _RTX),
    _R("2g.48gb", 1, 5, 2, 6, 2, 48512, 94, 2, 2, 2, 2, 0, (0, 6), confirmed=False, note=_RTX),
    _R("2g.48gb+gfx", 11, 35, 2, 6, 2, 48512, 94, 2, 2, 2, 2, 0, (0, 6), _GFX, False, _RTX),
    _R("2g.48gb+me.all", 16, 64, 2, 6, 1, 48512, 94, 2, 4, 4, 4, 1, (0, 6), _MEALL, False, _RTX),
    _R("2g.48gb-me", 14, 66, 2, 6, 2, 48512, 94, 2, 0, 0, 0, 0, (0, 6), _NOME, False, _RTX),
    _R("4g.96gb", 3, 0, 4, 12, 1, 97408, 188, 4, 4, 4, 4, 1, _ZERO, confirmed=False, note=_RTX),
    _R("4g.96gb+gfx", 12, 32, 4, 12, 1, 97408, 188, 4, 4, 4, 4, 1, _ZERO, _GFX, False, _RTX),
)


# Boards no public capture covers (docs/hardware.md, "Models without a capture"). Each reuses the
# table of the part it is built from, because NVIDIA's MIG user guide lists the same profile names,
# instance counts and memory fractions for both; every row is marked unconfirmed with its source.
def _derived(rows: tuple[GiProfileRow, ...], note: str) -> tuple[GiProfileRow, ...]:
    return tuple(replace(r, confirmed=False, note=note) for r in rows)


# A800: the export variant of the A100 (same die and memory, reduced NVLink), so the A100 tables.
A800_40GB = _derived(A100_40GB, "A800 40GB: every value [D] from A100-40GB (same die); no capture")
A800_80GB = _derived(A100_80GB, "A800 80GB: every value [D] from A100-80GB (same die); no capture")
# H800: the export variant of the H100 (reduced NVLink/FP64); SXM5 and PCIe keep H100's SM splits.
H800_80GB = _derived(H100_80GB, "H800: every value [D] from H100 SXM5 (same die); no capture")
H800_PCIE_80GB = _derived(H100_PCIE_80GB, "H800 PCIe: every value [D] from H100 PCIe; no capture")
# H20 with 141 GB HBM3e: the H200's memory geometry; SMs unknown (H200 values as placeholder).
H20_141GB = _derived(
    H200_141GB, "H20 141GB: names [D] from the naming rule; everything else [U] (H200 values)"
)
# GB200: names and two SM counts from mig.md (mig-parted); the rest scaled from the B200 [U].
_GB = "GB200: names [C]; MiB [U] (B200 scaled to 186 GB); placements [D]; engines from B200 [U]"
_GB_SM = _GB + "; SMs [C]"
GB200_186GB = (
    _R("1g.23gb", 0, 19, 1, 1, 7, 23296, 18, 2, 1, 0, 1, 0, _ALL_7, confirmed=False, note=_GB),
    _R("1g.23gb+me", 7, 20, 1, 1, 1, 23296, 18, 2, 1, 0, 1, 1, _ALL_7, _ME, False, _GB),
    _R("1g.47gb", 9, 15, 1, 2, 4, 46848, 32, 2, 1, 0, 1, 0, _EVEN_4, confirmed=False, note=_GB_SM),
    _R("2g.47gb", 1, 14, 2, 2, 3, 46848, 38, 4, 2, 0, 2, 0, _EVEN_3, confirmed=False, note=_GB_SM),
    _R("3g.93gb", 2, 9, 3, 4, 2, 94208, 54, 6, 1, 0, 1, 0, _HALVES, confirmed=False, note=_GB),
    _R("4g.93gb", 3, 5, 4, 4, 1, 94208, 72, 8, 1, 0, 1, 0, _ZERO, confirmed=False, note=_GB),
    _R("7g.186gb", 4, 0, 7, 8, 1, 189184, 152, 16, 1, 0, 1, 1, _ZERO, confirmed=False, note=_GB),
)
# RTX PRO 6000 Workstation and Max-Q: the Server Edition's die and memory (188 SMs, 96 GB).
RTX_PRO_6000_WS = _derived(RTX_PRO_6000, "RTX PRO 6000 Workstation/Max-Q: [D] from the Server Edition")

_AMP, _HOP, _BW = Architecture.AMPERE, Architecture.HOPPER, Architecture.BLACKWELL


def _sku(key: str, name: str, pci: int, mib: int, arch: Architecture, rows: tuple[GiProfileRow, ...]) -> Sku:
    mem = max(r.memory_slices for r in rows)
    compute = max(r.compute_slices for r in rows)
    rev2_ci = CI_PROFILE_1_SLICE_REV1 if arch is _HOP else CI_PROFILE_1_SLICE
    return Sku(key, name, pci, mib, arch, mem, compute, rows, rev2_ci)


SKUS: dict[str, Sku] = {
    s.key: s
    for s in (
        _sku("A30-24GB", "NVIDIA A30", 0x20B7, 24576, _AMP, A30_24GB),
        _sku("A100-40GB", "NVIDIA A100-SXM4-40GB", 0x20B0, 40960, _AMP, A100_40GB),
        _sku("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 0x20F1, 40960, _AMP, A100_40GB),
        _sku("A100-80GB", "NVIDIA A100-SXM4-80GB", 0x20B2, 81920, _AMP, A100_80GB),
        _sku("H100-80GB", "NVIDIA H100 80GB HBM3", 0x2330, 81559, _HOP, H100_80GB),
        _sku("H100-PCIE-80GB", "NVIDIA H100 PCIe", 0x2331, 81559, _HOP, H100_PCIE_80GB),
        _sku("H100-94GB", "NVIDIA H100 NVL", 0x2321, 95830, _HOP, H100_94GB),
        _sku("H100-96GB", "NVIDIA GH200 480GB", 0x2342, 97871, _HOP, H100_96GB),
        _sku("H20-96GB", "NVIDIA H20", 0x2329, 97871, _HOP, H20_96GB),
        _sku("H200-141GB", "NVIDIA H200", 0x2335, 143771, _HOP, H200_141GB),
        _sku("H200-NVL-141GB", "NVIDIA H200 NVL", 0x233B, 143771, _HOP, H200_141GB),
        _sku("B200-180GB", "NVIDIA B200", 0x2901, 183359, _BW, B200_180GB),
        _sku(
            "RTX-PRO-6000",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            0x2BB5,
            97887,
            _BW,
            RTX_PRO_6000,
        ),
        _sku("A800-40GB", "NVIDIA A800-SXM4-40GB", 0x20F8, 40960, _AMP, A800_40GB),
        _sku("A800-PCIE-40GB", "NVIDIA A800 40GB PCIe", 0x20F6, 40960, _AMP, A800_40GB),
        _sku("A800-80GB", "NVIDIA A800-SXM4-80GB", 0x20F3, 81920, _AMP, A800_80GB),
        _sku("A800-PCIE-80GB", "NVIDIA A800 80GB PCIe", 0x20F5, 81920, _AMP, A800_80GB),
        _sku("H800-80GB", "NVIDIA H800", 0x2324, 81559, _HOP, H800_80GB),
        _sku("H800-PCIE-80GB", "NVIDIA H800 PCIe", 0x2322, 81559, _HOP, H800_PCIE_80GB),
        _sku("H20-141GB", "NVIDIA H20-3e", 0x232C, 143771, _HOP, H20_141GB),
        _sku("GB200-186GB", "NVIDIA GB200", 0x2941, 189471, _BW, GB200_186GB),
        _sku(
            "RTX-PRO-6000-WS",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            0x2BB1,
            97887,
            _BW,
            RTX_PRO_6000_WS,
        ),
        _sku(
            "RTX-PRO-6000-MAXQ",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            0x2BB4,
            97887,
            _BW,
            RTX_PRO_6000_WS,
        ),
    )
}

# Compute-instance profile enum per CI slice count (NVML_COMPUTE_INSTANCE_PROFILE_*); nvidia-smi shows
# the enum as the CI profile id.
CI_ENUM_BY_SLICES: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


@dataclass(frozen=True, slots=True)
class CiProfileRow:
    """A compute-instance profile inside a GI of `gi_slices` compute slices [D: go-nvlib heuristic]."""

    enum_index: int
    profile_id: int
    slices: int
    max_instances: int
    sms: int
    starts: tuple[int, ...]  # compute-slice starts inside the GI [D]


def ci_profiles(sku: Sku, gi: GiProfileRow) -> tuple[CiProfileRow, ...]:
    """The CI profiles NVML reports inside a GI of profile `gi` on `sku`.

    Valid CI sizes C inside a G-slice GI: C <= G and (C == G or 2C <= G + 1). A 1g double-memory GI on
    Hopper also reports CI profile 7 (1_SLICE_REV1), which is the one spanning the GI's SMs; the plain
    1-slice profile there gets only an ordinary 1g slice's SMs (whether the hardware accepts it at all
    is [U]), so a caller that takes the lowest id gets a smaller instance than the GI it paid for.
    """
    g = gi.compute_slices
    rows: list[CiProfileRow] = []
    for c, enum_index in sorted(CI_ENUM_BY_SLICES.items()):
        if c > g or (c != g and 2 * c > g + 1):
            continue
        starts = tuple(range(0, g - c + 1, c))
        rows.append(CiProfileRow(enum_index, enum_index, c, g // c, gi.sms * c // g, starts))
    if gi.enum_index == GI_ENUM_1_SLICE_REV2 and sku.rev2_full_ci_profile == CI_PROFILE_1_SLICE_REV1:
        plain_sms = min(r.sms for r in sku.profiles if r.compute_slices == 1)
        rows = [replace(r, sms=plain_sms) if r.enum_index == CI_PROFILE_1_SLICE else r for r in rows]
        rows.append(CiProfileRow(CI_PROFILE_1_SLICE_REV1, CI_PROFILE_1_SLICE_REV1, 1, 1, gi.sms, (0,)))
    return tuple(rows)


def is_full_gpu(sku: Sku, row: GiProfileRow) -> bool:
    return row.memory_slices == sku.memory_slices
