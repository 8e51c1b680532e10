"""`python3 -m tests.soak --minutes N --seed S`: the soak on a real control plane (see tests/soak/runner.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.e2e.cluster import ControlPlane, build_binaries

from .faults import Fault
from .runner import Soak, SoakConfig


def parse(argv: list[str] | None = None) -> SoakConfig:
    p = argparse.ArgumentParser(
        prog="python3 -m tests.soak",
        description="Random churn of GPU pods on a real control plane with the chart's controller (2 replicas), "
        "webhook, plugins and kubelet stand-ins, a fault matrix, and invariants read from the API server and "
        "the simulated GPUs. The last line is 'cycles: N, violations: V'; the exit code is 1 if V > 0.",
    )
    p.add_argument("--minutes", type=float, default=10.0, help="how long the churn runs (default 10)")
    p.add_argument(
        "--seed", type=int, default=1, help="seed of the random churn and fault choices (default 1)"
    )
    p.add_argument("--faults", default="all",
                   help=f"comma-separated faults, 'all' or 'none' (allowed: {', '.join(Fault)})")  # fmt: skip
    p.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults (default 60)")
    p.add_argument(
        "--down", type=float, default=20.0, help="seconds the API server / webhook stay away (default 20)"
    )
    p.add_argument(
        "--max-live", type=int, default=20, help="at most this many soak pods at once (default 20)"
    )
    p.add_argument(
        "--settle", type=float, default=180.0, help="settle window after each fault, seconds (default 180)"
    )
    p.add_argument(
        "--findings", type=Path, default=None, help="append each violation with its evidence to this file"
    )
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error(f"--minutes: {args.minutes} must be > 0")
    if args.max_live < 1:
        p.error(f"--max-live: {args.max_live} must be >= 1")
    if args.faults == "all":
        faults = tuple(Fault)
    elif args.faults == "none":
        faults = ()
    else:
        names = [f.strip() for f in args.faults.split(",") if f.strip()]
        unknown = [n for n in names if n not in set(Fault)]
        if unknown:
            p.error(f"--faults: unknown {unknown}; allowed: {', '.join(Fault)}, all, none")
        faults = tuple(Fault(n) for n in names)
    return SoakConfig(
        minutes=args.minutes, seed=args.seed, faults=faults, fault_every_s=args.fault_every, down_s=args.down,
        max_live=args.max_live, settle_s=args.settle, findings=args.findings,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    cp = ControlPlane(build_binaries()).start()
    failed = True
    try:
        report = Soak(cfg).run(cp)
        failed = bool(report.violations)
    finally:
        cp.stop(failed=failed)
    print(report.last_line, flush=True)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
