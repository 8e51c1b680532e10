"""Whole GPUs in a pod's plan: on one node with the pod's MIG devices and shares, all or nothing.

The whole-GPU policy (driver/policy/whole.py, called through driver/policy/placer.py) ranks the nodes
where every whole GPU of the pod finds an idle GPU. Combined with other kinds of devices:
- shares: only nodes where the shares fit as well are kept, and the shares go to the chosen node;
- MIG devices: the MIG policy chooses the node among those, as it does for shares, and the whole GPUs
  take idle GPUs of that node that the MIG devices left alone. When the MIG devices took GPUs the whole
  ones needed, the whole GPUs are reserved first on that node and the MIG devices placed on its other
  GPUs; then the same on the other feasible nodes, best whole-GPU key first (at most
  `MAX_NODE_RETRIES` nodes).
The MIG policy never places an instance on a GPU whose whole device is allocated (its state is
"taken"), and a GPU holding any MIG instance is not idle, so the two kinds exclude each other on a GPU
whoever allocated them. Constraints hold over whole GPUs too (their attributes are their devices');
a violated `matchAttribute` is retried by pinning the pod's MIG devices and shares only: the whole
GPUs keep the policy's pick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from controller.claims.constraints import ConstraintChecker, Plan, Slot
from controller.shared.shares import AltKind
from controller.state.inventory import Inventory, PublishedDevice
from driver.policy.cluster import ClusterState
from driver.policy.model import AllowedTable, Choice, DeviceRequest, GpuRef, ShortReason
from driver.policy.placer import Placer
from driver.policy.sharemodel import SharedGpuState, SharePick, ShareRequest
from driver.policy.wholemodel import IdleGpus, WholePick, WholeRequest

MAX_NODE_RETRIES = 8


class WholePlan(Plan):
    """A plan that also holds whole GPUs (request name -> pick)."""

    __slots__ = ("whole",)

    def __init__(
        self, choices: Sequence[Choice], picks: Sequence[SharePick], wholes: Sequence[WholePick]
    ) -> None:
        super().__init__(choices, picks)
        self.whole = {p.request: p for p in wholes}

    @property
    def node(self) -> str | None:
        for p in self.whole.values():
            return p.gpu.node
        return super().node


def whole_device(inventory: Inventory, ref: GpuRef) -> PublishedDevice:
    gpu = inventory.gpus[ref]
    assert gpu.whole_device is not None
    return inventory.pools[gpu.pool].devices[gpu.whole_device]


class Checker(ConstraintChecker):
    """Constraints over plans with whole GPUs too (a whole GPU's attributes are its device's)."""

    def device(self, slot: Slot, plan: Plan) -> PublishedDevice:
        if slot.kind is AltKind.WHOLE:
            assert isinstance(plan, WholePlan)
            return whole_device(self.inventory, plan.whole[slot.policy_name].gpu)
        return super().device(slot, plan)


@dataclass(frozen=True, slots=True)
class Unplaced:
    reason: str
    message: str


def _all_pairs(cluster: ClusterState, ref: GpuRef) -> frozenset[tuple[str, int]]:
    catalog = cluster.gpu(ref).catalog
    return frozenset((p.name, pl.start) for p in catalog.profiles for pl in p.placements)


def _on_gpus(
    cluster: ClusterState, request: DeviceRequest, node: str, reserved: Set[GpuRef]
) -> DeviceRequest:
    """The request admitted only on `node`'s GPUs outside `reserved` (an AllowedTable, policy-indexed)."""
    table: dict[GpuRef, frozenset[tuple[str, int]]] = {}
    for ref in cluster.node_refs(node):
        if ref in reserved:
            continue
        allowed = request.allowed(ref)
        pairs = _all_pairs(cluster, ref) if allowed is None else frozenset(allowed)
        if pairs:
            table[ref] = pairs
    return dataclasses.replace(request, device_filter=AllowedTable(table))


class WholePlacer:
    """Places one combination's MIG devices, shares and whole GPUs on one node (see the module rule)."""

    def __init__(
        self,
        placer: Placer,
        cluster: ClusterState,
        idle: IdleGpus,
        states: Mapping[GpuRef, SharedGpuState],
    ) -> None:
        self.placer = placer
        self.cluster = cluster
        self.idle = idle
        self.states = states

    def place(
        self,
        mig_requests: list[DeviceRequest],
        share_requests: list[ShareRequest],
        whole_requests: list[WholeRequest],
        node_ok: Callable[[str], bool] | None,
    ) -> WholePlan | Unplaced:
        feasible = self.placer.whole_nodes(self.idle, whole_requests, node_ok)
        if share_requests and feasible:
            both = set.intersection(*({ref.node for ref in r.amounts} for r in share_requests))
            fits = self.placer.share_nodes(self.states, share_requests, (n for n in feasible if n in both))
            feasible = {n: hit for n, hit in feasible.items() if n in fits}
        if not feasible:
            return self._explain(share_requests, whole_requests, node_ok)
        ranked = sorted(feasible, key=lambda n: feasible[n][0])
        if not mig_requests:
            return self._plan(ranked[0], (), feasible[ranked[0]][1], share_requests)
        restricted = [ConstraintChecker.restrict(r, set(feasible)) for r in mig_requests]
        placement = self.placer.mig(self.cluster, restricted)
        if not placement.ok:
            alone = self.placer.mig(self.cluster, mig_requests)
            if alone.ok:
                return Unplaced(
                    ShortReason.NO_SINGLE_NODE,
                    f"the MIG devices fit (e.g. on {alone.node}) and the whole GPUs fit on "
                    f"{', '.join(ranked[:3])}, but no single node takes both",
                )
            return Unplaced(str(placement.reason), placement.message)
        node = placement.node
        assert node is not None
        hit = self.placer.whole_on(
            self.idle, whole_requests, node, exclude={c.gpu for c in placement.choices}
        )
        if hit is not None:
            return self._plan(node, placement.choices, hit[1], share_requests)
        # The MIG devices took idle GPUs the whole ones need: whole GPUs first, MIG devices on the rest.
        for candidate in ([node] + [n for n in ranked if n != node])[:MAX_NODE_RETRIES]:
            picks = feasible[candidate][1]
            reserved = {p.gpu for p in picks}
            again = self.placer.mig(
                self.cluster, [_on_gpus(self.cluster, r, candidate, reserved) for r in mig_requests]
            )
            if again.ok:
                return self._plan(candidate, again.choices, picks, share_requests)
        return Unplaced(
            ShortReason.NO_SINGLE_NODE,
            f"the whole GPUs fit on {', '.join(ranked[:3])} and the MIG devices fit there too, but no "
            "node has enough GPUs for both (a whole GPU takes a GPU no MIG instance uses)",
        )

    def _plan(
        self,
        node: str,
        choices: Sequence[Choice],
        wholes: Sequence[WholePick],
        share_requests: list[ShareRequest],
    ) -> WholePlan | Unplaced:
        picks: Sequence[SharePick] = ()
        if share_requests:
            hit = self.placer.shares_on(self.states, share_requests, node)
            if hit is None:  # cannot happen: the node was feasible for the shares
                return Unplaced(ShortReason.NO_SINGLE_NODE, "shares no longer fit the chosen node")
            picks = hit[1]
        return WholePlan(choices, picks, wholes)

    def _explain(
        self,
        share_requests: list[ShareRequest],
        whole_requests: list[WholeRequest],
        node_ok: Callable[[str], bool] | None,
    ) -> Unplaced:
        why = self.placer.explain_whole(self.idle, whole_requests, node_ok)
        if why.reason is ShortReason.NO_FREE_PLACEMENT or not share_requests:
            return Unplaced(str(why.reason), why.message)
        if self.placer.whole_nodes(self.idle, whole_requests, node_ok):  # each kind alone fits
            shares = self.placer.shares(self.states, share_requests, node_ok)
            if not shares.ok:
                return Unplaced(str(shares.reason), shares.message)
            return Unplaced(
                ShortReason.NO_SINGLE_NODE,
                "the whole GPUs fit and the shares fit, but no single node takes both",
            )
        return Unplaced(str(why.reason), why.message)
