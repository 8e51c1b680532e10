"""Exact fit check for the repacking bound by depth-first search, fast enough for `flexmig simulate`.

It answers the question of `FitProgram` (driver/policy/bound.py), with the same model: a multiset of
requests fits when every GPU can be given one of its model's maximal layouts such that, for every
request class t (the smallest instance memory that serves a request), the instances of >= t MiB are at
least the requests of class >= t (Hall's condition; the neighbourhoods are nested). `FitProgram` keeps
every non-dominated partial sum over GPUs, which on a mixed cluster of 12 GPUs with seven classes took
up to 23 s for one question; the default simulate run asks hundreds.

Here the GPUs are searched one at a time for a layout, largest instances first, with three cuts:
- a layout whose supply vector is dominated by another layout of the same model is never tried, and
  GPUs of one model take layouts in non-decreasing order (they are interchangeable);
- per class, the remaining GPUs at their best cannot cover what is still missing, or, per class
  cutoff, the memory those GPUs can put in instances of >= that class (each instance counted at its
  class) is below the memory still missing there: both are valid for any completion, so cutting is
  exact;
- a (GPU position, missing vector) pair that already failed fails again.
Layouts are tried most useful first (most missing memory covered), so a feasible set is usually
found on the first dive. tests/unit/test_simulate_command.py checks it against `FitProgram`.
"""

from __future__ import annotations

from collections.abc import Sequence

from driver.policy.bound import ModelGroup

Vector = tuple[int, ...]


class SearchProgram:
    """Drop-in for `FitProgram`: `solve(sizes)` gives per GPU a layout's instance memories, or None."""

    def __init__(self, groups: Sequence[ModelGroup]) -> None:
        self.groups = list(groups)
        self._memories = sorted({m for g in self.groups for lay in g.layouts for m in lay})
        self._memo: dict[tuple[int, ...], list[list[int]] | None] = {}
        self.nodes_visited = 0

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
            self._memo[key] = _Search(self.groups, classes, self).run()
        return self._memo[key]


class _Search:
    def __init__(self, groups: Sequence[ModelGroup], classes: Sequence[int], owner: SearchProgram) -> None:
        self.owner = owner
        self.groups = groups
        thresholds = sorted(set(classes), reverse=True)
        self.thresholds = thresholds
        self.demand: Vector = tuple(sum(1 for c in classes if c >= t) for t in thresholds)
        # Memory weight of one unit of each class: a count of instances >= t_k, weighted by the gap
        # to the next class down, sums to each instance's memory rounded down to its class.
        gaps = [t - n for t, n in zip(thresholds, [*thresholds[1:], 0], strict=True)]
        self.gaps = gaps
        # Per group: distinct, non-dominated supply vectors, each with one layout that gives it.
        self.options: list[list[tuple[Vector, int]]] = []
        for group in groups:
            seen: dict[Vector, int] = {}
            for li, layout in enumerate(group.layouts):
                vec = tuple(sum(1 for m in layout if m >= t) for t in thresholds)
                seen.setdefault(vec, li)
            kept = [
                (v, li)
                for v, li in seen.items()
                if not any(o != v and all(a >= b for a, b in zip(o, v, strict=True)) for o in seen)
            ]
            self.options.append(kept)
        # GPUs in search order: models with the largest instances first.
        order = sorted(
            range(len(groups)), key=lambda g: -max((max(lay) for lay in groups[g].layouts if lay), default=0)
        )
        self.positions = [g for g in order for _ in range(groups[g].count)]
        k_count = len(thresholds)
        n = len(self.positions)
        # best_count[p][k]: most instances of >= t_k GPUs p.. can give; best_memory[p][k]: most memory
        # (rounded to classes) in instances of >= t_k.
        self.best_count = [[0] * k_count for _ in range(n + 1)]
        self.best_memory = [[0] * k_count for _ in range(n + 1)]
        for p in range(n - 1, -1, -1):
            opts = self.options[self.positions[p]]
            for k in range(k_count):
                self.best_count[p][k] = self.best_count[p + 1][k] + max(v[k] for v, _ in opts)
                self.best_memory[p][k] = self.best_memory[p + 1][k] + max(
                    self._memory_to(v, k) for v, _ in opts
                )
        self.failed: set[tuple[int, int, Vector]] = set()
        self.chosen: list[int] = [0] * n  # option index per position

    def _memory_to(self, vec: Sequence[int], k: int) -> int:
        # Memory in instances of >= t_k, each rounded down to its class (see gaps).
        total = self.thresholds[k] * vec[k]
        for j in range(k):
            total += self.gaps[j] * vec[j]
        return total

    def _hopeless(self, p: int, missing: Vector) -> bool:
        counts, memory = self.best_count[p], self.best_memory[p]
        for k, need in enumerate(missing):
            if need > counts[k] or self._memory_to(missing, k) > memory[k]:
                return True
        return False

    def run(self) -> list[list[int]] | None:
        if not self._dive(0, self.demand, 0):
            return None
        per_group: list[list[list[int]]] = [[] for _ in self.groups]
        for p, g in enumerate(self.positions):
            if self.chosen[p] < 0:
                per_group[g].append([])
            else:
                li = self.options[g][self.chosen[p]][1]
                per_group[g].append(list(self.groups[g].layouts[li]))
        return [layout for group in per_group for layout in group]

    def _dive(self, p: int, missing: Vector, low: int) -> bool:
        self.owner.nodes_visited += 1
        if not any(missing):
            for rest in range(p, len(self.positions)):
                self.chosen[rest] = -1  # nothing needed from these GPUs
            return True
        if p == len(self.positions) or self._hopeless(p, missing):
            return False
        key = (p, low, missing)
        if key in self.failed:
            return False
        g = self.positions[p]
        same_next = p + 1 < len(self.positions) and self.positions[p + 1] == g
        opts = self.options[g]
        ranked = sorted(
            range(low, len(opts)),
            key=lambda i: -sum(w * min(a, b) for w, a, b in zip(self.gaps, opts[i][0], missing, strict=True)),
        )
        for i in ranked:
            vec = opts[i][0]
            after = tuple(max(0, m - v) for m, v in zip(missing, vec, strict=True))
            self.chosen[p] = i
            if self._dive(p + 1, after, i if same_next else 0):
                return True
        self.failed.add(key)
        return False
