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
from driver.policy.burstplan import MAX_BURST_PODS
from driver.policy.burstplan import TIME_BUDGET_S as BURST_PLAN_BUDGET_S
from driver.policy.cluster import ClusterState
from driver.policy.model import Choice, DeviceRequest, GpuRef, Placement
from driver.policy.sharemodel import SharedGpuState, SharePick, SharePlacement, ShareRequest
from driver.policy.whole import mig_cost
from driver.policy.wholemodel import IdleGpus, NodeKey, WholePick, WholePlacement, WholeRequest

ShareNodeKey = shared.NodeKey


class Placer:
    """The placement decisions of the controller, with the MIG policy it was given (default: flexmig's)."""

    __slots__ = ("_following", "_planned", "burst_budget_s", "policy")

    def __init__(self, policy: Policy | None = None, burst_budget_s: float = BURST_PLAN_BUDGET_S) -> None:
        if not 0 <= burst_budget_s < float("inf"):
            raise ValueError(f"burst_budget_s must be a finite number >= 0, got {burst_budget_s}")
        self.policy: Policy = policy if policy is not None else PackingPolicy()
        # Wall time a burst plan may take (driver/policy/burstplan.py); 0 turns burst plans off.
        self.burst_budget_s = burst_budget_s
        self._following = False
        self._planned: dict[int, list[Choice]] = {}  # the burst plan's choices, by requested MiB

    @property
    def name(self) -> str:
        return self.policy.name

    # --- MIG devices --------------------------------------------------------------------------------

    def mig(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        """Every MIG device of a pod on one node (node, GPU, profile, start), or why none takes them.

        For a pod the burst plan placed (between `follow_plan(True)` and `follow_plan(False)`), a
        one-device request takes the first planned choice of its size that is still free in
        `cluster` and that its filter allows; otherwise, or when none is, the policy decides."""
        if self._following and self._planned and len(requests) == 1:
            hit = self._from_plan(cluster, requests[0])
            if hit is not None:
                return hit
        return self.policy.place(cluster, requests)

    def burst_group(self, sizes: Sequence[PodSize | None]) -> list[int]:
        """The indices of `sizes` a burst plan would place: the one-device MIG pods, when they all
        share one `PodSize.plan_key` (same device class, selectors and node constraints, so one node
        filter and one allowed table serve them all: a Job's pods), the first `MAX_BURST_PODS` of
        them in `sizes` order. Empty when fewer than two, when they have different keys, when the
        policy is not `PackingPolicy`, or when plans have no budget.

        Different keys get no plan: a plan for one group does not see what the others need (a pod
        that may run on one node only), and following it was measured to place less than deciding
        pod by pod in 6 of 400 random such steps; with no restrictions, never in 400."""
        if not isinstance(self.policy, PackingPolicy) or self.burst_budget_s <= 0:
            return []
        plannable = [
            (i, size.plan_key) for i, size in enumerate(sizes) if size is not None and _plannable(size)
        ]
        group = [i for i, _ in plannable]
        keys = {key for _, key in plannable}
        if len(keys) != 1 or len(group) < burstplan.MIN_PODS:
            return []
        return group[:MAX_BURST_PODS]

    def plan_burst(
        self, cluster: ClusterState, sizes: Sequence[PodSize], node_ok: Callable[[str], bool] | None = None
    ) -> int:
        """Plan the pods of `burst_group` (`sizes`, all of one plan key) together on the GPUs of
        the nodes `node_ok` accepts (driver/policy/burstplan.py) and hold the plan until
        `end_burst`; returns how many pods it placed (0: no plan, every pod decided by the policy).

        Advice, not a reservation: `mig` checks every planned choice against the cluster and the
        request it is asked for, so a choice that pods decided meanwhile took, or that the pods'
        selectors exclude, is passed over."""
        self._planned = {}
        policy = self.policy
        if (
            not isinstance(policy, PackingPolicy)
            or len(sizes) < burstplan.MIN_PODS
            or self.burst_budget_s <= 0
        ):
            return 0
        requests = [DeviceRequest(f"pod-{i}", s.memory_mib) for i, s in enumerate(sizes)]
        gpu_ok = None if node_ok is None else (lambda ref: node_ok(ref.node))
        plan = burstplan.plan_burst(
            policy, cluster, requests, time_budget_s=self.burst_budget_s, gpu_ok=gpu_ok
        )
        for request, choice in zip(requests, plan or (), strict=False):
            if choice is not None:
                self._planned.setdefault(request.memory_mib, []).append(choice)
        return sum(len(c) for c in self._planned.values())

    def follow_plan(self, on: bool) -> None:
        """Whether the pod decided next is one the held plan placed (only those follow it: another
        pod taking a planned slot would push a planned pod back to the policy)."""
        self._following = on

    def end_burst(self) -> None:
        """Drop the burst plan: it was made for one step's state."""
        self._planned = {}
        self._following = False

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


def _plannable(size: PodSize) -> bool:
    """A one-device MIG pod asking for some memory, with a plan key: what a burst plan may place."""
    return size.plan_key is not None and size.devices == 1 and size.memory_mib > 0


__all__ = [
    "AGE_FIRST_AFTER_S",
    "BURST_PLAN_BUDGET_S",
    "Placer",
    "PodSize",
    "Policy",
    "ShareNodeKey",
    "mig_cost",
]
