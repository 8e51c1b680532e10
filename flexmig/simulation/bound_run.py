"""The repacking bound on the same pod stream as the policies (see driver/policy/bound.py).

Nothing is created in NVML for it: it is the most any placement rule could accept if running
instances could be moved at every arrival (and a pod's devices could be on different nodes), so the
table can say how far each policy is from the ceiling.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

from driver.catalog.simulated import simulated_catalog
from driver.policy.bound import Program, RepackingBound, model_groups
from flexmig.simulation import fit_highs
from flexmig.simulation.fit_search import SearchProgram
from flexmig.simulation.runner import NodeSpec, RunResult
from flexmig.simulation.workload import PodSpec

BOUND_NAME = "bound"


def run_bound(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    *,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    catalogs = [simulated_catalog(sku) for node in nodes for sku in node.skus]
    groups = model_groups(catalogs)
    # Both programs are exact; HiGHS is only faster (fit_highs.py says by how much).
    program: Program = fit_highs.HighsProgram(groups) if fit_highs.available() else SearchProgram(groups)
    bound = RepackingBound(catalogs, program)
    total = sum(c.memory_slices for c in catalogs) or 1
    slices_of = {
        size: min((p.memory_slices for c in catalogs for p in c.profiles if p.memory_mib >= size), default=0)
        for size in {p.memory_mib for p in pods}
    }
    result = RunResult(policy=BOUND_NAME, realized=False)
    leaving: list[tuple[float, str]] = []
    used = 0
    held: dict[str, int] = {}
    step = max(1, len(pods) // 10)
    began = time.monotonic()
    for n, pod in enumerate(pods, start=1):
        while leaving and leaving[0][0] <= pod.arrival:
            _, name = heapq.heappop(leaving)
            bound.release(name)
            used -= held.pop(name)
        result.pods += 1
        result.asked_by_size[pod.memory_mib] += 1
        result.asked_mib += pod.memory_mib * pod.devices
        if bound.admit(pod.name, [pod.memory_mib] * pod.devices):
            result.accepted += 1
            result.accepted_mib += pod.memory_mib * pod.devices
            # Memory in use is approximated by the smallest instance serving the request anywhere.
            held[pod.name] = slices_of[pod.memory_mib] * pod.devices
            used += held[pod.name]
            heapq.heappush(leaving, (pod.arrival + pod.duration, pod.name))
        else:
            result.refused_by_size[pod.memory_mib] += 1
        result.allocated_memory_samples.append(used / total)
        result.timeline.append((pod.arrival, result.acceptance, used / total))
        if progress is not None and (n % step == 0 or n == len(pods)):
            progress(
                f"[{BOUND_NAME}] {n}/{len(pods)} pods, {result.accepted} fit, {time.monotonic() - began:.1f} s"
            )
    return result
