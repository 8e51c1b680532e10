"""Known MIG-capable GPU models: canonical keys, exact NVML product names and configuration aliases.

Matching is always *exact* (after trimming, collapsing whitespace, ignoring case and an optional
"NVIDIA " prefix). HAMi matches allowlist models with a substring test, so "H20" also matches
"NVIDIA H200" and H200 nodes get the H20 profile list; an exact match cannot make that mistake.

A model groups the simulator SKUs whose MIG profile tables are identical (SXM and PCIe boards of the
same memory size), so one allowlist entry serves all of them, as in the user guide's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

_NVIDIA_PREFIX = "nvidia "


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str  # canonical key, e.g. "A100-40GB"
    skus: tuple[str, ...]  # simulator SKU keys sharing this profile table
    nvml_names: tuple[str, ...]  # exact nvmlDeviceGetName() values
    aliases: tuple[str, ...]  # names used in configuration (HAMi's allowlist model strings)
    profiles: tuple[str, ...] = ()
    """Every GPU-instance profile the model offers, by NVIDIA's name. The controller has no NVML and
    no simulator, yet the shim must tell whether `nvidia.com/mig-3g.20gb` can exist anywhere; a test
    keeps this equal to the hardware tables (driver/nvml/sim/hardware.py)."""

    def identifiers(self) -> tuple[str, ...]:
        """Every string that names this model in configuration or on the command line."""
        return (self.key, *self.skus, *self.nvml_names, *self.aliases)


def _ladder(one: int, double: int, half: int, full: int) -> tuple[str, ...]:
    """The 7-compute-slice family's names (A100/H100/H200/B200 geometry) from its four GB figures."""
    return (
        f"1g.{one}gb",
        f"1g.{one}gb+me",
        f"1g.{double}gb",
        f"2g.{double}gb",
        f"3g.{half}gb",
        f"4g.{half}gb",
        f"7g.{full}gb",
    )


_RTX_PRO_6000 = (
    *(f"1g.24gb{s}" for s in ("", "+me", "+gfx", "+me.all", "-me")),
    *(f"2g.48gb{s}" for s in ("", "+gfx", "+me.all", "-me")),
    "4g.96gb",
    "4g.96gb+gfx",
)

KNOWN_MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        key="A30-24GB",
        skus=("A30-24GB",),
        nvml_names=("NVIDIA A30",),
        aliases=("A30",),
        profiles=("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
    ),
    GpuModel(
        key="A100-40GB",
        skus=("A100-40GB", "A100-PCIE-40GB"),
        nvml_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        aliases=("A100-SXM4-40GB", "A100-40GB-PCIe"),
        profiles=("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ),
    GpuModel(
        key="A100-80GB",
        skus=("A100-80GB",),
        nvml_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        aliases=("A100-80GB-PCIe", "A100-PCIE-80GB"),
        profiles=_ladder(10, 20, 40, 80),
    ),
    GpuModel(
        # The A100's export variant: same die and MIG tables, its own name (an A100 entry of the
        # allowlist must not reach it, nor the other way round).
        key="A800-40GB",
        skus=("A800-40GB", "A800-PCIE-40GB"),
        nvml_names=("NVIDIA A800-SXM4-40GB", "NVIDIA A800 40GB PCIe"),
        aliases=("A800-SXM4-40GB", "A800-40GB-PCIe"),
        profiles=("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ),
    GpuModel(
        key="A800-80GB",
        skus=("A800-80GB", "A800-PCIE-80GB"),
        nvml_names=("NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe"),
        aliases=("A800-SXM4-80GB", "A800-80GB-PCIe"),
        profiles=_ladder(10, 20, 40, 80),
    ),
    GpuModel(
        key="H100-80GB",
        skus=("H100-80GB", "H100-PCIE-80GB"),
        nvml_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
        aliases=("H100-SXM5-80GB",),
        profiles=_ladder(10, 20, 40, 80),
    ),
    GpuModel(
        key="H800-80GB",
        skus=("H800-80GB", "H800-PCIE-80GB"),
        nvml_names=("NVIDIA H800", "NVIDIA H800 PCIe"),
        aliases=("H800-SXM5-80GB", "H800-SXM5"),
        profiles=_ladder(10, 20, 40, 80),
    ),
    GpuModel(
        key="H100-94GB",
        skus=("H100-94GB",),
        nvml_names=("NVIDIA H100 NVL",),
        aliases=("H100-PCIE-94GB", "H100-SXM5-94GB"),
        profiles=_ladder(12, 24, 47, 94),
    ),
    GpuModel(
        key="H100-96GB",
        skus=("H100-96GB",),
        nvml_names=("NVIDIA GH200 480GB",),
        aliases=("H100 on GH200",),
        profiles=_ladder(12, 24, 48, 96),
    ),
    GpuModel(
        # Same profile names as the GH200's H100-96GB but far fewer SMs, so its own model.
        key="H20-96GB",
        skus=("H20-96GB",),
        nvml_names=("NVIDIA H20",),
        aliases=(),
        profiles=_ladder(12, 24, 48, 96),
    ),
    GpuModel(
        # The H20 with 141 GB of HBM3e: the H200's memory geometry.
        key="H20-141GB",
        skus=("H20-141GB",),
        nvml_names=("NVIDIA H20-3e",),
        aliases=("H20-3e",),
        profiles=_ladder(18, 35, 71, 141),
    ),
    GpuModel(
        key="H200-141GB",
        skus=("H200-141GB", "H200-NVL-141GB"),
        nvml_names=("NVIDIA H200", "NVIDIA H200 NVL"),
        aliases=("H200-SXM5",),
        profiles=_ladder(18, 35, 71, 141),
    ),
    GpuModel(
        key="B200-180GB",
        skus=("B200-180GB",),
        nvml_names=("NVIDIA B200",),
        aliases=(),
        profiles=_ladder(23, 45, 90, 180),
    ),
    GpuModel(
        key="GB200-186GB",
        skus=("GB200-186GB",),
        nvml_names=("NVIDIA GB200",),
        aliases=(),
        profiles=_ladder(23, 47, 93, 186),
    ),
    GpuModel(
        # Server, Workstation and Max-Q editions: one die, one MIG table.
        key="RTX-PRO-6000",
        skus=("RTX-PRO-6000", "RTX-PRO-6000-WS", "RTX-PRO-6000-MAXQ"),
        nvml_names=(
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        ),
        aliases=(),
        profiles=_RTX_PRO_6000,
    ),
)


def normalize_model_name(name: str) -> str:
    """Canonical comparison form: trimmed, single spaces, case-folded, without the "NVIDIA " prefix.

    Only the *form* is normalised; the comparison stays an equality test.
    """
    folded = " ".join(name.split()).casefold()
    if folded.startswith(_NVIDIA_PREFIX):
        folded = folded[len(_NVIDIA_PREFIX) :]
    return folded


def _build_index(models: tuple[GpuModel, ...]) -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for model in models:
        for ident in model.identifiers():
            norm = normalize_model_name(ident)
            other = index.get(norm)
            # Two models answering to one name would make matching order-dependent; fail at import.
            if other is not None and other is not model:
                raise ValueError(f"model name {ident!r} is claimed by both {other.key} and {model.key}")
            index[norm] = model
    return index


_BY_IDENTIFIER = _build_index(KNOWN_MODELS)
_BY_NVML_NAME = {normalize_model_name(n): m for m in KNOWN_MODELS for n in m.nvml_names}


def model_for_nvml_name(nvml_name: str) -> GpuModel | None:
    """The model of a GPU as NVML names it ("NVIDIA H200" or "H200"); None when unknown."""
    return _BY_NVML_NAME.get(normalize_model_name(nvml_name))


def resolve_model(name: str) -> GpuModel | None:
    """The model a configuration or CLI string names: key, SKU key, NVML name or alias; exact only."""
    return _BY_IDENTIFIER.get(normalize_model_name(name))


def names_match(config_name: str, nvml_name: str) -> bool:
    """Whether a configuration model string designates a GPU that NVML calls `nvml_name`.

    A known string matches every GPU of its model; an unknown string matches only a GPU whose NVML
    name is exactly that string (so an admin can still list a GPU this catalog does not know yet).
    """
    configured = resolve_model(config_name)
    gpu_model = model_for_nvml_name(nvml_name)
    if configured is not None and gpu_model is not None:
        return configured is gpu_model
    return normalize_model_name(config_name) == normalize_model_name(nvml_name)


def model_keys() -> tuple[str, ...]:
    return tuple(m.key for m in KNOWN_MODELS)
