"""`flexmig simulate`: a simulated cluster, a stream of pods, flexmig's policy against first fit."""

from __future__ import annotations

import argparse

from driver.nvml.sim import SKUS
from driver.policy.allocator import FirstFitPolicy, PackingPolicy, Policy
from flexmig.simulation import report, runner, workload

_POLICIES: dict[str, type[PackingPolicy] | type[FirstFitPolicy]] = {
    "flexmig": PackingPolicy,
    "first-fit": FirstFitPolicy,
}
DEFAULT_MODELS = "A100-40GB,H100-80GB,A100-80GB,H200-141GB"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a pod stream on a simulated cluster and compare allocation policies",
        description=(
            "Builds simulated nodes (NVML simulator), sends a deterministic stream of pods asking for "
            "MIG memory, places them with each policy, creates and destroys every GPU/compute instance "
            "through NVML, and prints acceptance, fragmentation and decision latency."
        ),
    )
    parser.add_argument("--nodes", type=int, default=6, help="simulated nodes (default 6)")
    parser.add_argument("--gpus-per-node", type=int, default=2, help="GPUs per node (default 2)")
    parser.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=f"comma-separated GPU models, assigned to nodes round-robin (default {DEFAULT_MODELS})",
    )
    parser.add_argument("--pods", type=int, default=500, help="pods in the stream (default 500)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument(
        "--policy",
        default="flexmig,first-fit",
        help="comma-separated policies to compare: flexmig, first-fit (default both)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run)


def _parse_list(value: str, field: str, allowed: list[str]) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise ValueError(f"--{field}: empty; allowed values: {', '.join(allowed)}")
    for item in items:
        if item not in allowed:
            raise ValueError(f"--{field}: unknown value {item!r}; allowed values: {', '.join(allowed)}")
    return items


def run(args: argparse.Namespace) -> int:
    try:
        models = _parse_list(args.models, "models", list(SKUS))
        policy_names = _parse_list(args.policy, "policy", list(_POLICIES))
        for field, value in (("nodes", args.nodes), ("gpus-per-node", args.gpus_per_node)):
            if value < 1:
                raise ValueError(f"--{field}: must be >= 1, got {value}")
        pods = workload.generate(args.pods, args.seed)
    except ValueError as exc:
        print(f"flexmig simulate: {exc}")
        return 2
    nodes = [
        runner.NodeSpec(f"node-{i}", (models[i % len(models)],) * args.gpus_per_node)
        for i in range(args.nodes)
    ]
    progress = None if args.quiet else runner.stderr_progress
    policies: list[Policy] = [_POLICIES[name]() for name in policy_names]
    results = [runner.run(policy, nodes, pods, progress=progress) for policy in policies]
    layout = ", ".join(f"{n.name}: {len(n.skus)}x {n.skus[0]}" for n in nodes)
    print(f"cluster: {layout}")
    print(f"workload: {len(pods)} pods (seed {args.seed}), every placement created and destroyed via NVML\n")
    print(report.render(results))
    return 0
