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
    taints = _taints(inventory)
    if taints:
        # Say which taints, so the user can tolerate one (or see that a maintenance rule is at work).
        shown = ", ".join(taints[:3]) + (f" and {len(taints) - 3} more" if len(taints) > 3 else "")
        msg += (
            f" and tolerations (published devices are tainted: {shown}; a request tolerating a taint "
            "may use its devices: spec.devices.requests[].exactly.tolerations)"
        )
    largest = largest_mig_device(inventory)
    if largest:
        msg += f"; {largest}"
    if errors:
        msg += "; " + "; ".join(errors)
    return msg


_TAINTS: weakref.WeakKeyDictionary[Inventory, list[str]] = weakref.WeakKeyDictionary()


def _taints(inventory: Inventory) -> list[str]:
    """The distinct NoSchedule/NoExecute taints of the published devices, "key=value:Effect"."""
    hit = _TAINTS.get(inventory)
    if hit is None:
        found = {
            f"{t.get('key')}{'=' + str(t['value']) if t.get('value') else ''}:{t.get('effect')}"
            for pool in inventory.pools.values()
            for d in pool.devices.values()
            for t in d.raw.get("taints") or ()
            if t.get("effect") in ("NoSchedule", "NoExecute")
        }
        hit = _TAINTS[inventory] = sorted(found)
    return hit
