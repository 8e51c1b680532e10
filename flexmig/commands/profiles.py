"""`flexmig profiles MODEL`: the GPU-instance profile table of a model, like `nvidia-smi mig -lgip`.

Each row also shows the legal placements the way `nvidia-smi mig -lgipp` does ({0,2,4}:2 = starts 0, 2
and 4, two memory slices each), marks the profiles the default migProfileAllowlist allows, and says
whether every fact of the row is confirmed by a public capture (`docs/hardware.md`); the notes of the
unconfirmed rows follow the table. The table comes from discovery on a simulated GPU of the model, the
same code path a node runs. MODEL is anything the allowlist accepts as a model name.
"""

from __future__ import annotations

import argparse
import sys

from driver.catalog.builtin import row_confidence
from driver.catalog.models import KNOWN_MODELS
from driver.catalog.simulated import UnknownModelError, resolve_sku, simulated_catalog, sku_keys
from driver.catalog.types import GpuCatalog, MigProfile

_HEADERS = (
    "",
    "Name",
    "ID",
    "Instances",
    "Memory GiB",
    "SMs",
    "CE",
    "DEC",
    "ENC",
    "JPG",
    "OFA",
    "Confirmed",
    "Placements",
)
_RIGHT = {"ID", "Instances", "Memory GiB", "SMs", "CE", "DEC", "ENC", "JPG", "OFA"}
_ALIASES = ", ".join(a for m in KNOWN_MODELS for a in m.aliases)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profiles",
        help="print the MIG profile table of a GPU model",
        description=(
            "Print every GPU-instance profile of a GPU model (like nvidia-smi mig -lgip / -lgipp), "
            "marking with * the profiles the default migProfileAllowlist allows and saying which rows "
            "hold facts no public capture confirms."
        ),
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        help=(
            f"SKU key ({', '.join(sku_keys())}), exact NVML name, or an allowlist model alias ({_ALIASES})"
        ),
    )
    parser.set_defaults(func=run)


def format_placements(profile: MigProfile) -> str:
    """`-lgipp` notation: {starts}:size, one group per placement size."""
    sizes: dict[int, list[int]] = {}
    for p in profile.placements:
        sizes.setdefault(p.size, []).append(p.start)
    return " ".join("{" + ",".join(map(str, starts)) + f"}}:{size}" for size, starts in sizes.items())


def _row(profile: MigProfile, allowed: bool, confirmed: bool) -> tuple[str, ...]:
    return (
        "*" if allowed else "",
        profile.name,
        str(profile.gi_profile_id),
        str(profile.instance_count),
        f"{profile.memory_mib / 1024:.2f}",
        str(profile.multiprocessors),
        str(profile.copy_engines),
        str(profile.decoders),
        str(profile.encoders),
        str(profile.jpegs),
        str(profile.ofas),
        "yes" if confirmed else "no",
        format_placements(profile),
    )


def _unconfirmed_notes(sku_key: str | None, catalog: GpuCatalog) -> dict[int, str]:
    """profile id -> note, for every row with a fact no public capture confirms."""
    if sku_key is None:
        return {}
    notes: dict[int, str] = {}
    for p in catalog.all_profiles:
        confidence = row_confidence(sku_key, p.gi_profile_id)
        if confidence is not None and not confidence.confirmed:
            notes[p.gi_profile_id] = confidence.note
    return notes


def render(catalog: GpuCatalog, sku_key: str | None = None) -> str:
    """The table; `sku_key` (the simulated board it was read from) adds what is unconfirmed."""
    gpu = catalog.gpu
    allowed_ids = {p.gi_profile_id for p in catalog.profiles}
    unsure = _unconfirmed_notes(sku_key, catalog)
    # nvidia-smi lists profiles by descending profile id order of its own; largest last reads better
    # next to the layouts, so: smallest memory first, the catalog's order.
    rows = [
        _HEADERS,
        *(
            _row(p, p.gi_profile_id in allowed_ids, p.gi_profile_id not in unsure)
            for p in catalog.all_profiles
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADERS))]

    def line(row: tuple[str, ...]) -> str:
        cells = (
            cell.rjust(width) if header in _RIGHT else cell.ljust(width)
            for cell, width, header in zip(row, widths, _HEADERS, strict=True)
        )
        return "  ".join(cells).rstrip()

    out = [
        f"GPU instance profiles of {catalog.model} ({gpu.name}, {gpu.memory_total_mib} MiB; "
        f"{catalog.memory_slices} memory slices, {catalog.compute_slices} compute slices)",
        line(rows[0]),
        *(line(r) for r in rows[1:]),
        "* = allowed by the default migProfileAllowlist"
        if catalog.profiles
        else "no profile is allowed by the default migProfileAllowlist (whole GPU only)",
    ]
    if unsure:
        out.append("Confirmed = no: not every fact of the row is confirmed by a public capture:")
        by_note: dict[str, list[str]] = {}
        for p in catalog.all_profiles:
            if p.gi_profile_id in unsure:
                by_note.setdefault(unsure[p.gi_profile_id], []).append(p.name)
        out.extend(f"  {', '.join(names)}: {note}" for note, names in by_note.items())
    out.extend(f"warning: {w.message}" for w in catalog.warnings)
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        sku_key = resolve_sku(args.model)
        catalog = simulated_catalog(sku_key)
    except UnknownModelError as exc:
        print(f"flexmig profiles: {exc}", file=sys.stderr)
        return 2
    print(render(catalog, sku_key))
    return 0
