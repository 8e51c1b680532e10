"""Where placement is decided: the one entry point the controller calls for every placement decision.

A pod's devices are of three kinds, each with its own rule, and a burst of pods has an order:

- MIG devices: the MIG policy (driver/policy/allocator.py `PackingPolicy`, or `FirstFitPolicy` with
  `flexmig controller --policy first-fit`) picks node, GPU, profile and placement start (`Placer.mig`);
- shares of hami-core GPUs: best fit, largest first (driver/policy/shared.py; `Placer.shares`,
  `Placer.share_nodes`, `Placer.shares_on`, `Placer.explain_shares`);
- whole GPUs: the idle GPU whose loss costs future MIG placements the least (driver/policy/whole.py;
  `Placer.whole_nodes`, `Placer.whole_on`, `Placer.explain_whole`, priced by `mig_cost`);
- several pending pods: decided largest first, except that pods pending longer than
  `AGE_FIRST_AFTER_S` go first, oldest first (driver/policy/batch.py; `Placer.batch_order`); the
  one-device MIG pods among them placed by an exact plan over the burst (driver/policy/burstplan.py;
  `Placer.plan_burst`), which `Placer.mig` then follows as advice (see there).

The controller (controller/allocation/decide.py and controller/allocation/wholeplan.py combine the
kinds on one node; controller/allocation/loop.py orders the pods) imports placement from this module
only; the import-linter contract `controller-places-through-placer` in pyproject.toml forbids the
controller every other module of driver/policy except the data types (model.py, cluster.py,
sharemodel.py, wholemodel.py). Like the policies, nothing here changes the state it is handed: the
caller commits what it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from driver.policy import burstplan, shared, whole
from driver.policy.allocator import PackingPolicy, Policy
from driver.policy.batch import AGE_FIRST_AFTER_S, PodSize, size_order
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuRef, Placement
from driver.policy.sharemodel import SharedGpuState, SharePick, SharePlacement, ShareRequest
from driver.policy.whole import mig_cost
from driver.policy.wholemodel import IdleGpus, NodeKey, WholePick, WholePlacement, WholeRequest

ShareNodeKey = shared.NodeKey


class Placer:
    """The placement decisions of the controller, with the MIG policy it was given (default: flexmig's)."""

    __slots__ = ("_planned", "policy")

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy: Policy = policy if policy is not None else PackingPolicy()
        self._planned: dict[int, list[Choice]] = {}  # the burst plan's choices, by requested MiB

    @property
    def name(self) -> str:
        return self.policy.name

    # --- MIG devices --------------------------------------------------------------------------------

    def mig(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        """Every MIG device of a pod on one node (node, GPU, profile, start), or why none takes them.

        While a burst plan is held (`plan_burst`), a one-device request asking for memory only (its
        filter aside) takes the first planned choice of its size that is still free in `cluster`
        and that its filter allows; otherwise, or when none is, the policy decides."""
        if self._planned and len(requests) == 1:
            hit = self._from_plan(cluster, requests[0])
            if hit is not None:
                return hit
        return self.policy.place(cluster, requests)

    def plan_burst(self, cluster: ClusterState, sizes: Sequence[PodSize | None]) -> int:
        """Plan the one-device MIG pods of a burst (`sizes`, as `batch_order` takes them) together
        (driver/policy/burstplan.py) and hold the plan for `mig` until `end_burst`; returns how many
        pods it placed (0: no plan, every pod decided by the policy alone).

        Advice, not a reservation: the plan is made on `cluster` as it is now, ignoring the pods'
        device filters; `mig` checks every planned choice against the cluster and the request it is
        asked for, so a choice that pods decided meanwhile took, or that a pod's selectors exclude,
        is passed over. Only `PackingPolicy` plans (first-fit is a baseline; it stays per pod)."""
        self._planned = {}
        policy = self.policy
        if not isinstance(policy, PackingPolicy) or self.burst_candidates(sizes) < burstplan.MIN_PODS:
            return 0
        requests = [
            DeviceRequest(f"pod-{i}", s.memory_mib)
            for i, s in enumerate(sizes)
            if s is not None and _plannable(s)
        ]
        plan = burstplan.plan_burst(policy, cluster, requests)
        for request, choice in zip(requests, plan or (), strict=False):
            if choice is not None:
                self._planned.setdefault(request.memory_mib, []).append(choice)
        return sum(len(c) for c in self._planned.values())

    def burst_candidates(self, sizes: Sequence[PodSize | None]) -> int:
        """How many of `sizes` `plan_burst` would plan (0 unless the policy is `PackingPolicy`); a
        plan needs at least two."""
        if not isinstance(self.policy, PackingPolicy):
            return 0
        return sum(1 for s in sizes if _plannable(s))

    def end_burst(self) -> None:
        """Drop the burst plan: it was made for one step's state."""
        self._planned = {}

    def _from_plan(self, cluster: ClusterState, request: DeviceRequest) -> Placement | None:
        if (
            request.pinned_profile is not None
            or request.preferred_profile is not None
            or request.models
            or request.end_hint is not None
        ):
            return None
        for choice in self._planned.get(request.memory_mib, ()):
            ref = choice.gpu
            if not cluster.has(ref):
                continue
            gpu = cluster.gpu(ref)
            if gpu.whole_gpu_taken or not gpu.occupancy.can_place(choice.profile, choice.start):
                continue
            allowed = request.allowed(ref)
            if allowed is not None and (choice.profile.name, choice.start) not in allowed:
                continue
            return Placement((Choice(request.name, ref, choice.profile, choice.start),))
        return None

    # --- shares of hami-core GPUs -------------------------------------------------------------------

    @staticmethod
    def shares(
        gpus: Mapping[GpuRef, SharedGpuState],
        requests: Sequence[ShareRequest],
        node_ok: Callable[[str], bool] | None = None,
    ) -> SharePlacement:
        """Every share on the best node (best fit), or the most specific reason why none."""
        return shared.place_shares(gpus, requests, node_ok)

    @staticmethod
    def share_nodes(
        gpus: Mapping[GpuRef, SharedGpuState], requests: Sequence[ShareRequest], nodes: Iterable[str]
    ) -> set[str]:
        """The nodes of `nodes` that take every share."""
        return shared.feasible_nodes(gpus, requests, nodes)

    @staticmethod
    def shares_on(
        gpus: Mapping[GpuRef, SharedGpuState], requests: Sequence[ShareRequest], node: str
    ) -> tuple[ShareNodeKey, tuple[SharePick, ...]] | None:
        """Every share on `node` (best fit), with the node's ranking key; None if they do not fit."""
        return shared.place_on_node(gpus, requests, node)

    @staticmethod
    def explain_shares(
        gpus: Mapping[GpuRef, SharedGpuState],
        requests: Sequence[ShareRequest],
        node_ok: Callable[[str], bool] | None = None,
    ) -> SharePlacement:
        """Why no node takes every share."""
        return shared.explain_shares(gpus, requests, node_ok)

    # --- whole GPUs ---------------------------------------------------------------------------------

    @staticmethod
    def whole_nodes(
        idle: IdleGpus, requests: Sequence[WholeRequest], node_ok: Callable[[str], bool] | None = None
    ) -> dict[str, tuple[NodeKey, tuple[WholePick, ...]]]:
        """Every node whose idle GPUs take every whole GPU, with its ranking key and picks."""
        return whole.feasible_nodes(idle, requests, node_ok)

    @staticmethod
    def whole_on(
        idle: IdleGpus, requests: Sequence[WholeRequest], node: str, exclude: Set[GpuRef] = frozenset()
    ) -> tuple[NodeKey, tuple[WholePick, ...]] | None:
        """Every whole GPU on an idle GPU of `node` outside `exclude`, or None."""
        return whole.place_on_node(idle, requests, node, exclude)

    @staticmethod
    def explain_whole(
        idle: IdleGpus, requests: Sequence[WholeRequest], node_ok: Callable[[str], bool] | None = None
    ) -> WholePlacement:
        """Why no node takes every whole GPU."""
        return whole.explain_whole(idle, requests, node_ok)

    # --- several pods -------------------------------------------------------------------------------

    @staticmethod
    def batch_order(
        sizes: Sequence[PodSize | None],
        waited: Sequence[float] | None = None,
        age_first_after_s: float = AGE_FIRST_AFTER_S,
    ) -> list[int]:
        """The order to decide pending pods in: those that waited `age_first_after_s` or longer
        first, longest wait first (so that larger pods cannot starve them); then largest first
        (memory, then devices), then input order; pods of unknown size last, in input order."""
        return size_order(sizes, waited, age_first_after_s)


def _plannable(size: PodSize | None) -> bool:
    """A one-device MIG pod asking for some memory: what a burst plan may place."""
    return size is not None and size.mig and size.devices == 1 and size.memory_mib > 0


__all__ = ["AGE_FIRST_AFTER_S", "Placer", "PodSize", "Policy", "ShareNodeKey", "mig_cost"]
