"""Where placement is decided: the one entry point the controller calls for every placement decision.

A pod's devices are of three kinds, each with its own rule, and a burst of pods has an order:

- MIG devices: the MIG policy (driver/policy/allocator.py `PackingPolicy`, or `FirstFitPolicy` with
  `flexmig controller --policy first-fit`) picks node, GPU, profile and placement start (`Placer.mig`);
- shares of hami-core GPUs: best fit, largest first (driver/policy/shared.py; `Placer.shares`,
  `Placer.share_nodes`, `Placer.shares_on`, `Placer.explain_shares`);
- whole GPUs: the idle GPU whose loss costs future MIG placements the least (driver/policy/whole.py;
  `Placer.whole_nodes`, `Placer.whole_on`, `Placer.explain_whole`, priced by `mig_cost`);
- several pending pods: decided largest first, except that pods pending longer than
  `AGE_FIRST_AFTER_S` go first, oldest first (driver/policy/batch.py; `Placer.batch_order`).

The controller (controller/allocation/decide.py and controller/allocation/wholeplan.py combine the
kinds on one node; controller/allocation/loop.py orders the pods) imports placement from this module
only; the import-linter contract `controller-places-through-placer` in pyproject.toml forbids the
controller every other module of driver/policy except the data types (model.py, cluster.py,
sharemodel.py, wholemodel.py). Like the policies, nothing here changes the state it is handed: the
caller commits what it keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from driver.policy import shared, whole
from driver.policy.allocator import PackingPolicy, Policy
from driver.policy.batch import AGE_FIRST_AFTER_S, PodSize, size_order
from driver.policy.cluster import ClusterState
from driver.policy.model import DeviceRequest, GpuRef, Placement
from driver.policy.sharemodel import SharedGpuState, SharePick, SharePlacement, ShareRequest
from driver.policy.whole import mig_cost
from driver.policy.wholemodel import IdleGpus, NodeKey, WholePick, WholePlacement, WholeRequest

ShareNodeKey = shared.NodeKey


class Placer:
    """The placement decisions of the controller, with the MIG policy it was given (default: flexmig's)."""

    __slots__ = ("policy",)

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy: Policy = policy if policy is not None else PackingPolicy()

    @property
    def name(self) -> str:
        return self.policy.name

    # --- MIG devices --------------------------------------------------------------------------------

    def mig(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        """Every MIG device of a pod on one node (node, GPU, profile, start), or why none takes them."""
        return self.policy.place(cluster, requests)

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


__all__ = ["AGE_FIRST_AFTER_S", "Placer", "PodSize", "Policy", "ShareNodeKey", "mig_cost"]
