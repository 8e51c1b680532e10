"""The table `flexmig simulate` prints."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from driver.policy.model import ShortReason
from flexmig.simulation.runner import RunResult


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(results: Sequence[RunResult]) -> str:
    reasons = [r.value for r in ShortReason]
    headers = [
        "policy",
        "pods",
        "placed",
        "accept %",
        *[f"rej:{r}" for r in reasons],
        "mean frag",
        "mean mem used %",
        "GI created",
        "GI leaked",
        "p50 ms",
        "p99 ms",
    ]
    rows: list[list[str]] = []
    for r in results:
        rows.append(
            [
                r.policy,
                str(r.pods),
                str(r.accepted),
                f"{100 * r.acceptance:.1f}",
                *[str(r.rejected.get(reason, 0)) for reason in reasons],
                f"{mean(r.fragmentation_samples) if r.fragmentation_samples else 0.0:.3f}",
                f"{100 * mean(r.allocated_memory_samples) if r.allocated_memory_samples else 0.0:.1f}",
                str(r.nvml_creates),
                str(r.leaked_instances),
                f"{1000 * _pct(r.decision_seconds, 0.50):.2f}",
                f"{1000 * _pct(r.decision_seconds, 0.99):.2f}",
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
