"""Catalogs of GPU models without the hardware: discovery on a throw-away simulator state.

`flexmig profiles` / `flexmig layouts` answer questions about a model ("which layouts does an H200
allow?") on any machine. They run exactly the code a node runs -- the NVML port, `discover`, the
allowlist -- against a simulated GPU of that model, so the answers cannot drift from what a node would
publish; nothing about the models is duplicated here.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist
from driver.catalog.discover import discover
from driver.catalog.models import KNOWN_MODELS, GpuModel, normalize_model_name, resolve_model
from driver.catalog.types import GpuCatalog
from driver.nvml.sim import SKUS, SimGpuSpec, init_sim_state, open_sim


class UnknownModelError(ValueError):
    """The model string names no simulated SKU; the message lists the accepted values."""


def sku_keys() -> tuple[str, ...]:
    return tuple(SKUS)


def _sku_of_model(model: GpuModel, alias: str) -> str | None:
    """The board an alias of a multi-board model means: the form factor it names, else the first.

    "A100-40GB-PCIe" is the PCIe board, "H200 NVL" the NVL one; "H100-SXM5-80GB" or "H200-SXM5" name
    no such form factor and get the model's first (SXM) board. Boards of one model share profile names,
    not necessarily every fact (H100 PCIe has fewer SMs), so picking the right one matters.
    """
    boards = [k for k in model.skus if k in SKUS]
    folded = normalize_model_name(alias)
    for marker in ("pcie", "nvl"):
        if marker in folded:
            match = [k for k in boards if marker in k.casefold()]
            if match:
                return match[0]
    return boards[0] if boards else None


def resolve_sku(model: str) -> str:
    """The SKU key for a SKU key, an exact NVML name (with or without "NVIDIA ") or any model alias
    the allowlist accepts ("A100-40GB-PCIe", "H100-SXM5-80GB", "H200-SXM5", "H100 on GH200", ...)."""
    wanted = normalize_model_name(model)
    for key, sku in SKUS.items():
        if wanted in (key.casefold(), normalize_model_name(sku.product_name)):
            return key
    known = resolve_model(model)
    board = _sku_of_model(known, model) if known is not None else None
    if board is not None:
        return board
    choices = "; ".join(f"{key} ({sku.product_name})" for key, sku in SKUS.items())
    aliases = ", ".join(a for m in KNOWN_MODELS for a in m.aliases)
    raise UnknownModelError(
        f"unknown GPU model {model!r}; use a SKU key or its exact NVML name: {choices}; "
        f"or an allowlist alias: {aliases}"
    )


def simulated_catalog(
    model: str, allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
) -> GpuCatalog:
    """Discover one simulated GPU of `model` (anything `resolve_sku` accepts) through the NVML port."""
    return _discover_sku(resolve_sku(model), allowlist)


# The simulated tables are immutable and the catalog is a frozen value, so one discovery per
# (SKU, allowlist) is enough; each costs ~100 locked state-file round trips.
@functools.lru_cache(maxsize=64)
def _discover_sku(key: str, allowlist: MigProfileAllowlist) -> GpuCatalog:
    with tempfile.TemporaryDirectory(prefix="flexmig-catalog-") as tmp:
        path = Path(tmp) / "sim-state.json"
        # MIG on from the start: Ampere answers profile queries only with MIG enabled.
        init_sim_state(path, [SimGpuSpec(sku=key, mig_enabled=True)])
        with open_sim(path) as nvml:
            return discover(nvml, 0, allowlist)
