"""The data of HAMi-core share placement: amounts, shareable GPUs, share requests and picks.

Types only, no decision: the controller builds and reads them (its ledger sums `ShareAmount`s per GPU,
its metrics show `SharedGpuState`s), while the rule that places shares is driver/policy/shared.py,
reached from the controller only through driver/policy/placer.py.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Mapping
from dataclasses import dataclass, field

from driver.policy.model import GpuRef, PlacementOf


@dataclass(frozen=True, slots=True)
class ShareAmount:
    """What one share consumes (or a GPU offers): MiB of memory, percent of the SMs, split slots."""

    memory_mib: int
    cores: int
    shares: int = 1

    def __add__(self, other: ShareAmount) -> ShareAmount:
        return ShareAmount(
            self.memory_mib + other.memory_mib, self.cores + other.cores, self.shares + other.shares
        )

    def __sub__(self, other: ShareAmount) -> ShareAmount:
        return ShareAmount(
            self.memory_mib - other.memory_mib, self.cores - other.cores, self.shares - other.shares
        )

    def covers(self, other: ShareAmount) -> bool:
        return (
            self.memory_mib >= other.memory_mib and self.cores >= other.cores and self.shares >= other.shares
        )


ZERO = ShareAmount(0, 0, 0)


@dataclass(frozen=True, slots=True)
class SharedGpuState:
    """A shareable GPU: what it offers (memory MiB, cores = 100, shares = split count) and what is used."""

    ref: GpuRef
    capacity: ShareAmount
    used: ShareAmount = ZERO

    @property
    def free(self) -> ShareAmount:
        return self.capacity - self.used

    def fits(self, amount: ShareAmount) -> bool:
        return self.free.covers(amount)

    def stranded_after(self, amount: ShareAmount) -> int:
        """Free memory nobody can use once `amount` is placed: all of it when no split slot is left."""
        left = self.free - amount
        return left.memory_mib if left.shares <= 0 else 0


NodeOptions = tuple[tuple[GpuRef, ShareAmount], ...]


class ShareOptions(Mapping[GpuRef, ShareAmount]):
    """GPU -> what one share consumes there, indexed by node once.

    Placement looks at one node at a time, and the amounts of a request cover every shareable GPU of
    the cluster: scanning them all per node made placement quadratic in the cluster size. Built once
    per request shape (the controller caches it per inventory), then read per node in O(its GPUs).
    """

    __slots__ = ("_amounts", "_by_node", "largest")

    def __init__(self, amounts: Mapping[GpuRef, ShareAmount]) -> None:
        self._amounts = dict(amounts)
        by_node: dict[str, list[tuple[GpuRef, ShareAmount]]] = {}
        for ref, amount in self._amounts.items():
            by_node.setdefault(ref.node, []).append((ref, amount))
        self._by_node = {node: tuple(pairs) for node, pairs in by_node.items()}
        self.largest = max((a.memory_mib for a in self._amounts.values()), default=0)

    def __getitem__(self, ref: GpuRef) -> ShareAmount:
        return self._amounts[ref]

    def __iter__(self) -> Iterator[GpuRef]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __repr__(self) -> str:
        return f"ShareOptions({self._amounts!r})"

    def on(self, node: str) -> NodeOptions:
        """The GPUs of `node` that may serve the share, with what it consumes on each."""
        return self._by_node.get(node, ())

    def nodes(self) -> KeysView[str]:
        return self._by_node.keys()


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """One share a pod needs: the GPUs that may serve it, each with what the share consumes there.

    `amounts` may be any mapping; it is kept as a `ShareOptions` (reused as is when it already is one).
    """

    name: str
    amounts: Mapping[GpuRef, ShareAmount]
    group: str = ""  # shares of one group never share a GPU
    options: ShareOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        amounts = self.amounts
        options = amounts if isinstance(amounts, ShareOptions) else ShareOptions(amounts)
        object.__setattr__(self, "amounts", options)
        object.__setattr__(self, "options", options)

    def largest(self) -> int:
        return self.options.largest


@dataclass(frozen=True, slots=True)
class SharePick:
    request: str
    gpu: GpuRef
    amount: ShareAmount
    stranded_mib: int  # free memory of that GPU left unusable by this share (no split slot left)


@dataclass(frozen=True, slots=True)
class SharePlacement(PlacementOf[SharePick]):
    """One GPU share per share request."""
