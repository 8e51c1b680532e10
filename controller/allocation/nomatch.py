"""What the cluster does publish, for the message of a request no published device matches.

"No device matches its selectors" alone leaves a user whose pod asks for more memory than any MIG
device has guessing; naming the largest MIG device published says what the allowed values are.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from controller.claims.requests import Alternative, ClaimRequest
from controller.state.inventory import Inventory

# One answer per inventory (a new one is built whenever slices change): a thousand pods refused
# against a thousand nodes cost one scan.
_CACHE: weakref.WeakKeyDictionary[Inventory, str] = weakref.WeakKeyDictionary()


def largest_mig_device(inventory: Inventory) -> str:
    """e.g. "the largest MIG device published holds 40448 MiB (7g.40gb)"; "" when none is published."""
    hit = _CACHE.get(inventory)
    if hit is None:
        hit = _CACHE[inventory] = _scan(inventory)
    return hit


def _scan(inventory: Inventory) -> str:
    best: tuple[int, str] | None = None
    for gpu in inventory.gpus.values():
        published = {profile for profile, _ in gpu.mig_devices}
        for profile in gpu.catalog.profiles:
            if profile.name in published and (best is None or (profile.memory_mib, profile.name) > best):
                best = (profile.memory_mib, profile.name)
    if best is None:
        return ""
    return f"the largest MIG device published holds {best[0]} MiB ({best[1]})"


def no_match_message(inventory: Inventory, req: ClaimRequest, alt: Alternative, errors: Sequence[str]) -> str:
    """Why no device matches `alt`: the largest MIG device published, and the selectors' CEL errors."""
    what = f"claim {req.claim} request {alt.result_name} (class {alt.class_name})"
    msg = f"{what}: no published MIG, whole-GPU or shared device matches its selectors"
    if _tainted(inventory):
        msg += " and tolerations (some published devices are tainted)"
    largest = largest_mig_device(inventory)
    if largest:
        msg += f"; {largest}"
    if errors:
        msg += "; " + "; ".join(errors)
    return msg


_TAINTED: weakref.WeakKeyDictionary[Inventory, bool] = weakref.WeakKeyDictionary()


def _tainted(inventory: Inventory) -> bool:
    hit = _TAINTED.get(inventory)
    if hit is None:
        hit = _TAINTED[inventory] = any(
            d.raw.get("taints") for pool in inventory.pools.values() for d in pool.devices.values()
        )
    return hit
