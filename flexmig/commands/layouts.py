"""`flexmig layouts MODEL [--profiles P,...] [--count]`: every maximal full-GPU MIG layout of a model.

A layout is maximal when no instance of the chosen profiles fits any more. The profiles default to the
model's entry in the default migProfileAllowlist; `--profiles all` uses every profile the GPU offers.
Profiles and placements come from discovery on a simulated GPU of the model (the node's code path).
"""

from __future__ import annotations

import argparse
import sys

from driver.catalog.simulated import UnknownModelError, simulated_catalog, sku_keys
from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.layouts import Layout, enumerate_layouts


class _UsageError(ValueError):
    pass


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "layouts",
        help="list every maximal MIG layout of a GPU model",
        description=(
            "Enumerate every maximal full-GPU MIG layout (profile@start instances to which nothing more "
            "can be added) of a GPU model for a set of profiles."
        ),
    )
    parser.add_argument(
        "model", metavar="MODEL", help=f"SKU key or exact NVML name; one of: {', '.join(sku_keys())}"
    )
    parser.add_argument(
        "--profiles",
        default=None,
        metavar="P,...",
        help="comma-separated profile names, or 'all' for every profile (default: the model's allowlist defaults)",
    )
    parser.add_argument("--count", action="store_true", help="print only the number of layouts")
    parser.set_defaults(func=run)


def select_profiles(catalog: GpuCatalog, spec: str | None) -> tuple[MigProfile, ...]:
    if spec is None:
        return catalog.profiles
    if spec.strip().casefold() == "all":
        return catalog.all_profiles
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise _UsageError("--profiles is empty; give profile names separated by commas, or 'all'")
    offered = {p.name: p for p in catalog.all_profiles}
    unknown = [n for n in names if n not in offered]
    if unknown:
        raise _UsageError(
            f"{catalog.model} does not offer {', '.join(unknown)}; it offers: {', '.join(offered)} (or 'all')"
        )
    return tuple(offered[n] for n in dict.fromkeys(names))


def render(catalog: GpuCatalog, profiles: tuple[MigProfile, ...], layouts: list[Layout]) -> str:
    names = ", ".join(p.name for p in profiles) or "no profiles"
    head = (
        f"{catalog.model} ({catalog.gpu.name}): {len(layouts)} maximal layout(s) of {names} "
        f"on {catalog.memory_slices} memory slices and {catalog.compute_slices} compute slices"
    )
    width = max((len(str(layout)) for layout in layouts), default=0)
    digits = len(str(len(layouts)))
    lines = [head]
    for number, layout in enumerate(layouts, start=1):
        lines.append(
            f"{number:>{digits}}. {str(layout).ljust(width)}  "
            f"compute {layout.compute_slices_used}/{catalog.compute_slices}  "
            f"memory {layout.memory_slices_used}/{catalog.memory_slices}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        catalog = simulated_catalog(args.model)
        profiles = select_profiles(catalog, args.profiles)
    except (UnknownModelError, _UsageError) as exc:
        print(f"flexmig layouts: {exc}", file=sys.stderr)
        return 2
    layouts = enumerate_layouts(catalog.memory_slices, catalog.compute_slices, profiles)
    if args.count:
        print(len(layouts))
    else:
        print(render(catalog, profiles, layouts))
    return 0
