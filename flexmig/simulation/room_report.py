"""What `flexmig simulate --movable-share/--priority-mix` prints and exports (room_run.py's rows)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from flexmig.simulation.report import percentile, table
from flexmig.simulation.room import RoomOutcome
from flexmig.simulation.room_run import RoomRow


def _largest_refused(out: RoomOutcome) -> float:
    largest = max(out.asked_by_size, default=0)
    return out.refused_by_size[largest] / out.asked_by_size[largest] if out.asked_by_size[largest] else 0.0


def _moves_per_plan(out: RoomOutcome) -> float:
    return out.moves / out.plans if out.plans else 0.0


def render_movable(rows: Sequence[RoomRow]) -> str:
    """One row per movable share: acceptance beside the ceiling of that share, and the moves paid."""
    headers = [
        "movable",
        "accept %",
        "mem accept %",
        "ceiling %",
        "ceiling mem %",
        "mem pts < ceiling",
        "largest refused %",
        "moves/100 placed",
        "moves/plan pod",
        "GI created",
        "GI leaked",
    ]
    body = []
    for row in rows:
        out = row.outcome
        ceiling_pods = row.ceiling_pods or 0.0
        ceiling_mem = row.ceiling_memory or 0.0
        body.append(
            [
                f"{row.movable_share:.0%}",
                f"{100 * out.acceptance:.1f}",
                f"{100 * out.weighted:.1f}",
                f"{100 * ceiling_pods:.1f}",
                f"{100 * ceiling_mem:.1f}",
                f"{100 * (ceiling_mem - out.weighted):.1f}",
                f"{100 * _largest_refused(out):.1f}",
                f"{100 * out.moves / max(1, out.placed):.1f}",
                f"{_moves_per_plan(out):.2f}",
                str(row.gi_created),
                str(row.gi_leaked),
            ]
        )
    return table(headers, body)


def _waits(out: RoomOutcome) -> tuple[float, float]:
    waits = out.high_waits
    return (statistics.fmean(waits) if waits else 0.0, percentile(waits, 0.95))


def render_priority(rows: Sequence[RoomRow]) -> str:
    """Per high-priority share, movable share and preemption switch: who got placed, and at what cost."""
    headers = [
        "high",
        "movable",
        "preemption",
        "high placed %",
        "low placed %",
        "mem accept %",
        "high wait mean",
        "high wait p95",
        "evictions/100 high",
        "moves/100 placed",
        "GI created",
        "GI leaked",
    ]
    body = []
    for row in rows:
        out = row.outcome
        mean, p95 = _waits(out)
        body.append(
            [
                f"{row.high_share:.0%}",
                f"{row.movable_share:.0%}",
                "on" if row.preemption else "off",
                f"{100 * out.high_placed / max(1, out.high):.1f}",
                f"{100 * out.low_placed / max(1, out.low):.1f}",
                f"{100 * out.weighted:.1f}",
                f"{mean:.2f}",
                f"{p95:.2f}",
                f"{100 * out.evictions / max(1, out.high):.1f}",
                f"{100 * out.moves / max(1, out.placed):.1f}",
                str(row.gi_created),
                str(row.gi_leaked),
            ]
        )
    return table(headers, body)


def render(rows: Sequence[RoomRow]) -> str:
    movable = [r for r in rows if r.high_share == 0]
    priority = [r for r in rows if r.high_share > 0]
    parts = []
    if movable:
        parts += [
            "Moving movable pods to make room (refused at once when nothing fits, like the table above;",
            "the ceiling: the repacking bound in which only the movable pods may move):",
            render_movable(movable),
        ]
    if priority:
        if parts:
            parts.append("")
        parts += [
            "Priority preemption (a pod that fits nowhere waits, retried when a pod leaves; times in the",
            "stream's units, a mean lifetime is 40):",
            render_priority(priority),
        ]
    return "\n".join(parts)


def _sizes(out: RoomOutcome) -> list[dict[str, int]]:
    return [
        {"memory_mib": size, "asked": out.asked_by_size[size], "refused": out.refused_by_size[size]}
        for size in sorted(out.asked_by_size)
    ]


def document(rows: Sequence[RoomRow]) -> list[dict[str, Any]]:
    """The `making_room` list of the JSON document (keys in export.py)."""
    docs = []
    for row in rows:
        out = row.outcome
        mean, p95 = _waits(out)
        docs.append(
            {
                "movable_share": row.movable_share,
                "high_share": row.high_share,
                "preemption": row.preemption,
                "pods": out.pods,
                "accepted": out.placed,
                "acceptance": round(out.acceptance, 6),
                "memory_acceptance": round(out.weighted, 6),
                "ceiling": None
                if row.ceiling_pods is None
                else {
                    "acceptance": round(row.ceiling_pods, 6),
                    "memory_acceptance": round(row.ceiling_memory or 0.0, 6),
                },
                "refused_by_size": _sizes(out),
                "high": {
                    "pods": out.high,
                    "placed": out.high_placed,
                    "wait_mean": round(mean, 4),
                    "wait_p95": round(p95, 4),
                },
                "low": {"pods": out.low, "placed": out.low_placed},
                "moves": out.moves,
                "pods_placed_by_a_plan": out.plans,
                "evictions": out.evictions,
                "gi_created": row.gi_created,
                "gi_leaked": row.gi_leaked,
            }
        )
    return docs
