"""The repacking bound's fit check as an integer program solved by HiGHS, when `highspy` is installed.

Same question and model as `FitProgram` (driver/policy/bound.py) and `SearchProgram`
(fit_search.py): x[g, L] = GPUs of model group g given maximal layout L; per group at most its GPU
count; per request class t, the instances of >= t MiB at least the requests of class >= t. A solver
answers the hard (infeasible, near-full) questions of the default `flexmig simulate` run in about a
second in all, where the pure-Python search needs ~10 s, so the command uses it when it can
(`highspy` is a dependency; `available()` still guards an install without it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from driver.policy.bound import ModelGroup


def available() -> bool:
    return importlib.util.find_spec("highspy") is not None


class HighsProgram:
    """Drop-in for `FitProgram`: `solve(sizes)` gives per GPU a layout's instance memories, or None."""

    def __init__(self, groups: Sequence[ModelGroup]) -> None:
        self.groups = list(groups)
        self._memories = sorted({m for g in self.groups for lay in g.layouts for m in lay})
        self._memo: dict[tuple[int, ...], list[list[int]] | None] = {}
        self._highs: Any = None

    def _solver(self) -> Any:
        if self._highs is None:
            from driver.policy.highs import quiet_highs  # imports highspy, checked by available()

            self._highs = quiet_highs()  # no banner on stdout: `--json` stays one document
        self._highs.clearModel()
        return self._highs

    def solve(self, sizes: Sequence[int]) -> list[list[int]] | None:
        if not sizes:
            return [[] for g in self.groups for _ in range(g.count)]
        classes: list[int] = []
        for size in sizes:
            fitting = [m for m in self._memories if m >= size]
            if not fitting:
                return None
            classes.append(fitting[0])
        key = tuple(sorted(classes))
        if key not in self._memo:
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = self._solve(classes)
        return self._memo[key]

    def _solve(self, classes: Sequence[int]) -> list[list[int]] | None:
        import highspy  # optional dependency, checked by available()

        thresholds = sorted(set(classes), reverse=True)
        h = self._solver()
        columns = [(gi, li) for gi, g in enumerate(self.groups) for li in range(len(g.layouts))]
        for col, (gi, _) in enumerate(columns):
            h.addVar(0.0, float(self.groups[gi].count))
            h.changeColIntegrality(col, highspy.HighsVarType.kInteger)
        for gi, group in enumerate(self.groups):
            idx = [c for c, (g, _) in enumerate(columns) if g == gi]
            h.addRow(0.0, float(group.count), len(idx), idx, [1.0] * len(idx))
        for t in thresholds:
            need = sum(1 for c in classes if c >= t)
            idx, val = [], []
            for c, (gi, li) in enumerate(columns):
                supply = sum(1 for m in self.groups[gi].layouts[li] if m >= t)
                if supply:
                    idx.append(c)
                    val.append(float(supply))
            h.addRow(float(need), highspy.kHighsInf, len(idx), idx, val)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        values = h.getSolution().col_value
        out: list[list[int]] = []
        for gi, group in enumerate(self.groups):
            layouts: list[list[int]] = []
            for c, (g, li) in enumerate(columns):
                if g == gi:
                    layouts += [list(group.layouts[li])] * round(values[c])
            out += layouts + [[] for _ in range(group.count - len(layouts))]
        return out
