"""`flexmig status -o json|yaml`: the same view as the text of controller/views/statusview.py, as data.

One document: `gpus` (MIG-capable GPUs: placements taken, by whom, what still fits, fragmentation;
`migMode` "off" with `migModeChangeNeedsReset` true is an Ampere GPU waiting for MIG enable + reset),
`sharedGpus` (hami-core GPUs: capacity and each share), `notes` (incomplete pools, allocations of
devices nobody publishes, conflicting claims) and `summary`. Keys are camelCase like the API's; the
shape is stable for scripts (`jq '.gpus[] | select(.fits == [])'`).
"""

from __future__ import annotations

from typing import Any

from controller.shared.view import ShareHolding
from controller.state.inventory import Inventory
from controller.views.statusmodel import Allocations, gpu_view


def _holder(holder: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "claim": str(getattr(holder, "claim", "")),
        "pods": list(getattr(holder, "pods", ())),
    }
    data = getattr(holder, "data", None)
    if data:
        for key in ("migUUID", "gpuInstanceID", "computeInstanceID", "uuid"):
            if data.get(key) is not None:
                out[key] = data[key]
    return out


def _share(held: ShareHolding) -> dict[str, Any]:
    out = {"shareID": held.share_id, **_holder(held.holder)}
    if held.amount is not None:
        out.update(memoryMiB=held.amount.memory_mib, cores=held.amount.cores, shares=held.amount.shares)
    return out


def status_document(
    inventory: Inventory, allocations: Allocations, node: str | None = None
) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = []
    for gpu in sorted(inventory.gpus.values(), key=lambda g: (g.ref.node, g.ref.gpu_index)):
        if node is not None and gpu.ref.node != node:
            continue
        view = gpu_view(gpu, inventory, allocations.holders)
        frag = view.fragmentation()
        gpus.append(
            {
                "node": gpu.ref.node,
                "index": gpu.ref.gpu_index,
                "uuid": gpu.uuid,
                "model": gpu.catalog.model,
                "memorySlices": view.memory_slices,
                "migMode": view.mig_mode,
                "migModeChangeNeedsReset": view.mig_mode_needs_reset,
                "instances": [
                    {
                        "device": inst.device,
                        "profile": inst.placed.profile.name,
                        "start": inst.placed.start,
                        "size": inst.placed.profile.memory_slices,
                        **_holder(inst.holder),
                    }
                    for inst in view.instances
                ],
                "wholeGpu": _holder(view.whole) if view.whole is not None else None,
                "fits": [{"profile": name, "count": n} for name, n in view.fits()],
                "fragmentation": None if frag is None else round(frag, 4),
                "problems": list(view.problems),
            }
        )
    shared: list[dict[str, Any]] = []
    for ref, info in sorted(inventory.shared.items(), key=lambda item: (item[0].node, item[0].gpu_index)):
        if node is not None and ref.node != node:
            continue
        total = info.total()
        held = allocations.shares.get((info.pool, info.device), ())
        shared.append(
            {
                "node": ref.node,
                "index": ref.gpu_index,
                "uuid": info.uuid,
                "device": info.device,
                "capacity": {"memoryMiB": total.memory_mib, "cores": total.cores, "shares": total.shares},
                "shares": [_share(h) for h in held],
            }
        )
    notes = [
        f"pool {p.name}: incomplete (generation {p.generation} not fully published)"
        for p in sorted(inventory.pools.values(), key=lambda p: p.name)
        if not p.complete and (node is None or p.node == node)
    ]
    notes += [f"warning: {c}" for c in allocations.conflicts]
    allocated = sum(len(g["instances"]) + (g["wholeGpu"] is not None) for g in gpus)
    allocated += sum(len(s["shares"]) for s in shared)
    return {
        "gpus": gpus,
        "sharedGpus": shared,
        "notes": notes,
        "summary": {
            "gpus": len(gpus) + len(shared),
            "nodes": len({g["node"] for g in gpus} | {s["node"] for s in shared}),
            "allocatedDevices": allocated,
        },
    }
