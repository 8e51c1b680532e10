"""The policy's inputs and outputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from driver.catalog.types import GpuCatalog, MigProfile
from driver.placement.occupancy import Occupancy


@dataclass(frozen=True, slots=True)
class GpuRef:
    node: str
    gpu_index: int

    def __str__(self) -> str:
        return f"{self.node}/gpu-{self.gpu_index}"


@dataclass(slots=True)
class GpuState:
    """One GPU as the allocator sees it: what it offers and what is already placed on it."""

    ref: GpuRef
    catalog: GpuCatalog
    occupancy: Occupancy
    whole_gpu_taken: bool = False  # the whole-GPU device is allocated: no MIG instance fits

    @property
    def model(self) -> str:
        return self.catalog.model


DeviceFilter = Callable[[GpuRef], Set[tuple[str, int]] | None]
"""Which (profile name, placement start) pairs of a GPU a request may use; None = no restriction.

The controller builds one from the claim's CEL selectors (only devices that are published and match
may be allocated); the policy stays free of Kubernetes and CEL.
"""


_NOTHING: frozenset[tuple[str, int]] = frozenset()


class AllowedTable:
    """A `DeviceFilter` backed by a fixed table: GPU -> allowed pairs (absent: none), optionally only on
    nodes `node_ok` accepts (asked once per node).

    The table must not change while the filter is in use. The policy recognises this filter and keeps
    its GPUs grouped by (state, allowed set) across decisions, instead of asking for every GPU.
    """

    __slots__ = ("_verdicts", "node_ok", "table")

    def __init__(
        self,
        table: Mapping[GpuRef, frozenset[tuple[str, int]]],
        node_ok: Callable[[str], bool] | None = None,
    ) -> None:
        self.table = table
        self.node_ok = node_ok
        self._verdicts: dict[str, bool] = {}

    def node_allowed(self, node: str) -> bool:
        if self.node_ok is None:
            return True
        ok = self._verdicts.get(node)
        if ok is None:
            ok = self._verdicts[node] = self.node_ok(node)
        return ok

    def __call__(self, ref: GpuRef) -> frozenset[tuple[str, int]]:
        if self.node_ok is not None and not self.node_allowed(ref.node):
            return _NOTHING
        return self.table.get(ref, _NOTHING)


@dataclass(frozen=True, slots=True)
class EndHint:
    """When a pod is expected to end: `end` in absolute seconds (any clock the whole cluster state
    shares), and `remaining`, the seconds from the decision to `end` (> 0), which normalises how
    long placing it would keep a GPU from becoming whole (see `PackingPolicy.colocation`)."""

    end: float
    remaining: float

    def __post_init__(self) -> None:
        if not self.remaining > 0:
            raise ValueError(f"EndHint.remaining must be > 0, got {self.remaining}")


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One device of a pod: a MIG instance with at least `memory_mib`, or a pinned/preferred profile.

    `models` restricts the GPU models (catalog model keys) that may serve it; empty means any.
    `device_filter`, when set, further restricts the (profile, start) pairs per GPU; an empty set
    means the GPU cannot serve the request at all. `end_hint`, when set, is the pod's expected end:
    the packing policy then prefers GPUs whose hinted instances end no earlier (co-location).
    """

    name: str
    memory_mib: int
    preferred_profile: str | None = None
    pinned_profile: str | None = None
    models: frozenset[str] = field(default_factory=frozenset)
    device_filter: DeviceFilter | None = field(default=None, compare=False)
    end_hint: EndHint | None = None

    def allowed(self, ref: GpuRef) -> Set[tuple[str, int]] | None:
        return None if self.device_filter is None else self.device_filter(ref)

    def __post_init__(self) -> None:
        if self.memory_mib < 0:
            raise ValueError(f"request {self.name!r}: memory_mib must be >= 0, got {self.memory_mib}")


@dataclass(frozen=True, slots=True)
class Choice:
    request: str
    gpu: GpuRef
    profile: MigProfile
    start: int

    def __str__(self) -> str:
        return f"{self.request} -> {self.gpu} {self.profile.name}@{self.start}"


class ShortReason(StrEnum):
    """Why a pod could not be placed, as surfaced on the pod (most specific first)."""

    NO_PROFILE_BIG_ENOUGH = "NoProfileBigEnough"  # no GPU model has an allowed profile that large
    NO_FREE_PLACEMENT = "AllPlacementsTaken"  # every GPU that could serve it is full
    FRAGMENTED = "Fragmented"  # enough free slices exist, but not in a legal placement
    NO_SINGLE_NODE = "NoSingleNodeFits"  # each device fits somewhere, but not all on one node


class OnGpu(Protocol):
    """What a policy chose for one request: it names the GPU."""

    @property
    def gpu(self) -> GpuRef: ...


C = TypeVar("C", bound=OnGpu)


@dataclass(frozen=True, slots=True)
class PlacementOf(Generic[C]):
    """A policy's answer: one choice per request, all on one node, or why not (`reason`, `message`).

    One shape for the three kinds of device (MIG choices, whole GPUs, shares), so the controller reads
    every answer alike."""

    choices: tuple[C, ...]
    reason: ShortReason | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def node(self) -> str | None:
        return self.choices[0].gpu.node if self.choices else None


@dataclass(frozen=True, slots=True)
class Placement(PlacementOf[Choice]):
    """The MIG policy's answer: one MIG device (profile at a start) per device request."""
