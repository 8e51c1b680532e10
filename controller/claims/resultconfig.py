"""status.allocation.devices.config of one claim, and capacity on dedicated devices, as upstream.

Config: the class configs of each chosen alternative (FromClass), then the claim's own (FromClaim). A
claim config naming requests goes in only when it applies to what was chosen: `<request>` applies to
every subrequest of it, `<request>/<sub>` only to that subrequest; a config of a firstAvailable
alternative that was not chosen is not the user's intent for the devices that run.

Capacity: `capacity.requests` where no shared device matches is a filter on dedicated (MIG, whole)
devices, as upstream treats devices without allowMultipleAllocations: the device's capacity must be at
least the request, and nothing is consumed (the result carries no consumedCapacity).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from api.constants import DRIVER_NAME
from controller.claims.candidates import CandidateIndex
from controller.claims.requests import Alternative


def dedicated(index: CandidateIndex, alt: Alternative) -> Alternative:
    """`alt` with its capacity requests turned into selectors when no shared device matches it."""
    if not alt.capacity_requested or alt.share is None or index.shared_candidates(alt.selectors):
        return alt
    filters = tuple(
        f'device.capacity["{DRIVER_NAME}"].{name}.compareTo(quantity("{_quantity(value)}")) >= 0'
        for name, value in sorted(alt.share.requests.items())
    )
    return replace(alt, selectors=alt.selectors + filters, share=None, capacity_requested=False)


def _quantity(value: Fraction) -> str:
    """A quantity string CEL's quantity() reads: whole units, else milli-units (rounded up)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{math.ceil(value * 1000)}m"


def allocation_config(
    claim: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    chosen: Mapping[str, Alternative],
) -> list[dict[str, Any]]:
    """status.allocation.devices.config: class configs (FromClass) then the claim's (FromClaim)."""
    out: list[dict[str, Any]] = []
    for request, alt in chosen.items():
        spec = (classes.get(alt.class_name) or {}).get("spec") or {}
        for cfg in spec.get("config") or ():
            if cfg.get("opaque"):
                out.append({"source": "FromClass", "requests": [request], "opaque": cfg["opaque"]})
    # A claim config naming requests goes in only when it applies to what was chosen: "<request>"
    # applies to every subrequest of it, "<request>/<sub>" only to that subrequest (upstream).
    names = {n for request, alt in chosen.items() for n in (request, alt.request_name)}
    for cfg in ((claim.get("spec") or {}).get("devices") or {}).get("config") or ():
        if not cfg.get("opaque"):
            continue
        if cfg.get("requests") and not names.intersection(cfg["requests"]):
            continue
        entry: dict[str, Any] = {"source": "FromClaim", "opaque": cfg["opaque"]}
        if cfg.get("requests"):
            entry["requests"] = list(cfg["requests"])
        out.append(entry)
    return out
