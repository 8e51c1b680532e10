"""A reference policy: HAMi's dynamic-MIG scheduling after its pull request 2855 (merged 2026-09-03).

Used only to compare against (`flexmig simulate --policy hami-2855`, benchmarks/packing); the
controller never runs it. What the pull request changed is the choice on one card
(driver/policy/hami_card.py); what it kept is v2.10's walk over nodes and GPUs (driver/policy/hami.py):
nodes most used first, on a node GPUs most used first, each device of a pod taking the first GPU in
that order that still has room, a GPU taken again for the pod's next device. Nothing looks across
cards: there is no backtracking between GPUs and no score of what a choice costs the cluster.

On one card, the devices of the pod that chose it are planned together (HAMi's `planMigAllocations`
in `CustomFilterRule`): each gets the smallest profile (memory, then slices) with enough memory, and
hami_card's search places the group, pickiest first, backtracking within the card. Only when that
finds no layout does the card fall back to v2.10's sequence, now with the ranked placements: device
by device the smallest profile that has a free placement, possibly a larger one, at its best-ranked
placement (HAMi's `selectMigCandidate`). A later device that the card cannot take moves on to the
next GPU; the devices already there keep the card's latest plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from driver.catalog.types import MigProfile
from driver.policy.cluster import ClusterState
from driver.policy.explain import profiles_for, serves
from driver.policy.hami import busiest_gpus, place_busiest_node_first
from driver.policy.hami_card import SEARCH_BUDGET, CardSearch, card_layout, place_on_card, rank
from driver.policy.model import Choice, DeviceRequest, GpuRef, GpuState, Placement


def profile_ladder(gpu: GpuState, request: DeviceRequest) -> list[MigProfile]:
    """The profiles a request may take on this GPU, smallest memory (then fewest slices) first."""
    return sorted(profiles_for(gpu, request), key=lambda p: (p.memory_mib, p.memory_slices))


class HamiScoredPolicy:
    """HAMi after pull request 2855 on flexmig's cluster state (reference only)."""

    name = "hami-2855"

    def __init__(self, budget: int = SEARCH_BUDGET) -> None:
        self.budget = budget
        self.last_search: CardSearch | None = None  # the latest joint search (tests read its tries)

    def place(self, cluster: ClusterState, requests: Sequence[DeviceRequest]) -> Placement:
        return place_busiest_node_first(cluster, requests, self._on_node)

    def _on_node(self, gpus: list[GpuState], requests: Sequence[DeviceRequest]) -> tuple[Choice, ...] | None:
        ordered = busiest_gpus(gpus)
        groups: dict[GpuRef, list[DeviceRequest]] = {}
        plans: dict[GpuRef, tuple[Choice, ...]] = {}
        for request in requests:
            for gpu in ordered:
                if not serves(gpu, request):
                    continue
                group = [*groups.get(gpu.ref, ()), request]
                plan = self.plan_card(gpu, group)
                if plan is not None:
                    groups[gpu.ref], plans[gpu.ref] = group, plan
                    break
            else:
                return None
        # A request's choice is the one in its card's final plan (requests are named uniquely per pod).
        by_request = {c.request: c for plan in plans.values() for c in plan}
        return tuple(by_request[r.name] for r in requests)

    def plan_card(self, gpu: GpuState, group: Sequence[DeviceRequest]) -> tuple[Choice, ...] | None:
        """Instances for every request of `group` on this GPU, in the group's order, or None."""
        layout = card_layout(gpu.catalog.profiles)
        ladders = [profile_ladder(gpu, r) for r in group]
        if not all(ladders):
            return None
        wanted = [(ladder[0], r.allowed(gpu.ref)) for ladder, r in zip(ladders, group, strict=True)]
        search = place_on_card(layout, gpu.occupancy, wanted, self.budget)
        self.last_search = search
        if search.starts is not None:
            return tuple(
                Choice(r.name, gpu.ref, profile, start)
                for r, (profile, _), start in zip(group, wanted, search.starts, strict=True)
            )
        # v2.10's sequence with the ranked placements: each request its smallest profile with room.
        occ = gpu.occupancy
        choices: list[Choice] = []
        for request, ladder in zip(group, ladders, strict=True):
            allowed = request.allowed(gpu.ref)
            for profile in ladder:
                ranked = rank(layout, occ, profile, allowed)
                if ranked:
                    choices.append(Choice(request.name, gpu.ref, profile, ranked[0].start))
                    occ = occ.place(profile, ranked[0].start)
                    break
            else:
                return None
        return tuple(choices)
