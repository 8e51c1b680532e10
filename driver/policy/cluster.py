"""A mutable snapshot of every GPU the allocator may use, with cluster-wide capacity kept current.

Besides the capacity totals, the state keeps GPUs grouped by *state*: (catalog, occupancy) up to
identity. GPUs in one state offer exactly the same candidates with the same capacity effects, so the
policy evaluates each distinct state once per decision instead of once per GPU (see allocator.py),
and per state the nodes holding it and the states it shares a node with (see pairsearch.py).

It also keeps, per GPU, the expected end of every instance committed with one (`commit(...,
expected_end=)`): lifetime hints. They are deliberately not part of a GPU's state: the policy's
co-location term depends only on a GPU's latest hinted end, is the same for every candidate on that
GPU, and is added per GPU on top of the state's price (see `PackingPolicy.colocation`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from typing import Any

from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.occupancy import Occupancy
from driver.policy.capacity import (
    CapacityModel,
    CapacityVector,
    add,
    occupancy_signature,
    request_classes,
    sub,
)
from driver.policy.model import Choice, GpuRef, GpuState

CatalogKey = tuple[Any, ...]
StateKey = tuple[int, int, int, tuple[tuple[int, int], ...]]

_MAX_LOG = 65536
_MAX_TABLES = 32

# Bound on interned states that no GPU is in (after-states the policy explored); cleared past this.
_MAX_STATES = 32768

_NO_NODES: Mapping[str, int] = {}
_NO_PAIRS: Mapping[int, int] = {}


def catalog_key(catalog: GpuCatalog) -> CatalogKey:
    """Everything of a catalog that candidates, capacity and waste depend on (not its identity)."""
    return (
        catalog.model,
        catalog.memory_slices,
        catalog.compute_slices,
        catalog.gpu.memory_total_mib,
        catalog.profiles,
        tuple(p.gi_profile_id for p in catalog.all_profiles),
    )


class GpuStateClass:
    """One interned state: a representative catalog and occupancy, and its capacity vector."""

    __slots__ = ("catalog", "cid", "free", "key", "occupancy", "sid", "vector")

    def __init__(
        self, sid: int, key: StateKey, catalog: GpuCatalog, occupancy: Occupancy, vector: CapacityVector
    ):
        self.sid = sid
        self.key = key  # (catalog id, memory slices, compute slices, occupancy signature)
        self.cid = key[0]
        self.catalog = catalog
        self.occupancy = occupancy
        self.free = occupancy.free_memory_slices
        self.vector = vector


class _TableGroups:
    __slots__ = ("generation", "groups", "key_of", "position", "table")

    def __init__(self, table: Mapping[GpuRef, Set[tuple[str, int]]], generation: int, position: int) -> None:
        self.table = table
        self.generation = generation
        self.position = position
        self.groups: dict[tuple[GpuStateClass, frozenset[tuple[str, int]]], dict[GpuRef, None]] = {}
        self.key_of: dict[GpuRef, tuple[GpuStateClass, frozenset[tuple[str, int]]]] = {}

    def add(self, ref: GpuRef, state: GpuStateClass | None, allowed: Set[tuple[str, int]]) -> None:
        if state is None:
            return
        frozen = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
        key = (state, frozen)
        self.groups.setdefault(key, {})[ref] = None
        self.key_of[ref] = key

    def remove(self, ref: GpuRef) -> None:
        key = self.key_of.pop(ref, None)
        if key is not None:
            members = self.groups[key]
            del members[ref]
            if not members:
                del self.groups[key]


class ClusterState:
    def __init__(self, gpus: Iterable[GpuState]) -> None:
        self._gpus: dict[GpuRef, GpuState] = {}
        self._by_node: dict[str, list[GpuRef]] = defaultdict(list)
        for gpu in gpus:
            if gpu.ref in self._gpus:
                raise ValueError(f"GPU {gpu.ref} listed twice")
            self._gpus[gpu.ref] = gpu
            self._by_node[gpu.ref.node].append(gpu.ref)
        for refs in self._by_node.values():
            refs.sort(key=lambda r: r.gpu_index)
        self._node_names = sorted(self._by_node)
        self._node_states: dict[str, list[GpuState]] = {
            n: [self._gpus[r] for r in rs] for n, rs in self._by_node.items()
        }
        self.capacity = CapacityModel(request_classes(g.catalog for g in self._gpus.values()))
        self._vectors: dict[GpuRef, CapacityVector] = {}
        self.total: CapacityVector = (0,) * len(self.capacity.classes)
        # State index: catalog keys -> ids, (catalog id, occupancy) -> interned state, state -> GPUs in it.
        self._catalog_ids: dict[CatalogKey, int] = {}
        self._gpu_cid: dict[GpuRef, int] = {}
        self._states: dict[StateKey, GpuStateClass] = {}
        self._state_list: list[GpuStateClass] = []
        self._gpu_state: dict[GpuRef, GpuStateClass | None] = {}
        # The same per node, in GPU index order (`node_refs`), so a node's scan hashes no GpuRef.
        self._slot: dict[GpuRef, int] = {r: i for rs in self._by_node.values() for i, r in enumerate(rs)}
        self._node_classes: dict[str, list[GpuStateClass | None]] = {
            n: [None] * len(rs) for n, rs in self._by_node.items()
        }
        self._members: dict[int, dict[GpuRef, None]] = {}
        # Per state: node -> how many of its GPUs are in it (the two-device search's node index).
        self._state_nodes: dict[int, dict[str, int]] = {}
        # state -> state -> how many ordered pairs of distinct GPUs of one node are in those states.
        self._pairs: dict[int, dict[int, int]] = {}
        # Lifetime hints: GPU -> instance start -> expected end (seconds); only GPUs holding a hinted
        # instance are keys, so an empty dict means no hint is in play anywhere.
        self._ends: dict[GpuRef, dict[int, float]] = {}
        self.memo: dict[Any, Any] = {}  # the policy's weight-independent evaluations, keyed by state
        # GPUs whose state changed, in order, so table groupings (below) catch up without a full scan;
        # `_generation` changes whenever the log is cut or states are re-interned (groupings rebuild).
        self._log: list[GpuRef] = []
        self._generation = 0
        self._tables: dict[int, _TableGroups] = {}
        for ref, gpu in self._gpus.items():
            vec = self.capacity.vector(gpu.catalog, gpu.occupancy, gpu.whole_gpu_taken)
            self._vectors[ref] = vec
            self.total = add(self.total, vec)
            key = catalog_key(gpu.catalog)
            self._gpu_cid[ref] = self._catalog_ids.setdefault(key, len(self._catalog_ids))
            self._index(ref, gpu)

    def gpu(self, ref: GpuRef) -> GpuState:
        return self._gpus[ref]

    def has(self, ref: GpuRef) -> bool:
        """Whether the GPU is in the MIG state (GPUs publishing no MIG device are not)."""
        return ref in self._gpus

    def gpus(self) -> list[GpuState]:
        return list(self._gpus.values())

    def nodes(self) -> list[str]:
        return list(self._node_names)

    def node_gpus(self, node: str) -> list[GpuState]:
        return list(self._node_states.get(node, ()))

    def node_refs(self, node: str) -> list[GpuRef]:
        """The node's GPUs by index (do not modify)."""
        return self._by_node.get(node, [])

    def vector(self, ref: GpuRef) -> CapacityVector:
        return self._vectors[ref]

    def set_occupancy(self, ref: GpuRef, occupancy: Occupancy, whole_gpu_taken: bool | None = None) -> None:
        gpu = self._gpus[ref]
        gpu.occupancy = occupancy
        ends = self._ends.get(ref)
        if ends is not None:
            # Hints of instances this occupancy no longer has go with them.
            starts = {i.start for i in occupancy.instances}
            for start in [s for s in ends if s not in starts]:
                del ends[start]
            if not ends:
                del self._ends[ref]
        if whole_gpu_taken is not None:
            gpu.whole_gpu_taken = whole_gpu_taken
        new = self.capacity.vector(gpu.catalog, occupancy, gpu.whole_gpu_taken)
        self.total = add(sub(self.total, self._vectors[ref]), new)
        self._vectors[ref] = new
        self._index(ref, gpu)

    def commit(self, choices: Iterable[Choice], expected_end: float | None = None) -> None:
        """Place every choice; with `expected_end` (seconds), remember it as those instances' end."""
        for choice in choices:
            gpu = self._gpus[choice.gpu]
            self.set_occupancy(choice.gpu, gpu.occupancy.place(choice.profile, choice.start))
            if expected_end is not None:
                self._ends.setdefault(choice.gpu, {})[choice.start] = expected_end

    def release(self, ref: GpuRef, profile: MigProfile, start: int) -> None:
        gpu = self._gpus[ref]
        self.set_occupancy(ref, gpu.occupancy.remove(profile, start))

    def set_expected_end(self, ref: GpuRef, start: int, expected_end: float | None) -> None:
        """Set (None: forget) the expected end of the instance at `start` on `ref`, which must exist."""
        if not any(i.start == start for i in self._gpus[ref].occupancy.instances):
            raise ValueError(f"no instance at start {start} on {ref}")
        if expected_end is None:
            ends = self._ends.get(ref)
            if ends is not None:
                ends.pop(start, None)
                if not ends:
                    del self._ends[ref]
        else:
            self._ends.setdefault(ref, {})[start] = expected_end

    @property
    def hinted(self) -> bool:
        """Whether any GPU holds an instance with an expected end."""
        return bool(self._ends)

    def latest_end(self, ref: GpuRef) -> float | None:
        """The latest expected end among the GPU's hinted instances; None when it has none."""
        ends = self._ends.get(ref)
        return max(ends.values()) if ends else None

    # --- state index (for the policy) --------------------------------------------------------------

    def state_of(self, ref: GpuRef) -> GpuStateClass | None:
        """The interned state of a GPU; None while its whole-GPU device is taken."""
        return self._gpu_state[ref]

    def node_state_classes(self, node: str) -> list[GpuStateClass | None]:
        """`state_of` for each of `node_refs(node)`, in that order (do not modify)."""
        return self._node_classes[node]

    def live_states(self) -> list[tuple[GpuStateClass, dict[GpuRef, None]]]:
        """Every state some GPU is in, with those GPUs (in no particular order)."""
        return [(self._state_list[sid], refs) for sid, refs in self._members.items()]

    def state_nodes(self, state: GpuStateClass) -> Mapping[str, int]:
        """Nodes with a GPU in `state` (a live one), each with how many (do not modify)."""
        return self._state_nodes.get(state.sid, _NO_NODES)

    def colocated(self, state: GpuStateClass) -> Mapping[int, int]:
        """State ids some GPU is in on a node where another GPU is in `state` (do not modify)."""
        return self._pairs.get(state.sid, _NO_PAIRS)

    def intern(self, cid: int, catalog: GpuCatalog, occupancy: Occupancy) -> GpuStateClass:
        key: StateKey = (
            cid,
            occupancy.memory_slices,
            occupancy.compute_slices,
            occupancy_signature(occupancy),
        )
        state = self._states.get(key)
        if state is None:
            vec = self.capacity.vector(catalog, occupancy)
            state = GpuStateClass(len(self._state_list), key, catalog, occupancy, vec)
            self._states[key] = state
            self._state_list.append(state)
        return state

    def intern_placed(self, state: GpuStateClass, profile: MigProfile, start: int) -> GpuStateClass:
        """`intern` of `state`'s occupancy with `profile@start` added (a free placement of it), building
        the new occupancy only when that state is not interned yet."""
        cid, memory, compute, signature = state.key
        key: StateKey = (cid, memory, compute, tuple(sorted((*signature, (profile.gi_profile_id, start)))))
        hit = self._states.get(key)
        if hit is not None:
            return hit
        return self.intern(cid, state.catalog, state.occupancy.place(profile, start))

    def trim(self) -> None:
        """Bound memory: past `_MAX_STATES` interned states, forget them all (and the policy's memo).

        Called between decisions only: state objects a decision holds stay valid, but ids are reused.
        """
        if len(self._state_list) >= _MAX_STATES:
            self._reset_states()

    def table_groups(
        self, table: Mapping[GpuRef, Set[tuple[str, int]]]
    ) -> dict[tuple[GpuStateClass, frozenset[tuple[str, int]]], dict[GpuRef, None]]:
        """GPUs listed in `table` with a non-empty allowed set, grouped by (state, allowed set).

        Kept current across calls from the change log; `table` must not change while it is cached
        (it is held, so its id stays unique).
        """
        entry = self._tables.get(id(table))
        if entry is None or entry.table is not table or entry.generation != self._generation:
            if entry is None and len(self._tables) >= _MAX_TABLES:
                del self._tables[next(iter(self._tables))]
            entry = _TableGroups(table, self._generation, len(self._log))
            for ref, allowed in table.items():
                if allowed and ref in self._gpus:
                    entry.add(ref, self._gpu_state[ref], allowed)
            self._tables[id(table)] = entry
            return entry.groups
        log = self._log
        if entry.position < len(log):
            for ref in set(log[entry.position :]):
                pairs = table.get(ref)
                if pairs:
                    entry.remove(ref)
                    entry.add(ref, self._gpu_state[ref], pairs)
            entry.position = len(log)
        return entry.groups

    def _index(self, ref: GpuRef, gpu: GpuState) -> None:
        if len(self._state_list) >= _MAX_STATES:
            self._reset_states()  # re-indexes the GPUs indexed so far from their current occupancy
        if len(self._log) >= _MAX_LOG:
            self._log.clear()
            self._generation += 1
        self._log.append(ref)
        old = self._gpu_state.get(ref)
        if old is not None:
            self._drop_member(ref, old)
        if gpu.whole_gpu_taken:
            self._set_state(ref, None)
            return
        state = self.intern(self._gpu_cid[ref], gpu.catalog, gpu.occupancy)
        self._set_state(ref, state)
        self._add_member(ref, state)

    def _add_member(self, ref: GpuRef, state: GpuStateClass) -> None:
        """Index `ref` (already `_set_state` to `state`) under its state, node and node neighbours."""
        self._members.setdefault(state.sid, {})[ref] = None
        counts = self._state_nodes.setdefault(state.sid, {})
        counts[ref.node] = counts.get(ref.node, 0) + 1
        self._pair(ref, state, 1)

    def _drop_member(self, ref: GpuRef, state: GpuStateClass) -> None:
        """Undo `_add_member(ref, state)`."""
        members = self._members[state.sid]
        del members[ref]
        if not members:
            del self._members[state.sid]
        counts = self._state_nodes[state.sid]
        left = counts[ref.node] - 1
        if left:
            counts[ref.node] = left
        else:
            del counts[ref.node]
            if not counts:
                del self._state_nodes[state.sid]
        self._pair(ref, state, -1)

    def _pair(self, ref: GpuRef, state: GpuStateClass, delta: int) -> None:
        """Count (both ways) the pairs `ref` in `state` forms with the other live GPUs of its node."""
        pairs = self._pairs
        own = self._slot[ref]
        for slot, other in enumerate(self._node_classes[ref.node]):
            if other is None or slot == own:
                continue
            for a, b in ((state.sid, other.sid), (other.sid, state.sid)):
                row = pairs.setdefault(a, {})
                count = row.get(b, 0) + delta
                if count:
                    row[b] = count
                else:
                    del row[b]
                    if not row:
                        del pairs[a]

    def _set_state(self, ref: GpuRef, state: GpuStateClass | None) -> None:
        self._gpu_state[ref] = state
        self._node_classes[ref.node][self._slot[ref]] = state

    def _reset_states(self) -> None:
        """Forget every interned state and the policy's memo; re-intern the GPUs' current states."""
        self._states.clear()
        self._state_list.clear()
        self._members.clear()
        self._state_nodes.clear()
        self._pairs.clear()
        self.memo.clear()
        self._generation += 1
        current = list(self._gpu_state)
        self._gpu_state.clear()
        for ref in current:  # no stale neighbours for `_pair` while re-indexing
            self._set_state(ref, None)
        for ref in current:
            gpu = self._gpus[ref]
            if not gpu.whole_gpu_taken:
                state = self.intern(self._gpu_cid[ref], gpu.catalog, gpu.occupancy)
                self._set_state(ref, state)
                self._add_member(ref, state)
            else:
                self._set_state(ref, None)
