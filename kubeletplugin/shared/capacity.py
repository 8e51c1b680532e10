"""What one allocation of a `gpu-<i>-shared` device holds: its share of memory and cores. Pure.

The allocator writes each share as a result with a `shareID` and `consumedCapacity` (contract C2,
docs/architecture.md):

    {"device": "gpu-0-shared", "shareID": "<uuid>",
     "consumedCapacity": {"memory": "8000Mi", "cores": "30", "shares": "1"}}

Quantities are Kubernetes quantities ("8000Mi", "8Gi", "8388608000", "30"). A capacity the result does
not name takes the published request policy's default (contract C1): the whole GPU's memory, 0 cores
(no SM limit) and one share. Anything else is refused with an error that names the device, the field
and what is allowed, because a limit the node cannot read must not silently become "no limit".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from api import devicecontract as dc
from api.constants import DRIVER_NAME

MEBI = 2**20
MAX_CORES = 100

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY_RE = re.compile(
    r"(?P<num>\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))"
)
_KNOWN = dc.SHARED_CAPACITY_NAMES


class ConsumedCapacityError(ValueError):
    """A shared device's consumedCapacity cannot be turned into HAMi-core limits."""


@dataclass(frozen=True, slots=True)
class SharedShare:
    """One allocation (share) of a shared GPU, as prepared."""

    share_id: str | None  # None only when an allocator did not set one
    memory_mib: int  # what the container may allocate on the GPU
    cores: int  # percent of the SMs; 0 = no SM limit
    shares: int = 1


def parse_quantity(text: str) -> Fraction:
    """The exact value of a non-negative Kubernetes quantity; ValueError for anything else."""
    m = _QUANTITY_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. '8000Mi', '8Gi', '30')")
    value = Fraction(m["num"])
    if m["bin"]:
        return value * _BINARY[m["bin"]]
    exponent = int(m["exp"]) if m["exp"] is not None else _DECIMAL[m["dec"] or ""]
    return value * Fraction(10) ** exponent


def _field_values(where: str, consumed: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, raw in consumed.items():
        # Capacity names are published unqualified; a qualified name can only mean our domain.
        name = key.removeprefix(f"{DRIVER_NAME}/")
        if name not in _KNOWN:
            raise ConsumedCapacityError(
                f"{where}: consumedCapacity has unknown key {key!r}; allowed: {', '.join(_KNOWN)}"
            )
        if name in values:
            raise ConsumedCapacityError(f"{where}: consumedCapacity names {name!r} twice")
        values[name] = str(raw)
    return values


def _whole(where: str, name: str, raw: str, unit: int, unit_name: str) -> int:
    try:
        value = parse_quantity(raw) / unit
    except ValueError as exc:
        raise ConsumedCapacityError(f"{where}: consumedCapacity.{name}: {exc}") from None
    if value.denominator != 1:
        raise ConsumedCapacityError(
            f"{where}: consumedCapacity.{name} {raw!r} is not a whole number of {unit_name}"
        )
    return int(value)


def share_from_result(
    device: str, share_id: str | None, consumed: Mapping[str, str] | None, gpu_memory_mib: int
) -> SharedShare:
    """The share one allocation result holds on a GPU with `gpu_memory_mib` of memory."""
    where = f"device {device}" + (f" share {share_id}" if share_id else "")
    values = _field_values(where, consumed or {})
    memory = gpu_memory_mib
    if dc.CAP_MEMORY in values:
        memory = _whole(where, dc.CAP_MEMORY, values[dc.CAP_MEMORY], MEBI, "MiB")
        if not 1 <= memory <= gpu_memory_mib:
            raise ConsumedCapacityError(
                f"{where}: consumedCapacity.memory {values[dc.CAP_MEMORY]!r} is outside 1Mi..{gpu_memory_mib}Mi"
                " (the GPU's memory)"
            )
    cores = 0
    if dc.CAP_CORES in values:
        cores = _whole(where, dc.CAP_CORES, values[dc.CAP_CORES], 1, "cores")
        if not 0 <= cores <= MAX_CORES:
            raise ConsumedCapacityError(
                f"{where}: consumedCapacity.cores {values[dc.CAP_CORES]!r} is outside 0..{MAX_CORES}"
            )
    shares = 1
    if dc.CAP_SHARES in values:
        shares = _whole(where, dc.CAP_SHARES, values[dc.CAP_SHARES], 1, "shares")
        if shares < 1:
            raise ConsumedCapacityError(
                f"{where}: consumedCapacity.shares {values[dc.CAP_SHARES]!r} must be >= 1"
            )
    return SharedShare(share_id=share_id, memory_mib=memory, cores=cores, shares=shares)


def shares_to_json(shares: Sequence[SharedShare]) -> list[dict[str, Any]]:
    """The checkpoint form of a device's shares."""
    return [
        {"shareID": s.share_id, "memoryMiB": s.memory_mib, "cores": s.cores, "shares": s.shares}
        for s in shares
    ]


def shares_from_json(raw: Any) -> tuple[SharedShare, ...]:
    """Inverse of `shares_to_json`; None is no shares. ValueError names the bad entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("field 'shares' must be a list")
    out = []
    for i, item in enumerate(raw):
        ints = ("memoryMiB", "cores", "shares")
        if (
            not isinstance(item, dict)
            or not (item.get("shareID") is None or isinstance(item.get("shareID"), str))
            or not all(isinstance(item.get(k), int) and not isinstance(item.get(k), bool) for k in ints)
        ):
            raise ValueError(f"shares[{i}] must be {{shareID: string|null, memoryMiB, cores, shares: int}}")
        out.append(SharedShare(item.get("shareID"), item["memoryMiB"], item["cores"], item["shares"]))
    return tuple(out)
