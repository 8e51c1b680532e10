"""Packing benchmarks, one command: `python -m benchmarks.packing [--quick] [--out FILE]`.

Online (per scenario and load): first fit, HAMi v2.10's heuristic, HAMi after its pull request 2855
(`hami-2855`), flexmig, and the repacking bound, all on the same seeded pod streams (`--policies`
narrows the policies). Offline: GPUs used per order against the exact optimum (HiGHS).
Scale: decision latency and peak RSS at 1,000 and 5,000 nodes x 8 GPUs, one- and two-device pods.
With `--hints exact,noisy` also flexmig with lifetime hints against none (hints.py); with
`--priority-mix 0.1,0.25` flexmig with priority preemption off and on (priority.py); with
`--movable-shares 0,0.25,0.5,1` flexmig moving movable pods to make room (moves.py), beside the
ceiling of each share (ceiling.py). Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from driver.policy.allocator import HINT_WEIGHT, FirstFitPolicy, PackingPolicy, Policy
from driver.policy.hami import HamiPolicy
from driver.policy.hami_scored import HamiScoredPolicy
from flexmig.cliargs import UsageError
from flexmig.commands.simulate import parse_shares

from . import hints, moves, offline, online, priority

LOADS = (0.7, 0.9, 1.1)


POLICIES = ("first-fit", "hami", "hami-2855", "flexmig")


def _policies(names: Sequence[str] = POLICIES) -> list[Policy]:
    """Fresh instances (HamiScoredPolicy keeps its last search), in POLICIES order."""
    every: list[Policy] = [FirstFitPolicy(), HamiPolicy(), HamiScoredPolicy(), PackingPolicy()]
    return [p for p in every if p.name in names]


def online_tables(
    seeds: int,
    pods: int,
    scenarios: Sequence[online.Scenario],
    loads: Sequence[float],
    policies: Sequence[str] = POLICIES,
) -> str:
    lines = [
        "| scenario | load | policy | pod acceptance % | MiB-weighted acceptance % | refused % per request size (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for load in loads:
            totals: dict[str, online.Outcome] = {}
            for seed in range(seeds):
                stream = online.generate(scenario, load, pods, seed)
                outcomes = [online.run_policy(p, scenario, stream) for p in _policies(policies)]
                outcomes.append(online.run_bound(scenario, stream))
                for o in outcomes:
                    totals.setdefault(o.policy, online.Outcome(o.policy)).add(o)
            for name, o in totals.items():
                sizes = sorted(o.asked_by_size)
                refused = ", ".join(
                    f"{s}: {100 * o.refused_by_size[s] / o.asked_by_size[s]:.0f}" for s in sizes
                )
                lines.append(
                    f"| {scenario.name} | {100 * load:.0f} % | {name} | {100 * o.acceptance:.1f} | "
                    f"{100 * o.weighted:.1f} | {refused} |"
                )
            print(f"  online: {scenario.name} at {100 * load:.0f} % done", file=sys.stderr, flush=True)
    return "\n".join(lines)


def offline_table(seeds: int, count: int, policies: Sequence[str] = POLICIES) -> str:
    lines = [
        "| GPU | policy | " + " | ".join(f"{o} order" for o in offline.ORDERS) + " |",
        "|---|---|---|---|---|",
    ]
    for label, key in offline.CASES:
        catalog = offline.catalog_for(key)
        ratios: dict[tuple[str, str], list[float]] = {}
        for seed in range(seeds):
            sizes = offline.requests_for(catalog, count, seed)
            best = offline.optimum(catalog, sizes)
            for order in offline.ORDERS:
                seq = offline.ordered(sizes, order, seed)
                for policy in _policies(policies):
                    used = offline.gpus_used(policy, catalog, seq, together=False)
                    if used is not None:
                        ratios.setdefault((policy.name, order), []).append(used / best)
                used = offline.gpus_used(PackingPolicy(), catalog, seq, together=True)
                if used is not None:
                    ratios.setdefault(("flexmig, burst decided together", order), []).append(used / best)
        for name in (*(p for p in POLICIES if p in policies), "flexmig, burst decided together"):
            cells = [f"{statistics.mean(ratios[(name, o)]):.3f}x" for o in offline.ORDERS]
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
        print(f"  offline: {label} done", file=sys.stderr, flush=True)
    return "\n".join(lines)


def scale_table(sizes: Sequence[int], decisions: int, devices: Sequence[int] = (1,)) -> str:
    """One row per (size, devices per pod), each measured in its own process (scale.py)."""
    lines = [
        "| nodes x 8 GPUs | devices per pod | decisions | p50 ms | p99 ms | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for nodes in sizes:
        for count in devices:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.packing.scale", str(nodes), str(decisions), str(count)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            lines.append(
                f"| {nodes} | {count} | {decisions} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['rss_mb']:.0f} |"
            )
            print(f"  scale: {nodes} nodes, {count}-device pods done", file=sys.stderr, flush=True)
    return "\n".join(lines)


def _positive_ints(parser: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1, or a usage error naming `flag`."""
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        parser.error(f"{flag}: need comma-separated whole numbers >= 1, got {value!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for tests): 1 seed, few pods")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=800, help="pods per online stream")
    parser.add_argument("--offline-requests", type=int, default=40)
    parser.add_argument("--scale-nodes", default="1000,5000")
    parser.add_argument("--scale-decisions", type=int, default=300)
    parser.add_argument(
        "--scale-devices",
        default="1,2",
        help="devices per pod in the scale runs, comma-separated (default 1,2)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated policies for the online and offline tables (default {','.join(POLICIES)})",
    )
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: online,offline,scale")
    parser.add_argument(
        "--hints",
        default="none",
        help="lifetime hint modes for a flexmig-only table, comma-separated: none,exact,noisy "
        "(default none: no such table)",
    )
    parser.add_argument(
        "--hint-weights",
        default=f"{HINT_WEIGHT:g}",
        help="comma-separated PackingPolicy hint weights for --hints (default: the policy's)",
    )
    parser.add_argument(
        "--priority-mix",
        default="",
        help="comma-separated shares of high-priority pods (e.g. 0.1,0.25) for a table of flexmig with "
        "priority preemption off and on (priority.py; default: no such table)",
    )
    parser.add_argument(
        "--movable-shares",
        default="",
        help="comma-separated shares of movable pods (e.g. 0,0.25,0.5,1) for a table of flexmig moving "
        "them to make room (moves.py; default: no such table)",
    )
    parser.add_argument(
        "--moves-best-case",
        action="store_true",
        help="with --movable-shares: moved pods lose no work and the remaining-time and window rules are "
        "off (moves.py BEST_CASE: the most one-move plans can do)",
    )
    parser.add_argument("--out", help="also write the Markdown here")
    args = parser.parse_args(argv)
    try:  # the same rules as `flexmig simulate`'s share lists
        high_shares = parse_shares(args.priority_mix, "priority-mix", open_ends=True)
        movable_shares = parse_shares(args.movable_shares, "movable-shares", open_ends=False)
    except UsageError as exc:
        parser.error(str(exc))
    if args.moves_best_case and not movable_shares:
        parser.error("--moves-best-case: needs --movable-shares (the table it changes)")
    modes = [m for m in args.hints.split(",") if m]
    if set(modes) - set(hints.MODES):
        parser.error(
            f"--hints: unknown mode(s) {sorted(set(modes) - set(hints.MODES))}; allowed: none, exact, noisy"
        )
    try:
        hint_weights = [float(w) for w in args.hint_weights.split(",") if w]
    except ValueError:
        parser.error(f"--hint-weights: not numbers: {args.hint_weights!r}")
    if not hint_weights or any(not w >= 0 for w in hint_weights):
        parser.error(f"--hint-weights: need one or more weights >= 0, got {args.hint_weights!r}")
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - {"online", "offline", "scale"}
    if unknown:
        parser.error(f"--skip: unknown part(s) {sorted(unknown)}; allowed values: online, offline, scale")
    chosen = [p for p in args.policies.split(",") if p]
    if not chosen or set(chosen) - set(POLICIES):
        parser.error(f"--policies: need one or more of {', '.join(POLICIES)}, got {args.policies!r}")
    devices = _positive_ints(parser, "--scale-devices", args.scale_devices)
    sizes = _positive_ints(parser, "--scale-nodes", args.scale_nodes)
    scenarios: Sequence[online.Scenario] = online.SCENARIOS
    loads: Sequence[float] = LOADS
    if args.quick:
        args.seeds, args.pods, args.offline_requests = 1, 60, 12
        sizes, args.scale_decisions = [20], 20
        scenarios, loads = (online.SCENARIOS[0], online.SCENARIOS[-1]), (0.9,)
    began = time.monotonic()
    parts = [
        f"Command: `python -m benchmarks.packing {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip()
    ]
    if "online" not in skip:
        parts.append(
            f"### Online ({args.seeds} seeds x {args.pods} pods, first 20 % skipped)\n\n"
            + online_tables(args.seeds, args.pods, scenarios, loads, chosen)
        )
    if any(m != "none" for m in modes):
        parts.append(
            f"### Lifetime hints, flexmig ({args.seeds} seeds x {args.pods} pods, first 20 % skipped; "
            f"noisy = lifetime x lognormal(0, {hints.NOISE_SIGMA}))\n\n"
            + hints.hint_table(args.seeds, args.pods, scenarios, loads, modes, hint_weights)
        )
    if high_shares:
        parts.append(
            f"### Priority mix, flexmig ({args.seeds} seeds x {args.pods} pods, first 20 % skipped; a pod "
            f"that does not fit waits up to {priority.PATIENCE:g} (mean lifetime {online.MEAN_LIFETIME:g}); "
            "evicted pods restart from the beginning; with --movable-shares, per share too, moves tried "
            "after preemption)\n\n"
            + priority.priority_table(
                args.seeds, args.pods, scenarios, loads, high_shares, movable_shares or (0.0,)
            )
        )
    if movable_shares:
        rules = moves.BEST_CASE if args.moves_best_case else moves.RULES
        restart = (
            "moved pods go on where they stopped, no remaining-time or window rule"
            if args.moves_best_case
            else "moved pods restart"
        )
        parts.append(
            f"### Movable share, flexmig ({args.seeds} seeds x {args.pods} pods, first 20 % skipped; a "
            "pod that fits nowhere gets room by moving movable pods (one per plan), or is refused; "
            f"{restart}; the ceiling is the repacking bound in which only movable pods may move)\n\n"
            + moves.moves_table(args.seeds, args.pods, scenarios, loads, movable_shares, rules)
        )
    if "offline" not in skip:
        parts.append(
            f"### Offline: GPUs used / optimum ({args.seeds} seeds x {args.offline_requests} requests)\n\n"
            + offline_table(args.seeds, args.offline_requests, chosen)
        )
    if "scale" not in skip:
        parts.append(
            "### Scale (flexmig policy, one pod per decision, its devices random sizes on one node; "
            "cluster ~70 % full)\n\n" + scale_table(sizes, args.scale_decisions, devices)
        )
    parts.append(f"Wall time: {time.monotonic() - began:.0f} s")
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
