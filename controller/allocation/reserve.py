"""Holding a placement that is not free yet, without contradicting the GPU's placement rules.

A move reserves placements before anything is evicted: the waiting pod's (say `7g.40gb@0`) usually
overlaps the instances of the pods being moved away, and a moved pod's destination may too (a move
within one GPU). The ledger must never hold two overlapping placements (it would mark the GPU as
contradicting its rules and keep it out). So a reservation holds, under its own holder name, each
wanted device that can be placed now; for one that cannot yet, the free single-slice devices inside
its memory slices, so that no other pod's decision can take a placement overlapping it. Called again
every step (and after each decision of the pod it is for), it grows into the wanted devices as the
moved pods' instances go.

Devices of GPUs the ledger does not model (no MIG catalog) are held only when free; shares (a
pod's part of a shared GPU) are not held at all: a reservation names exclusive devices.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.state.ledger import Held, Ledger, ShareUse
from driver.placement.occupancy import Occupancy, OccupancyError


def hold_cover(ledger: Ledger, holder: str, wanted: Iterable[Held]) -> None:
    """Hold for `holder` what of `wanted` can be held now (module docstring); replaces its holding."""
    ledger.forget(holder)
    inventory = ledger.inventory
    local: dict[object, Occupancy] = {}
    taken: list[Held] = []

    def place(key: Held) -> bool:
        if isinstance(key, ShareUse) or key in taken or ledger.holders(key):
            return False
        dev = inventory.device(key)
        if dev is None or dev.gpu is None or not ledger.cluster.has(dev.gpu):
            return dev is not None  # no MIG model for its GPU: the device alone is the whole story
        state = ledger.cluster.gpu(dev.gpu)
        if state.whole_gpu_taken:
            return False
        occ = local.get(dev.gpu, state.occupancy)
        if dev.profile is None or dev.start is None:  # the whole GPU
            return occ.is_empty
        profile = next((p for p in state.catalog.profiles if p.name == dev.profile), None)
        if profile is None:
            return False
        try:
            local[dev.gpu] = occ.place(profile, dev.start)
        except OccupancyError:
            return False
        return True

    for key in sorted(wanted, key=str):
        if place(key):
            taken.append(key)
            continue
        dev = None if isinstance(key, ShareUse) else inventory.device(key)
        if dev is None or dev.gpu is None or dev.start is None or dev.size is None:
            continue
        gpu = inventory.gpus.get(dev.gpu)
        if gpu is None:
            continue
        for (_, start), name in sorted(gpu.mig_devices.items()):
            filler = inventory.device((gpu.pool, name))
            if (
                filler is not None
                and filler.size == 1
                and dev.start <= start < dev.start + dev.size
                and place((gpu.pool, name))
            ):
                taken.append((gpu.pool, name))
    if taken:
        ledger.assume(holder, taken)


__all__ = ["hold_cover"]
