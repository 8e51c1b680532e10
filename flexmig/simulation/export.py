"""`flexmig simulate --json`: the run as one JSON document, schema `flexmig.simulate/v1`.

The schema is stable: fields are only added, never renamed or removed, within v1; a breaking change
gets a new `schema` value (README.md, "What `flexmig simulate` does", points here). Every key:

- `schema`: "flexmig.simulate/v1"
- `cluster`: `nodes` (list of {`name`, `gpus`: list of model keys}), `gpus` (count), `memory_slices`
  (MIG memory slices over all GPUs)
- `workload`: `pods`, `seed`, `asked_mib` (memory over all pods and devices), `sizes` (list of
  {`memory_mib`, `pods`})
- `results`: one object per policy, the bound last, each with `policy`, `realized` (false for the
  bound: nothing was created in NVML), `pods`, `accepted`, `acceptance` (0..1), `asked_mib`,
  `accepted_mib`, `memory_acceptance` (0..1), `below_bound` ({`pods`, `memory`}: points, 0..100, by
  which the bound's acceptance is higher; null for the bound or without a bound row), `refused_by_reason`
  ({reason: count}, every reason of driver/policy/model.py `ShortReason`; empty for the bound),
  `refused_by_size` (list of {`memory_mib`, `asked`, `refused`}), `mean_fragmentation` (0..1, null when
  no GPU was busy), `mean_memory_in_use` (0..1), `gi_created`, `gi_destroyed`, `gi_leaked`,
  `decision_ms` ({`p50`, `p99`}; null for the bound), `timeline` (list of [time, acceptance so far,
  memory in use], at most 200 points), `final_slice_map` (list of {`gpu`, `model`, `memory_slices`,
  `instances`: list of {`profile`, `start`, `size`}}: the GPUs when the last pod arrived; empty for
  the bound)
- `making_room`: null unless `--movable-share` or `--priority-mix` was given; else one object per row of
  flexmig/simulation/room_run.py, each with `movable_share`, `high_share` (0 for the movable rows,
  where a pod that fits nowhere is refused at once), `preemption`, `pods`, `accepted`, `acceptance`,
  `memory_acceptance`, `ceiling` ({`acceptance`, `memory_acceptance`} of the repacking bound in which
  only the movable pods may move; null for the priority rows), `refused_by_size` (as above), `high`
  ({`pods`, `placed`, `wait_mean`, `wait_p95`}: high-priority pods, waits in the stream's time units),
  `low` ({`pods`, `placed`}), `moves`, `pods_placed_by_a_plan`, `evictions`, `gi_created`, `gi_leaked`
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean
from typing import Any

from driver.policy.model import ShortReason
from flexmig.simulation.bound_run import BOUND_NAME
from flexmig.simulation.report import percentile
from flexmig.simulation.runner import NodeSpec, RunResult

SCHEMA = "flexmig.simulate/v1"
TIMELINE_POINTS = 200


def thin(points: Sequence[tuple[float, float, float]], limit: int) -> list[tuple[float, float, float]]:
    """At most `limit` points, evenly spaced over the run, the last one kept."""
    if len(points) <= limit:
        return list(points)
    step = len(points) / limit
    picked = [points[int(i * step)] for i in range(limit - 1)]
    return [*picked, points[-1]]


def _result(r: RunResult, bound: RunResult | None) -> dict[str, Any]:
    below = None
    if bound is not None and r is not bound:
        below = {
            "pods": round(100 * (bound.acceptance - r.acceptance), 3),
            "memory": round(100 * (bound.memory_acceptance - r.memory_acceptance), 3),
        }
    return {
        "policy": r.policy,
        "realized": r.realized,
        "pods": r.pods,
        "accepted": r.accepted,
        "acceptance": round(r.acceptance, 6),
        "asked_mib": r.asked_mib,
        "accepted_mib": r.accepted_mib,
        "memory_acceptance": round(r.memory_acceptance, 6),
        "below_bound": below,
        "refused_by_reason": {reason.value: r.rejected.get(reason.value, 0) for reason in ShortReason}
        if r.realized
        else {},
        "refused_by_size": [
            {"memory_mib": size, "asked": r.asked_by_size[size], "refused": r.refused_by_size[size]}
            for size in sorted(r.asked_by_size)
        ],
        "mean_fragmentation": round(mean(r.fragmentation_samples), 6) if r.fragmentation_samples else None,
        "mean_memory_in_use": round(mean(r.allocated_memory_samples), 6)
        if r.allocated_memory_samples
        else 0.0,
        "gi_created": r.nvml_creates,
        "gi_destroyed": r.nvml_destroys,
        "gi_leaked": r.leaked_instances,
        "decision_ms": {
            "p50": round(1000 * percentile(r.decision_seconds, 0.50), 4),
            "p99": round(1000 * percentile(r.decision_seconds, 0.99), 4),
        }
        if r.realized
        else None,
        "timeline": [
            [round(t, 4), round(a, 6), round(m, 6)] for t, a, m in thin(r.timeline, TIMELINE_POINTS)
        ],
        "final_slice_map": [
            {
                "gpu": gpu,
                "model": model,
                "memory_slices": slices,
                "instances": [{"profile": p, "start": s, "size": z} for p, s, z in instances],
            }
            for gpu, model, slices, instances in r.final_map
        ],
    }


def document(
    nodes: Sequence[NodeSpec],
    seed: int,
    memory_slices: int,
    results: Sequence[RunResult],
    making_room: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    bound = next((r for r in results if r.policy == BOUND_NAME), None)
    first = results[0] if results else None
    return {
        "schema": SCHEMA,
        "cluster": {
            "nodes": [{"name": n.name, "gpus": list(n.skus)} for n in nodes],
            "gpus": sum(len(n.skus) for n in nodes),
            "memory_slices": memory_slices,
        },
        "workload": {
            "pods": first.pods if first else 0,
            "seed": seed,
            "asked_mib": first.asked_mib if first else 0,
            "sizes": [{"memory_mib": s, "pods": first.asked_by_size[s]} for s in sorted(first.asked_by_size)]
            if first
            else [],
        },
        "results": [_result(r, bound) for r in results],
        "making_room": making_room,
    }
