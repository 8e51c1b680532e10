"""What `flexmig simulate` prints: a summary in plain words, the comparison table, refusals per size."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from driver.policy.model import ShortReason
from flexmig.simulation.bound_run import BOUND_NAME
from flexmig.simulation.runner import NodeSpec, RunResult

# Why a pod was refused, for a reader who has never seen MIG.
REASON_TEXT: dict[str, str] = {
    ShortReason.NO_PROFILE_BIG_ENOUGH.value: "no GPU in the cluster has a slice that large",
    ShortReason.NO_FREE_PLACEMENT.value: "every GPU that could hold it was full",
    ShortReason.FRAGMENTED.value: (
        "enough memory was free on a GPU, but split into pieces no single slice could use (fragmented)"
    ),
    ShortReason.NO_SINGLE_NODE.value: "its two GPUs' worth fit in the cluster, but not on one node",
}


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def _bound(results: Sequence[RunResult]) -> RunResult | None:
    return next((r for r in results if r.policy == BOUND_NAME), None)


def summary(nodes: Sequence[NodeSpec], pods_asked: int, seed: int, results: Sequence[RunResult]) -> str:
    """A few paragraphs: the setup, what was asked, and per policy what fit and why the rest did not."""
    gpus = [sku for n in nodes for sku in n.skus]
    models = ", ".join(f"{gpus.count(m)}x {m}" for m in dict.fromkeys(gpus))
    first = results[0] if results else None
    lines = [
        f"Setup: {len(nodes)} simulated nodes with {len(gpus)} GPUs ({models}). MIG cuts a GPU into",
        "isolated slices; a pod asks for an amount of GPU memory and gets the smallest slice that has it.",
        "Slices come in fixed sizes and positions, so a GPU can have free memory no new slice can use.",
        "",
    ]
    if first is not None:
        sizes = ", ".join(f"{first.asked_by_size[s]}x {gib(s)}" for s in sorted(first.asked_by_size))
        lines += [
            f"Asked: {pods_asked} pods (seed {seed}) arriving over time and leaving after a while,",
            f"{gib(first.asked_mib)} of GPU memory in all; pods per memory request: {sizes}.",
            "",
        ]
    bound = _bound(results)
    for r in results:
        if r.policy == BOUND_NAME:
            lines.append(
                f"- bound (the ceiling, no real policy): {r.accepted} of {r.pods} pods ({100 * r.acceptance:.1f} %) "
                f"and {100 * r.memory_acceptance:.1f} % of the memory would fit if running slices could be "
                "moved at every arrival."
            )
            continue
        refused = r.pods - r.accepted
        line = (
            f"- {r.policy}: placed {r.accepted} of {r.pods} pods ({100 * r.acceptance:.1f} %), "
            f"{100 * r.memory_acceptance:.1f} % of the asked memory"
        )
        if bound is not None:
            line += (
                f"; {100 * (bound.acceptance - r.acceptance):.1f} points of pods and "
                f"{100 * (bound.memory_acceptance - r.memory_acceptance):.1f} points of memory below the bound"
            )
        lines.append(line + ".")
        if refused:
            lines.append(f"  {refused} refused:")
            for reason, count in r.rejected.most_common():
                lines.append(f"    {count}: {REASON_TEXT.get(reason, reason)}")
        if r.leaked_instances:
            lines.append(f"  ERROR: {r.leaked_instances} GPU instances left in NVML after every pod left")
    return "\n".join(lines)


def _row(r: RunResult, bound: RunResult | None, reasons: Sequence[str]) -> list[str]:
    real = r.realized
    gap = "-" if bound is None or r is bound else f"{100 * (bound.acceptance - r.acceptance):.1f}"
    mgap = (
        "-" if bound is None or r is bound else f"{100 * (bound.memory_acceptance - r.memory_acceptance):.1f}"
    )
    return [
        r.policy,
        str(r.pods),
        str(r.accepted),
        f"{100 * r.acceptance:.1f}",
        f"{100 * r.memory_acceptance:.1f}",
        gap,
        mgap,
        *[str(r.rejected.get(reason, 0)) if real else "-" for reason in reasons],
        f"{mean(r.fragmentation_samples):.3f}" if r.fragmentation_samples else "-",
        f"{100 * mean(r.allocated_memory_samples) if r.allocated_memory_samples else 0.0:.1f}",
        str(r.nvml_creates) if real else "-",
        str(r.leaked_instances) if real else "-",
        f"{1000 * percentile(r.decision_seconds, 0.50):.2f}" if real else "-",
        f"{1000 * percentile(r.decision_seconds, 0.99):.2f}" if real else "-",
    ]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def render(results: Sequence[RunResult]) -> str:
    """The comparison table, one row per policy (the bound last)."""
    reasons = [r.value for r in ShortReason]
    headers = [
        "policy",
        "pods",
        "placed",
        "accept %",
        "mem accept %",
        "pts < bound",
        "mem pts < bound",
        *[f"rej:{r}" for r in reasons],
        "mean frag",
        "mean mem used %",
        "GI created",
        "GI leaked",
        "p50 ms",
        "p99 ms",
    ]
    bound = _bound(results)
    return table(headers, [_row(r, bound, reasons) for r in results])


def render_sizes(results: Sequence[RunResult]) -> str:
    """Refusals per memory request: who pays for what did not fit (usually the big requests)."""
    if not results:
        return ""
    sizes = sorted({s for r in results for s in r.asked_by_size})
    headers = ["request", "pods", *[f"refused % {r.policy}" for r in results]]
    rows = [
        [
            gib(size),
            str(results[0].asked_by_size[size]),
            *[
                f"{100 * r.refused_by_size[size] / r.asked_by_size[size]:.1f}"
                if r.asked_by_size[size]
                else "-"
                for r in results
            ],
        ]
        for size in sizes
    ]
    return table(headers, rows)
