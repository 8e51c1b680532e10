"""`flexmig simulate`: a simulated cluster, a stream of pods, flexmig's policy against references.

References: first fit (what kube-scheduler gives NVIDIA's driver), HAMi v2.10's heuristic
(driver/policy/hami.py), HAMi's placement after its pull request 2855 (driver/policy/hami_scored.py)
and the repacking bound (driver/policy/bound.py; flexmig/simulation/bound_run.py).
Progress goes to stderr; stdout carries the summary and tables, or the `--json` document only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from driver.catalog.simulated import UnknownModelError, resolve_sku
from driver.policy.allocator import FirstFitPolicy, PackingPolicy, Policy
from driver.policy.hami import HamiPolicy
from driver.policy.hami_scored import HamiScoredPolicy
from flexmig.cliargs import UsageError, int_in
from flexmig.simulation import (
    bound_run,
    export,
    html_report,
    report,
    room_report,
    room_run,
    runner,
    workload,
)

_POLICIES: dict[
    str, type[PackingPolicy] | type[FirstFitPolicy] | type[HamiPolicy] | type[HamiScoredPolicy]
] = {
    "flexmig": PackingPolicy,
    "first-fit": FirstFitPolicy,
    "hami": HamiPolicy,
    "hami-2855": HamiScoredPolicy,
}
_CHOICES = [*_POLICIES, bound_run.BOUND_NAME]
DEFAULT_MODELS = "A100-40GB,H100-80GB,A100-80GB,H200-141GB"
# Upper bounds keep a typo (an extra zero or three) from becoming an hours-long run.
MAX_NODES = 1000
MAX_GPUS_PER_NODE = 16
MAX_PODS = 1_000_000
MAX_SHARES = 8  # values per share list: each is a run of its own


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a pod stream on a simulated cluster and compare allocation policies",
        description=(
            "Builds simulated nodes (NVML simulator), sends a deterministic stream of pods asking for "
            "MIG memory, places them with each policy, creates and destroys every GPU/compute instance "
            "through NVML, and prints a plain summary, acceptance against the repacking bound, "
            "fragmentation and decision latency."
        ),
    )
    parser.add_argument(
        "--nodes", type=int_in(1, MAX_NODES), default=6, help=f"simulated nodes, 1..{MAX_NODES} (default 6)"
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int_in(1, MAX_GPUS_PER_NODE),
        default=2,
        help=f"GPUs per node, 1..{MAX_GPUS_PER_NODE} (default 2)",
    )
    parser.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=(
            "comma-separated GPU models, assigned to nodes round-robin: SKU key, NVML name or model "
            f"alias, any case, as `flexmig profiles` takes them (default {DEFAULT_MODELS})"
        ),
    )
    parser.add_argument(
        "--pods",
        type=int_in(1, MAX_PODS),
        default=500,
        help=f"pods in the stream, 1..{MAX_PODS} (default 500)",
    )
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument(
        "--policy",
        default=",".join(_CHOICES),
        help=f"comma-separated policies to compare: {', '.join(_CHOICES)} (default all)",
    )
    parser.add_argument(
        "--movable-share",
        default="",
        metavar="SHARES",
        help=(
            "comma-separated shares of movable pods, each 0..1 (e.g. 0,0.25,0.5,1): per share, flexmig "
            "moving movable pods to make room (docs/moves.md), beside the ceiling of that share "
            f"(default: none; at most {MAX_SHARES})"
        ),
    )
    parser.add_argument(
        "--priority-mix",
        default="",
        metavar="SHARES",
        help=(
            "comma-separated shares of high-priority pods, each above 0 and below 1 (e.g. 0.1,0.25): per "
            "share (and per --movable-share), flexmig with priority preemption off and on "
            f"(docs/preemption.md; default: none; at most {MAX_SHARES})"
        ),
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print only a JSON document ({export.SCHEMA}, keys in flexmig/simulation/export.py)",
    )
    parser.add_argument(
        "--report",
        metavar="DIR",
        type=Path,
        help="also write DIR/index.html (plots, self-contained) and DIR/simulate.json",
    )
    parser.set_defaults(func=run)


def _parse_list(value: str, field: str, allowed: list[str]) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--{field}: empty; allowed values: {', '.join(allowed)}")
    for item in items:
        if item not in allowed:
            raise UsageError(f"--{field}: unknown value {item!r}; allowed values: {', '.join(allowed)}")
    return items


def parse_shares(value: str, flag: str, *, open_ends: bool) -> list[float]:
    """`--movable-share` (0..1) or `--priority-mix` (above 0, below 1): distinct numbers, at most
    `MAX_SHARES`; "" is no share at all."""
    allowed = "numbers above 0 and below 1" if open_ends else "numbers from 0 to 1"
    items = [v.strip() for v in value.split(",") if v.strip()]
    if len(items) > MAX_SHARES:
        raise UsageError(f"--{flag}: {len(items)} values; at most {MAX_SHARES}, each one of {allowed}")
    shares: list[float] = []
    for item in items:
        try:
            share = float(item)
        except ValueError:
            raise UsageError(f"--{flag}: {item!r} is not a number; allowed: {allowed}") from None
        inside = 0 < share < 1 if open_ends else 0 <= share <= 1
        if not inside:  # NaN fails both comparisons
            raise UsageError(f"--{flag}: {item!r} is out of range; allowed: {allowed}")
        if share in shares:
            raise UsageError(f"--{flag}: {item!r} is given twice")
        shares.append(share)
    return shares


def _parse_models(value: str) -> list[str]:
    """SKU keys for `--models`, through the one resolver every command and the allowlist use
    (driver/catalog/simulated.py `resolve_sku`): "B200", "NVIDIA H200", "h200-sxm5" all work."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise UsageError(
            "--models: empty; give GPU models, e.g. A100-40GB,H200 (see `flexmig profiles --help`)"
        )
    try:
        return [resolve_sku(item) for item in items]
    except UnknownModelError as exc:
        raise UsageError(f"--models: {exc}") from None


def check_report_dir(path: Path) -> None:
    """UsageError unless `path` is (or can be made) a writable directory: checked before the run, so a
    long run does not end in "cannot write". Creates nothing."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(
                f"--report: {path} is not a directory; allowed: a directory, or a path to create one"
            )
        target = path
    else:
        target = path.parent
        while not target.exists() and target != target.parent:
            target = target.parent
        if not target.is_dir():
            raise UsageError(f"--report: cannot create {path}: {target} is not a directory")
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"--report: cannot write to {path}: {target} is not writable")


def _silence_highs_banner() -> None:
    """Build the process's first HiGHS instance with stdout and stderr on /dev/null: HiGHS prints its
    banner from C when the first one is built (driver/policy/highs.py sends it to stderr), and --quiet
    and --json promise a silent stderr. Done before the run, while no other thread writes."""
    from flexmig.simulation import fit_highs

    if not fit_highs.available():
        return
    from driver.policy.highs import quiet_highs

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        quiet_highs()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def run(args: argparse.Namespace) -> int:
    models = _parse_models(args.models)
    policy_names = _parse_list(args.policy, "policy", _CHOICES)
    movable_shares = parse_shares(args.movable_share, "movable-share", open_ends=False)
    high_shares = parse_shares(args.priority_mix, "priority-mix", open_ends=True)
    if args.report is not None:
        check_report_dir(args.report)
    pods = workload.generate(args.pods, args.seed)
    if args.quiet or args.json:
        _silence_highs_banner()
    nodes = [
        runner.NodeSpec(f"node-{i}", (models[i % len(models)],) * args.gpus_per_node)
        for i in range(args.nodes)
    ]
    progress = None if args.quiet else runner.stderr_progress
    results: list[runner.RunResult] = []
    # The bound runs last so that its row closes the table.
    for name in sorted(policy_names, key=lambda n: n == bound_run.BOUND_NAME):
        if name == bound_run.BOUND_NAME:
            results.append(bound_run.run_bound(nodes, pods, progress=progress))
        else:
            policy: Policy = _POLICIES[name]()
            results.append(runner.run(policy, nodes, pods, progress=progress))
    rooms = room_run.run_rows(nodes, pods, args.seed, movable_shares, high_shares, progress)
    memory_slices = runner.memory_slices(nodes)
    making_room = room_report.document(rooms) if rooms else None
    document = export.document(nodes, args.seed, memory_slices, results, making_room)
    text = report.summary(nodes, len(pods), args.seed, results)
    if args.report is not None:
        try:
            page_text = f"{text}\n\n{room_report.render(rooms)}" if rooms else text
            written = html_report.write(args.report, document, page_text)
        except OSError as exc:
            raise UsageError(f"--report: cannot write to {args.report}: {exc}") from None
        if progress is not None:
            progress(f"report: {', '.join(str(p) for p in written)}")
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(text)
    print()
    print(report.render(results))
    print()
    print("Refused per request size (share of the pods of that size):")
    print(report.render_sizes(results))
    print()
    if rooms:
        print(room_report.render(rooms))
        print()
    print(
        "Every placement was created and destroyed through NVML (simulator); the bound is not a policy:\n"
        "it may move running slices at each arrival, so no real rule can accept much more."
    )
    return 0
