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
from driver.catalog.models import normalize_model_name
from driver.catalog.types import GpuCatalog
from driver.nvml.sim import SKUS, SimGpuSpec, init_sim_state, open_sim


class UnknownModelError(ValueError):
    """The model string names no simulated SKU; the message lists the accepted values."""


def sku_keys() -> tuple[str, ...]:
    return tuple(SKUS)


def resolve_sku(model: str) -> str:
    """The SKU key for a SKU key (any case) or an exact NVML name (with or without "NVIDIA ")."""
    wanted = normalize_model_name(model)
    for key, sku in SKUS.items():
        if wanted in (key.casefold(), normalize_model_name(sku.product_name)):
            return key
    choices = "; ".join(f"{key} ({sku.product_name})" for key, sku in SKUS.items())
    raise UnknownModelError(f"unknown GPU model {model!r}; use a SKU key or its exact NVML name: {choices}")


def simulated_catalog(
    model: str, allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
) -> GpuCatalog:
    """Discover one simulated GPU of `model` (SKU key or NVML name) through the NVML port."""
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
