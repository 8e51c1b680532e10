"""The online repacking bound: accept a pod when every live request plus its own could be re-placed.

No placement rule that keeps instances where they were created can accept more than a rule allowed to
move every running instance at each arrival, so this is the ceiling `flexmig simulate` and
benchmarks/packing measure policies against. Two relaxations make it a bound and not a policy: live
instances may move, and a pod's devices need not share a node.

Exact feasibility without a solver. A GPU can hold any subset of one of its model's maximal layouts
(driver/placement/layouts.py), so a set of requests fits when every GPU can be given a maximal layout
whose instances, over the cluster, can be matched to the requests (a request of m MiB to an instance
of >= m MiB). Those neighbourhoods are nested (whatever serves m also serves anything smaller), so by
Hall's theorem the matching exists iff for every request size t, the instances of >= t MiB are at
least the requests of >= t MiB. A layout contributes a vector of such counts, one per size; a dynamic
program over GPUs keeps every reachable sum, capped at the demand (more is no use) and without
dominated vectors, and the set fits iff the demand itself is reachable. benchmarks/packing validates
this against an integer program solved by HiGHS and against brute force
(tests/unit/policy/test_policy_bound.py).

Before running the program, a request is tried in the free instances of the current witness (the
layouts and matching of the last success): departures only free instances, so the witness stays valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from driver.catalog.types import GpuCatalog
from driver.placement.layouts import enumerate_catalog_layouts
from driver.policy.cluster import catalog_key

Vector = tuple[int, ...]


@dataclass(slots=True)
class ModelGroup:
    """GPUs of one catalog: how many, and the instance memories (MiB) of each distinct maximal layout."""

    count: int
    layouts: tuple[tuple[int, ...], ...]


@dataclass(slots=True)
class _WitnessGpu:
    free: list[int] = field(default_factory=list)  # instance memories not matched to a request


def model_groups(catalogs: Iterable[GpuCatalog]) -> list[ModelGroup]:
    counts: dict[object, int] = {}
    first: dict[object, GpuCatalog] = {}
    for catalog in catalogs:
        key = catalog_key(catalog)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, catalog)
    groups: list[ModelGroup] = []
    for ckey, catalog in first.items():
        layouts = {
            tuple(sorted(i.profile.memory_mib for i in layout.instances))
            for layout in enumerate_catalog_layouts(catalog)
        }
        groups.append(ModelGroup(counts[ckey], tuple(sorted(layouts))))
    return groups


def _dominated(s: Vector, kept: Sequence[Vector]) -> bool:
    return any(all(a >= b for a, b in zip(k, s, strict=True)) for k in kept)


class FitProgram:
    """Exact check whether a multiset of request sizes fits the cluster (see the module docstring)."""

    def __init__(self, groups: Sequence[ModelGroup]) -> None:
        self.groups = list(groups)
        self._largest = max((max(lay) for g in self.groups for lay in g.layouts if lay), default=0)
        self._memories = sorted({m for g in self.groups for lay in g.layouts for m in lay})
        self._memo: dict[tuple[Vector, Vector], list[list[int]] | None] = {}

    def _class_of(self, size: int) -> int:
        return min(m for m in self._memories if m >= size)

    def solve(self, sizes: Sequence[int]) -> list[list[int]] | None:
        """Per GPU (groups in order, `count` each) the instance memories of a layout that fits, or None."""
        if not sizes:
            return [[] for g in self.groups for _ in range(g.count)]
        if max(sizes) > self._largest:
            return None
        # Sizes served by the same instances are one threshold: the smallest instance memory >= size.
        classes = [self._class_of(s) for s in sizes]
        thresholds = tuple(sorted(set(classes), reverse=True))
        demand = tuple(sum(1 for c in classes if c >= t) for t in thresholds)
        key = (thresholds, demand)
        if key in self._memo:
            return self._memo[key]
        result = self._run(thresholds, demand)
        if len(self._memo) > 200_000:
            self._memo.clear()
        self._memo[key] = result
        return result

    def _run(self, thresholds: Vector, demand: Vector) -> list[list[int]] | None:
        vectors = [
            [tuple(sum(1 for m in layout if m >= t) for t in thresholds) for layout in g.layouts]
            for g in self.groups
        ]
        # Per GPU step: state -> (previous state, layout index); states are capped sums.
        steps: list[dict[Vector, tuple[Vector, int]]] = []
        states: list[Vector] = [(0,) * len(thresholds)]
        goal: Vector | None = None
        for gi, group in enumerate(self.groups):
            for _ in range(group.count):
                parents: dict[Vector, tuple[Vector, int]] = {}
                for s in states:
                    for li, v in enumerate(vectors[gi]):
                        n = tuple(min(d, a + b) for d, a, b in zip(demand, s, v, strict=True))
                        if n not in parents:
                            parents[n] = (s, li)
                steps.append(parents)
                if demand in parents:
                    goal = demand
                    break
                ordered = sorted(parents, key=lambda v: -sum(v))
                kept: list[Vector] = []
                for s in ordered:
                    if not _dominated(s, kept):
                        kept.append(s)
                states = kept
            if goal is not None:
                break
        if goal is None:
            return None
        # Walk back: which layout each GPU took (GPUs past the last step stay empty).
        chosen: list[int] = []
        state = goal
        for parents in reversed(steps):
            state, li = parents[state]
            chosen.append(li)
        chosen.reverse()
        out: list[list[int]] = []
        position = 0
        for gi, group in enumerate(self.groups):
            for _ in range(group.count):
                if position < len(chosen):
                    out.append(list(self.groups[gi].layouts[chosen[position]]))
                else:
                    out.append([])
                position += 1
        return out


class Program(Protocol):
    groups: list[ModelGroup]

    def solve(self, sizes: Sequence[int]) -> list[list[int]] | None: ...


class RepackingBound:
    """Admits a pod (a list of device sizes in MiB) when all live devices plus its own fit from scratch."""

    name = "repacking-bound"

    def __init__(self, catalogs: Iterable[GpuCatalog], program: Program | None = None) -> None:
        self.program = program if program is not None else FitProgram(model_groups(catalogs))
        self._live: dict[str, tuple[int, ...]] = {}
        self._gpus: list[_WitnessGpu] = [_WitnessGpu() for g in self.program.groups for _ in range(g.count)]
        self._held: dict[str, list[tuple[int, int]]] = {}  # pod -> (gpu position, instance memory)
        self.programs_run = 0

    def admit(self, pod: str, sizes: Sequence[int]) -> bool:
        if pod in self._live:
            raise ValueError(f"pod {pod!r} is already admitted")
        taken = self._take(sorted(sizes, reverse=True))
        if taken is not None:
            self._live[pod] = tuple(sizes)
            self._held[pod] = taken
            return True
        everything = [s for v in self._live.values() for s in v] + list(sizes)
        self.programs_run += 1
        layouts = self.program.solve(everything)
        if layouts is None:
            return False
        self._live[pod] = tuple(sizes)
        self._rebuild(layouts)
        return True

    def release(self, pod: str) -> None:
        self._live.pop(pod)
        for position, memory in self._held.pop(pod):
            self._gpus[position].free.append(memory)

    def _take(self, sizes: Sequence[int]) -> list[tuple[int, int]] | None:
        """Match sizes (largest first) to the smallest free witness instances; None (nothing taken) if short."""
        taken: list[tuple[int, int]] = []
        for size in sizes:
            best: tuple[int, int] | None = None
            for position, gpu in enumerate(self._gpus):
                for memory in gpu.free:
                    if memory >= size and (best is None or memory < best[1]):
                        best = (position, memory)
            if best is None:
                for position, memory in taken:
                    self._gpus[position].free.append(memory)
                return None
            self._gpus[best[0]].free.remove(best[1])
            taken.append(best)
        return taken

    def _rebuild(self, layouts: list[list[int]]) -> None:
        self._gpus = [_WitnessGpu(sorted(layout)) for layout in layouts]
        self._held = {pod: [] for pod in self._live}
        pending = sorted(((s, pod) for pod, sizes in self._live.items() for s in sizes), reverse=True)
        for size, pod in pending:
            got = self._take([size])
            # Hall's condition held for the whole set, and largest-first matching never blocks a
            # smaller request (whatever a larger one could use, a smaller one could too).
            assert got is not None, "repacking witness does not match its own demand"
            self._held[pod].extend(got)
