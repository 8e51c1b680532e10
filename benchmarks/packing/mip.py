"""Integer programs over each model's maximal layouts, solved by HiGHS (`highspy`, dev extra).

Variables: x[g, L] = how many GPUs of catalog group g take maximal layout L. A multiset of requests
fits when, for every request class t (the smallest instance memory that serves it), the instances
of >= t MiB are at least the requests of class >= t: the requests' neighbourhoods are nested, so
Hall's condition is exact (see driver/policy/bound.py). `fits` answers the online bound's question
(at most `count` GPUs per group); `fewest_gpus` is the offline optimum (minimise the GPUs used).
tests/unit/policy/test_policy_bound.py checks both against brute force on small cases.
"""

from __future__ import annotations

from collections.abc import Sequence

import highspy

from driver.policy.bound import ModelGroup
from driver.policy.highs import quiet_highs


def _classes(groups: Sequence[ModelGroup], sizes: Sequence[int]) -> tuple[list[int], list[int]] | None:
    memories = sorted({m for g in groups for lay in g.layouts for m in lay})
    classes: list[int] = []
    for s in sizes:
        fitting = [m for m in memories if m >= s]
        if not fitting:
            return None
        classes.append(fitting[0])
    thresholds = sorted(set(classes), reverse=True)
    demand = [sum(1 for c in classes if c >= t) for t in thresholds]
    return thresholds, demand


def _solve(groups: Sequence[ModelGroup], sizes: Sequence[int], minimise: bool) -> list[list[int]] | None:
    if not sizes:
        return [[] for g in groups for _ in range(g.count)]
    shape = _classes(groups, sizes)
    if shape is None:
        return None
    thresholds, demand = shape
    h = quiet_highs()
    h.setOptionValue("time_limit", 60.0)
    columns: list[tuple[int, int]] = []
    for gi, group in enumerate(groups):
        for li in range(len(group.layouts)):
            h.addVar(0.0, float(group.count))
            columns.append((gi, li))
    for col in range(len(columns)):
        h.changeColIntegrality(col, highspy.HighsVarType.kInteger)
        h.changeColCost(col, 1.0 if minimise else 0.0)
    for gi, group in enumerate(groups):
        idx = [c for c, (g, _) in enumerate(columns) if g == gi]
        h.addRow(0.0, float(group.count), len(idx), idx, [1.0] * len(idx))
    for t, need in zip(thresholds, demand, strict=True):
        idx: list[int] = []
        val: list[float] = []
        for c, (gi, li) in enumerate(columns):
            supply = sum(1 for m in groups[gi].layouts[li] if m >= t)
            if supply:
                idx.append(c)
                val.append(float(supply))
        h.addRow(float(need), highspy.kHighsInf, len(idx), idx, val)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    values = h.getSolution().col_value
    out: list[list[int]] = []
    for gi, group in enumerate(groups):
        layouts: list[list[int]] = []
        for c, (g, li) in enumerate(columns):
            if g == gi:
                layouts += [list(group.layouts[li])] * round(values[c])
        out += layouts + [[] for _ in range(group.count - len(layouts))]
    return out


class MipProgram:
    """Drop-in for `FitProgram` (driver/policy/bound.py) backed by HiGHS; faster on large clusters."""

    def __init__(self, groups: Sequence[ModelGroup]) -> None:
        self.groups = list(groups)
        self._memo: dict[tuple[int, ...], list[list[int]] | None] = {}

    def solve(self, sizes: Sequence[int]) -> list[list[int]] | None:
        key = tuple(sorted(sizes))
        if key not in self._memo:
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = _solve(self.groups, sizes, minimise=False)
        return self._memo[key]


def fewest_gpus(groups: Sequence[ModelGroup], sizes: Sequence[int]) -> int | None:
    """The fewest GPUs that hold every request (each GPU any sub-layout of a maximal layout)."""
    layouts = _solve(groups, sizes, minimise=True)
    if layouts is None:
        return None
    return sum(1 for lay in layouts if lay)
