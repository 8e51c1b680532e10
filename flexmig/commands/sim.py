"""`flexmig sim`: create and inspect simulator state files (the fake GPUs a node agent can run on)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from driver.catalog.simulated import UnknownModelError, resolve_sku
from driver.nvml.sim import SKUS, SimAdmin, SimGpuSpec, init_sim_state


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sim", help="create or show an NVML simulator state file")
    sub = parser.add_subparsers(dest="sim_command", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="write a new state file with the given GPUs")
    init.add_argument("--state", required=True, type=Path, help="state file to create")
    init.add_argument(
        "--gpus",
        required=True,
        help="comma-separated SKU[:COUNT] list, e.g. A100-40GB:2,H100-80GB (SKUs: " + ", ".join(SKUS) + ")",
    )
    init.add_argument("--mig-off", action="store_true", help="start with MIG mode disabled on every GPU")
    init.add_argument("--seed", default=None, help="seed for GPU UUIDs (default: the file name)")
    init.add_argument("--force", action="store_true", help="overwrite an existing state file")
    init.set_defaults(func=run_init)
    show = sub.add_parser("show", help="print the GPUs, MIG mode and instances of a state file")
    show.add_argument("--state", required=True, type=Path)
    show.set_defaults(func=run_show)


def parse_gpu_list(value: str) -> list[str]:
    skus: list[str] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        # The count follows the last colon: NVML names have none, but may contain spaces.
        name, _, count_text = item.rpartition(":") if ":" in item else (item, "", "")
        try:
            sku = resolve_sku(name.strip())
        except UnknownModelError as exc:
            raise ValueError(f"--gpus: {exc}") from None
        try:
            count = int(count_text) if count_text else 1
        except ValueError:
            raise ValueError(f"--gpus: count for {sku} must be an integer, got {count_text!r}") from None
        if not 1 <= count <= 16:
            raise ValueError(f"--gpus: count for {sku} must be 1..16, got {count}")
        skus += [sku] * count
    if not skus:
        raise ValueError("--gpus: no GPU given; use SKU[:COUNT],...")
    return skus


def run_init(args: argparse.Namespace) -> int:
    try:
        skus = parse_gpu_list(args.gpus)
        init_sim_state(
            args.state,
            [SimGpuSpec(sku=s, mig_enabled=not args.mig_off) for s in skus],
            overwrite=args.force,
            seed=args.seed or args.state.name,
        )
    except (ValueError, FileExistsError) as exc:
        print(f"flexmig sim init: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.state}: {len(skus)} GPU(s)")
    return 0


def run_show(args: argparse.Namespace) -> int:
    if not args.state.exists():
        print(f"flexmig sim show: --state: {args.state} does not exist", file=sys.stderr)
        return 2
    snap = SimAdmin(args.state).snapshot()
    for gpu in snap.gpus:
        mode = "on" if gpu.mig_current else "off"
        pending = (
            "" if gpu.mig_pending == gpu.mig_current else f" (pending {'on' if gpu.mig_pending else 'off'})"
        )
        print(f"GPU {gpu.index}: {gpu.sku} {gpu.uuid} MIG {mode}{pending}")
        for gi in gpu.gpu_instances:
            cis = ", ".join(f"CI {ci.ci_id} {ci.mig_uuid}" for ci in gi.compute_instances) or "no CI"
            print(f"  GI {gi.gi_id}: {gi.profile_name} @{gi.start}:{gi.size}  [{cis}]")
        for pid, gi_id, ci_id in gpu.processes:
            print(f"  process {pid} on GI {gi_id} CI {ci_id}")
    return 0
