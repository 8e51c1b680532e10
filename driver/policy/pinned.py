"""The repacking bound with pinned pods: only movable pods may change GPU or placement.

`RepackingBound` (bound.py) accepts a pod when every live pod plus it could be re-placed from scratch:
the ceiling for a cluster where every pod may move. When only some pods may be moved (docs/moves.md),
that ceiling is out of reach by construction, so this is the ceiling per movable share: a pod is
accepted when the movable live pods plus it fit in what the non-movable live pods leave, the
non-movable ones keeping the GPU and the MIG placement (profile, start) this bound's own run gave
them. With every pod movable it is `RepackingBound`; with none it is an online bound that never
re-places a running pod but may put the new one in any legal free placement of any GPU.

Decided exactly like bound.py. A GPU whose pinned instances are P can hold any set of instances that
extends P within one of its model's maximal concrete layouts L >= P (every valid set extends to a
maximal one); what movable and new pods may use is L - P. GPUs of one catalog with the same P are one
`ModelGroup` whose layouts are the memories of each distinct L - P, so the same program (the exact
`FitProgram`, or `benchmarks/packing/mip.py`'s HiGHS one) decides the movable demand by Hall's
condition on those groups, and its answer is mapped back to a concrete L per GPU.

Where pods go while nobody moves. A pod is first placed by a placement policy (flexmig's
`PackingPolicy` unless told otherwise) on the live instances as they are; only if it finds nothing
does the program run. The program alone would put a pod anywhere its witness has room (a 4 GB
request in a free 7g.40gb, say), which costs nothing when every pod may move but pins a non-movable
pod badly for the rest of the run. So with no pod movable this bound re-places nothing and accepts a
pod when the policy places it, or else when any legal placement around the live instances exists
(devices of one pod need not share a node); with some movable, the movable ones are re-placed from
scratch as in bound.py. Where pinned pods sit shapes what can be accepted later, so this is the
ceiling of rules that would pin them where it does, not of every rule; with every pod movable it
does not matter (only the live set does). Moves are free here (no restart, no limit on how many).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from driver.catalog.types import GpuCatalog
from driver.placement.layouts import Layout, enumerate_catalog_layouts
from driver.placement.occupancy import Occupancy, PlacedProfile
from driver.policy.allocator import PackingPolicy, Policy
from driver.policy.bound import FitProgram, ModelGroup, Program
from driver.policy.cluster import ClusterState, catalog_key
from driver.policy.model import DeviceRequest, GpuRef, GpuState

Slot = tuple[int, PlacedProfile]  # (GPU position, instance)
ProgramFactory = Callable[[Sequence[ModelGroup]], Program]


@dataclass(slots=True)
class _Gpu:
    ref: GpuRef
    catalog: GpuCatalog
    kind: object  # catalog key: GPUs of one kind share layouts and option tables
    layouts: tuple[Layout, ...]
    pinned: set[PlacedProfile] = field(default_factory=set)  # held by non-movable pods
    held: set[PlacedProfile] = field(default_factory=set)  # held by any pod (pinned included)


@dataclass(slots=True)
class _Pod:
    sizes: tuple[int, ...]
    movable: bool
    slots: list[Slot]


class PinnedBound:
    """Admits a pod when the movable live pods plus it fit around the non-movable ones, which stay put."""

    name = "pinned-repacking-bound"

    def __init__(
        self,
        gpus: Iterable[tuple[GpuRef, GpuCatalog]],
        program: ProgramFactory = FitProgram,
        policy: Policy | None = None,
    ) -> None:
        self._program = program
        self._policy = policy if policy is not None else PackingPolicy()
        by_kind: dict[object, tuple[Layout, ...]] = {}
        self._gpus: list[_Gpu] = []
        for ref, catalog in gpus:
            kind = catalog_key(catalog)
            if kind not in by_kind:
                by_kind[kind] = tuple(enumerate_catalog_layouts(catalog))
            self._gpus.append(_Gpu(ref, catalog, kind, by_kind[kind]))
        self._position = {g.ref: n for n, g in enumerate(self._gpus)}
        self._cluster = self._state()
        # (kind, pinned) -> memories of L - P (sorted) -> one concrete L >= P with those free memories
        self._options: dict[tuple[object, frozenset[PlacedProfile]], dict[tuple[int, ...], Layout]] = {}
        self._pods: dict[str, _Pod] = {}
        self.programs_run = 0
        self.replaced = 0  # movable live pods that changed GPU or placement at a re-solve

    def placement(self, pod: str) -> tuple[Slot, ...]:
        """Where the live pod's devices are now (GPU position and instance), largest request first."""
        return tuple(self._pods[pod].slots)

    def admit(self, pod: str, sizes: Sequence[int], movable: bool) -> bool:
        if pod in self._pods:
            raise ValueError(f"pod {pod!r} is already admitted")
        ordered = tuple(sorted(sizes, reverse=True))
        requests = [DeviceRequest(f"d{i}", s) for i, s in enumerate(ordered)]
        placed = self._policy.place(self._cluster, requests)
        if placed.ok:
            self._cluster.commit(placed.choices)
            slots = [(self._position[c.gpu], PlacedProfile(c.profile, c.start)) for c in placed.choices]
            self._hold(pod, _Pod(ordered, movable, slots))
            return True
        demand = [s for p in self._pods.values() if p.movable for s in p.sizes] + list(ordered)
        groups, members = self._groups()
        self.programs_run += 1
        solved = self._program(groups).solve(demand)
        if solved is None:
            return False
        self._rebuild(members, solved, pod, _Pod(ordered, movable, []))
        return True

    def release(self, pod: str) -> None:
        gone = self._pods.pop(pod)
        for position, inst in gone.slots:
            gpu = self._gpus[position]
            gpu.held.discard(inst)
            gpu.pinned.discard(inst)
            self._cluster.release(gpu.ref, inst.profile, inst.start)

    def _state(self) -> ClusterState:
        return ClusterState(
            GpuState(g.ref, g.catalog, Occupancy.for_catalog(g.catalog, g.held)) for g in self._gpus
        )

    def _hold(self, name: str, pod: _Pod) -> None:
        self._pods[name] = pod
        for position, inst in pod.slots:
            self._gpus[position].held.add(inst)
            if not pod.movable:
                self._gpus[position].pinned.add(inst)

    def _smallest_free(self, layouts: Sequence[tuple[PlacedProfile, ...]], size: int) -> Slot | None:
        """The smallest instance of the witness layouts that serves `size` and nobody holds."""
        best: Slot | None = None
        for position, (gpu, layout) in enumerate(zip(self._gpus, layouts, strict=True)):
            for inst in layout:
                memory = inst.profile.memory_mib
                if inst in gpu.held or memory < size:
                    continue
                if best is None or memory < best[1].profile.memory_mib:
                    best = (position, inst)
        return best

    def _options_for(self, gpu: _Gpu) -> dict[tuple[int, ...], Layout]:
        key = (gpu.kind, frozenset(gpu.pinned))
        found = self._options.get(key)
        if found is None:
            found = {}
            for layout in gpu.layouts:
                instances = set(layout.instances)
                if gpu.pinned <= instances:
                    free = tuple(sorted(i.profile.memory_mib for i in instances - gpu.pinned))
                    found.setdefault(free, layout)
            # The pinned instances are a valid set, so at least one maximal layout extends them.
            assert found, "pinned instances fit no maximal layout"
            self._options[key] = found
        return found

    def _groups(self) -> tuple[list[ModelGroup], list[list[int]]]:
        """GPUs of one kind with the same pinned instances are one group (the program's counts)."""
        index: dict[tuple[object, frozenset[PlacedProfile]], int] = {}
        members: list[list[int]] = []
        groups: list[ModelGroup] = []
        for position, gpu in enumerate(self._gpus):
            key = (gpu.kind, frozenset(gpu.pinned))
            if key not in index:
                index[key] = len(groups)
                groups.append(ModelGroup(0, tuple(sorted(self._options_for(gpu)))))
                members.append([])
            groups[index[key]].count += 1
            members[index[key]].append(position)
        return groups, members

    def _rebuild(
        self,
        members: Sequence[Sequence[int]],
        solved: Sequence[Sequence[int]],
        name: str,
        new: _Pod,
    ) -> None:
        # The program answers per GPU, groups in order and `count` GPUs each; an empty answer is a GPU
        # the solution does not use, which keeps its pinned instances in any L >= P (the first).
        answers = iter(solved)
        layouts: list[tuple[PlacedProfile, ...]] = [() for _ in self._gpus]
        for positions in members:
            for position in positions:
                gpu = self._gpus[position]
                options = self._options_for(gpu)
                free = tuple(sorted(next(answers)))
                layouts[position] = (options[free] if free else next(iter(options.values()))).instances
                gpu.held = set(gpu.pinned)
        before = {n: list(p.slots) for n, p in self._pods.items() if p.movable}
        for p in before:
            self._pods[p].slots = []
        self._pods[name] = new
        pending = sorted(
            ((s, n) for n, p in self._pods.items() if p.movable or n == name for s in p.sizes),
            key=lambda item: -item[0],
        )
        for size, owner in pending:
            got = self._smallest_free(layouts, size)
            # Hall's condition held for the movable demand on L - P, and largest-first matching never
            # blocks a smaller request (whatever a larger one could use, a smaller one could too).
            assert got is not None, "pinned witness does not match its own demand"
            self._pods[owner].slots.append(got)
            self._gpus[got[0]].held.add(got[1])
        if not new.movable:
            for position, inst in new.slots:
                self._gpus[position].pinned.add(inst)
        self._cluster = self._state()
        self.replaced += sum(1 for n, slots in before.items() if _same(slots) != _same(self._pods[n].slots))


def _same(slots: Iterable[Slot]) -> list[tuple[int, str, int]]:
    """A pod's slots in a comparable form (its devices' order does not matter)."""
    return sorted((position, inst.profile.name, inst.start) for position, inst in slots)


__all__ = ["PinnedBound", "ProgramFactory", "Slot"]
