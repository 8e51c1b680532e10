"""The ceiling per movable share: the repacking bound in which only movable pods may move.

driver/policy/pinned.py `PinnedBound` on the streams of online.py, with the same movable pods as
moves.py's run (`movable_flags` draws them exactly as moves.py's `arrivals` does) and the same HiGHS program as
online.py's `run_bound`, so the two bounds differ only in which pods are pinned. Pods are placed, while nobody has to move,
by flexmig's policy on the real nodes (build_cluster's GPU names).
"""

from __future__ import annotations

from collections.abc import Sequence

from driver.policy.model import GpuRef
from driver.policy.pinned import PinnedBound
from flexmig.simulation.room import draw

from .mip import MipProgram
from .online import Outcome, Pod, Scenario, catalogs_of, stream


def movable_flags(pods: Sequence[Pod], share: float, seed: int) -> dict[str, bool]:
    """Which pods are movable: room.py's `draw`, as moves.py's `arrivals`."""
    drawn = draw(((p.name, p.arrival, p.lifetime, p.sizes) for p in pods), seed, share, 0.0)
    return {a.name: a.movable for a in drawn}


def run_ceiling(
    scenario: Scenario, pods: Sequence[Pod], share: float, seed: int, warmup: float = 0.2
) -> tuple[Outcome, PinnedBound]:
    gpus = [(GpuRef(node, i), c) for node, cats in catalogs_of(scenario) for i, c in enumerate(cats)]
    bound = PinnedBound(gpus, MipProgram)
    movable = movable_flags(pods, share, seed)

    def admit(pod: Pod) -> object:
        return pod.name if bound.admit(pod.name, pod.sizes, movable[pod.name]) else None

    def release(token: object) -> None:
        bound.release(str(token))

    return stream(pods, admit, release, f"ceiling, {share:.0%} movable", warmup), bound


__all__ = ["movable_flags", "run_ceiling"]
