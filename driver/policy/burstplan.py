"""A burst of single-device pods decided together, exactly: one small integer program over GPU states.

Deciding a burst one pod at a time, even largest first, can open more GPUs than needed: measured in
benchmarks/packing (offline table), 1.058x the optimum GPU count on H100-80GB in every order. Here the
*plain* pods of a burst (one MIG device asking only for memory, some: no device filter, no pinned
or preferred profile, no model restriction, no lifetime hint; `plain`) are placed by an integer program
solved by HiGHS (`highspy`), and the rest stay with the per-pod policy (driver/policy/batch.py).

The program works on GPU *states* (`ClusterState.live_states`): GPUs in one state are
interchangeable, so per state it enumerates every *completion* (a set of new instances, each serving
one of the burst's request sizes with a profile `candidate_profiles` allows for that size, placed where
the occupancy allows); of those serving the same requests (how many of each size) it keeps the cheapest.
Variables x[j] = how many GPUs of completion j's state take it; rows: at most the state's GPUs, at
most the burst's requests of each size. Objectives, lexicographic, each solved to proven optimality
with the previous ones fixed:

1. most requested memory placed (what largest-first aims at too);
2. least cost as `PackingPolicy` prices a placement: weighted capacity destroyed (weights of the
   cluster at the start of the burst, `PackingPolicy.weights`) plus memory waste (`PackingPolicy.waste`).

Fewest GPUs opened (the offline target) is not a separate objective: least cost reached the optimum
GPU count on every offline burst of benchmarks/packing and opened no more GPUs than an explicit
fewest-opened stage before it on 300 random small bursts on empty and partly filled H100-80GB and
A100-40GB clusters; such a stage would also override the waste term's choice of model on mixed
clusters (a small request to a small GPU's profile, even if that opens it).

The aggregate solution goes to concrete GPUs per state in name order, and each instance to the next
request of its size in input order. `plan_burst` returns None (the caller decides as before) when
fewer than `MIN_PODS` plain pods are given, the enumeration exceeds `MAX_COMPLETIONS`, or the whole
plan (enumeration and solves) does not finish within its time budget with a proven optimum: an
incomplete solve is never used. Nothing of `cluster` changes except its interned-state cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import highspy

from driver.placement.choice import ProfileChoiceError, candidate_profiles
from driver.policy.allocator import PackingPolicy
from driver.policy.cluster import ClusterState, GpuStateClass
from driver.policy.highs import quiet_highs
from driver.policy.model import Choice, DeviceRequest, GpuRef, GpuState

MIN_PODS = 2
MAX_BURST_PODS = 16
"""Pods one controller step plans together at most (the first ones in its decision order; the rest
go per pod). Measured on 1000-5000 nodes x 8 GPUs at 70 % full: bursts of 10-20 plan in 0.2-0.4 s,
larger ones mostly run out of `TIME_BUDGET_S` and would cost the budget every step for nothing."""
MAX_COMPLETIONS = 20_000
"""Bound on the completions enumerated (distinct states after x requests served, over all states; the
program keeps the cheapest per state and requests served): a burst on a cluster with very many
distinct GPU states goes per pod. 40 requests of 7 sizes on empty H100-80GBs enumerate about 2,900."""
TIME_BUDGET_S = 0.5
"""Wall time for enumeration and both solves. The offline bursts of benchmarks/packing (40 requests,
empty A100-40GB or H100-80GB clusters) plan in 0.04-0.15 s on a shared two-core machine; a burst
that takes longer is decided per pod, as before."""

_REP = GpuRef("", -1)
_FREE = "burst-free"  # memo tag: other memo keys never start with this string


def plain(requests: Sequence[DeviceRequest]) -> bool:
    """Whether a pod is one MIG device asking for memory only (what the program places)."""
    if len(requests) != 1:
        return False
    r = requests[0]
    # 0 MiB adds nothing to the memory the plan maximises: the plan would leave it out.
    return (
        r.memory_mib > 0
        and r.device_filter is None
        and r.pinned_profile is None
        and r.preferred_profile is None
        and not r.models
        and r.end_hint is None
    )


@dataclass(frozen=True, slots=True)
class _Completion:
    state: GpuStateClass
    served: tuple[int, ...]  # requests served per size index
    picks: tuple[tuple[int, int, int], ...]  # (profile index in the catalog, start, size index)
    cost: float


class _Budget(Exception):
    """The plan ran out of time or columns."""


def plan_burst(
    policy: PackingPolicy,
    cluster: ClusterState,
    requests: Sequence[DeviceRequest],
    time_budget_s: float = TIME_BUDGET_S,
    max_completions: int = MAX_COMPLETIONS,
    gpu_ok: Callable[[GpuRef], bool] | None = None,
) -> list[Choice | None] | None:
    """One planned choice per request (None: the plan leaves it out, nothing fits it), mutually
    consistent on `cluster`; or None when the plan is skipped (see the module docstring).

    Every request must be `plain` alone (as a one-device pod). `gpu_ok`: the GPUs the plan may use
    (all when None), e.g. those on the nodes the pods may run on."""
    if len(requests) < MIN_PODS:
        return None
    if not all(plain([r]) for r in requests):
        raise ValueError("plan_burst takes plain single-device requests only")
    deadline = time.monotonic() + time_budget_s
    cluster.trim()  # a decision: bound the interned states before interning more (ids stay fixed in it)
    sizes = sorted({r.memory_mib for r in requests}, reverse=True)
    demand = tuple(sum(1 for r in requests if r.memory_mib == m) for m in sizes)
    weights = policy.weights(cluster)
    try:
        members = _members(cluster, gpu_ok)
        columns = _enumerate(policy, cluster, members, sizes, demand, weights, deadline, max_completions)
        counts = _solve(columns, members, demand, sizes, deadline)
    except _Budget:
        return None
    if counts is None:
        return None
    return _assign(cluster, members, requests, sizes, columns, counts)


def _members(
    cluster: ClusterState, gpu_ok: Callable[[GpuRef], bool] | None
) -> dict[GpuStateClass, list[GpuRef]]:
    """Per live state, its usable GPUs by (node, index), states in order of their first GPU: the
    program's columns, hence its choice among equally good solutions, then depend on names, not
    on the order states were interned in (which differs across restarts and event orders)."""
    out: list[tuple[GpuRef, GpuStateClass, list[GpuRef]]] = []
    for state, refs in cluster.live_states():
        usable = sorted((r for r in refs if gpu_ok is None or gpu_ok(r)), key=lambda r: (r.node, r.gpu_index))
        if usable:
            out.append((usable[0], state, usable))
    out.sort(key=lambda e: (e[0].node, e[0].gpu_index))
    return {state: usable for _, state, usable in out}


def _enumerate(
    policy: PackingPolicy,
    cluster: ClusterState,
    members: dict[GpuStateClass, list[GpuRef]],
    sizes: list[int],
    demand: tuple[int, ...],
    weights: tuple[float, ...],
    deadline: float,
    limit: int,
) -> list[_Completion]:
    out: list[_Completion] = []
    for state in members:
        limit -= _completions(policy, cluster, state, sizes, demand, weights, deadline, limit, out)
    return out


def _free(cluster: ClusterState, at: GpuStateClass, i: int) -> tuple[tuple[int, GpuStateClass], ...]:
    """(start, state after) of each free placement of profile `i` on a GPU in `at`, memoised in the
    cluster's memo across plans: walks reach the same states again and again (about 20,000 lookups
    for a burst of 5 on 200 live states, most of them repeats)."""
    key = (_FREE, at, i)
    hit: tuple[tuple[int, GpuStateClass], ...] | None = cluster.memo.get(key)
    if hit is None:
        profile = at.catalog.profiles[i]
        hit = cluster.memo[key] = tuple(
            (pl.start, cluster.intern_placed(at, profile, pl.start))
            for pl in at.occupancy.free_placements(profile)
        )
    return hit


def _completions(
    policy: PackingPolicy,
    cluster: ClusterState,
    base: GpuStateClass,
    sizes: list[int],
    demand: tuple[int, ...],
    weights: tuple[float, ...],
    deadline: float,
    limit: int,
    out: list[_Completion],
) -> int:
    """Append the cheapest completion of `base` per requests served; return how many completions
    (distinct states after and requests served) were enumerated, at most `limit`."""
    catalog = base.catalog
    profiles = catalog.profiles
    # Per profile index: the size indices it may serve (candidate_profiles' rule for each size).
    serves: dict[int, list[int]] = {}
    index = {id(p): i for i, p in enumerate(profiles)}
    for k, m in enumerate(sizes):
        try:
            chosen = candidate_profiles(profiles, m)
        except ProfileChoiceError:
            continue
        for p in chosen:
            serves.setdefault(index[id(p)], []).append(k)
    if not serves:
        return 0
    rep = GpuState(_REP, catalog, base.occupancy)
    waste = {
        (i, k): policy.waste(rep, profiles[i], DeviceRequest("", sizes[k]))
        for i, ks in serves.items()
        for k in ks
    }
    order = sorted(serves)
    found: set[tuple[int, tuple[int, ...]]] = set()
    # Completions of one state serving the same requests differ only in cost (the memory placed is the same): only the cheapest can be in an optimal solution, so only it is a column.
    cheapest: dict[tuple[int, ...], _Completion] = {}
    seen: set[tuple[int, tuple[int, ...], int]] = set()
    served = [0] * len(sizes)
    picks: list[tuple[int, int, int]] = []

    def walk(at: GpuStateClass, last: int, spent: float) -> None:
        # Instances are added in increasing start order: the MIG placement rules (overlap, compute
        # slices, instance counts, media-engine exclusivity) do not depend on the order, so every
        # legal set of instances is reached, once per assignment of sizes to them. A (state,
        # served, last start) already walked has the same subtree: walked once.
        if time.monotonic() > deadline:
            raise _Budget
        for i in order:
            for start, after in _free(cluster, at, i):
                if start <= last:
                    continue
                for k in serves[i]:
                    if served[k] >= demand[k]:
                        continue
                    served[k] += 1
                    key = tuple(served)
                    picks.append((i, start, k))
                    cost = spent + waste[(i, k)]
                    if (after.sid, key) not in found:
                        found.add((after.sid, key))
                        loss = sum(
                            w * (b - a) for w, b, a in zip(weights, base.vector, after.vector, strict=True)
                        )
                        total = loss + cost
                        kept = cheapest.get(key)
                        if kept is None or total < kept.cost:
                            cheapest[key] = _Completion(base, key, tuple(picks), total)
                        if len(found) > limit or time.monotonic() > deadline:
                            raise _Budget
                    mark = (after.sid, key, start)
                    if mark not in seen:
                        seen.add(mark)
                        walk(after, start, cost)
                    picks.pop()
                    served[k] -= 1

    walk(base, -1, 0.0)
    out.extend(cheapest.values())
    return len(found)


def _solve(
    columns: list[_Completion],
    members: dict[GpuStateClass, list[GpuRef]],
    demand: tuple[int, ...],
    sizes: list[int],
    deadline: float,
) -> list[int] | None:
    """How many GPUs take each completion, optimal in both objectives; None if not proven."""
    if not columns:
        return None
    states = {state.sid: len(refs) for state, refs in members.items()}
    h = quiet_highs()
    # HiGHS's presolve took 2 s of a 2 s solve on a burst over 169 states (every column an integer
    # with its own bound); without it the root LP and cuts solve the same programs in about 0.1 s.
    h.setOptionValue("presolve", "off")
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    n = len(columns)
    for c in columns:
        h.addVar(0.0, float(states[c.state.sid]))
    for j in range(n):
        h.changeColIntegrality(j, highspy.HighsVarType.kInteger)
    by_state: dict[int, list[int]] = {}
    for j, c in enumerate(columns):
        by_state.setdefault(c.state.sid, []).append(j)
    for sid, idx in by_state.items():  # columns' order: by GPU names (`_members`)
        h.addRow(0.0, float(states[sid]), len(idx), idx, [1.0] * len(idx))
    for k, need in enumerate(demand):
        idx = [j for j, c in enumerate(columns) if c.served[k]]
        h.addRow(0.0, float(need), len(idx), idx, [float(columns[j].served[k]) for j in idx])
    placed = [float(sum(s * m for s, m in zip(c.served, sizes, strict=True))) for c in columns]
    value = _run(h, placed, highspy.ObjSense.kMaximize, deadline)
    if value is None:
        return None
    # Integer coefficients: fix the optimum with half a unit of slack against float round-off.
    h.addRow(round(value) - 0.5, highspy.kHighsInf, n, list(range(n)), placed)
    if _run(h, [c.cost for c in columns], highspy.ObjSense.kMinimize, deadline) is None:
        return None
    return [round(v) for v in h.getSolution().col_value]


def _run(h: highspy.Highs, coefs: list[float], sense: highspy.ObjSense, deadline: float) -> float | None:
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    h.changeObjectiveSense(sense)
    h.changeColsCost(len(coefs), list(range(len(coefs))), coefs)
    h.setOptionValue("time_limit", left)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value)


def _assign(
    cluster: ClusterState,
    usable: dict[GpuStateClass, list[GpuRef]],
    requests: Sequence[DeviceRequest],
    sizes: list[int],
    columns: list[_Completion],
    counts: list[int],
) -> list[Choice | None]:
    members = {state.sid: refs for state, refs in usable.items()}
    queues: list[list[int]] = [[] for _ in sizes]
    position = {m: k for k, m in enumerate(sizes)}
    for n, request in enumerate(requests):
        queues[position[request.memory_mib]].append(n)
    taken: dict[int, int] = {}
    out: list[Choice | None] = [None] * len(requests)
    for column, count in zip(columns, counts, strict=True):
        for _ in range(count):
            sid = column.state.sid
            ref = members[sid][taken.get(sid, 0)]
            taken[sid] = taken.get(sid, 0) + 1
            profiles = cluster.gpu(ref).catalog.profiles
            for i, start, k in column.picks:
                n = queues[k].pop(0)
                out[n] = Choice(requests[n].name, ref, profiles[i], start)
    return out


__all__ = ["MAX_COMPLETIONS", "MIN_PODS", "TIME_BUDGET_S", "plain", "plan_burst"]
