"""The baseline policy: what kube-scheduler's allocator amounts to on flexmig's slices."""

from __future__ import annotations

from collections.abc import Sequence

from driver.policy.cluster import ClusterState, GpuStateClass
from driver.policy.evaluator import Candidate, Evaluator
from driver.policy.explain import explain_failure
from driver.policy.model import Choice, DeviceRequest, GpuRef, Placement


class FirstFitPolicy:
    """Baseline: nodes by name, GPUs by index, smallest fitting profile, lowest free start.

    Computed on states like `PackingPolicy`: a GPU's first fit is the first of its state's candidates
    (they are listed in profile order, then placement order). Nodes where some device has no GPU with
    a free placement are skipped: placing earlier devices only takes placements away.
    """

    name = "first-fit"

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        if not requests:
            return Placement(()) if cluster.nodes() else explain_failure(cluster, requests)
        ev = Evaluator(None, cluster)
        nodes = ev.nodes_where(
            requests, lambda state, request, allowed: ev.candidates(state, request, allowed)
        )
        for node in sorted(nodes):
            refs = cluster.node_refs(node)
            states = {r: cluster.state_of(r) for r in refs}
            choices: list[Choice] = []
            for request in requests:
                found = self._first(ev, refs, states, request)
                if found is None:
                    break
                ref, (_, index, start, after) = found
                choices.append(Choice(request.name, ref, cluster.gpu(ref).catalog.profiles[index], start))
                states[ref] = after
            else:
                return Placement(tuple(choices))
        return explain_failure(cluster, requests)

    @staticmethod
    def _first(
        ev: Evaluator,
        refs: list[GpuRef],
        states: dict[GpuRef, GpuStateClass | None],
        request: DeviceRequest,
    ) -> tuple[GpuRef, Candidate] | None:
        for ref in refs:
            state = states[ref]
            if state is None:
                continue
            cands = ev.candidates(state, request, ev.allowed(request, ref))
            if cands:
                return ref, cands[0]
        return None
