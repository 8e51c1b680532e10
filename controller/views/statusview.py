"""`flexmig status` as text: every GPU's memory-slice map, who holds each placement, what still fits. Pure.

The values come from controller/views/statusmodel.py (claims and pods read into holders, one view per
GPU); a claim no pod can be found for is shown by its own name with `pod ?`. The realised identity (GPU
instance id, MIG UUID) is shown when the node wrote it at prepare, else "(not prepared yet)".

Per GPU the output is a header (followed by "MIG mode off ..." and the fix for an Ampere GPU whose
node published it with MIG off), a bar with one cell per memory slice (an instance spans the cells of
its placement), one line per instance, and a summary: free memory and compute slices, fragmentation
(driver/placement/fragmentation.py) and the instances of each allowed profile that can still be added.
Shared (HAMi-core) GPUs are drawn by controller/shared/view.py: many claims hold one device, one share
each (a result with shareID / consumedCapacity), so they are never reported as conflicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from api import devicecontract as dc
from controller.shared.view import fit_label, shared_gpu_lines
from controller.state.inventory import Inventory
from controller.views.statusmodel import Allocations, GpuView, Holder, gpu_view

CELL = 9  # characters per memory slice in the bar, brackets included
UNKNOWN_POD = "pod ?"

# ANSI SGR codes: holders cycle through the palette so neighbouring instances are told apart.
_PALETTE = ("36", "35", "34", "33", "32;1", "36;1", "35;1", "34;1")
_FREE = "2"
_WARN = "31"
_BOLD = "1"


# --- text ---------------------------------------------------------------------------------------------


class _Painter:
    def __init__(self, color: bool) -> None:
        self.color = color
        self._by_claim: dict[str, str] = {}

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def holder_code(self, holder: Holder) -> str:
        code = self._by_claim.get(holder.claim)
        if code is None:
            code = _PALETTE[len(self._by_claim) % len(_PALETTE)]
            self._by_claim[holder.claim] = code
        return code


def _segment(label: str, slices: int) -> str:
    return "[" + fit_label(label, slices * CELL - 2) + "]"


def _bar(view: GpuView, paint: _Painter) -> tuple[str, str]:
    """(scale line, bar line) for one GPU."""
    n = view.memory_slices
    if view.whole is not None:
        label = f"whole GPU {view.whole.who}"
        width = max(n, 4)
        return "", paint(_segment(label, width), paint.holder_code(view.whole))
    scale = "".join(str(k).ljust(CELL) for k in range(n)).rstrip()
    by_start = {i.placed.placement.start: i for i in view.instances}
    parts: list[str] = []
    k = 0
    while k < n:
        inst = by_start.get(k)
        if inst is not None:
            size = max(1, inst.placed.placement.size)
            cells = min(size, n - k)
            label = f"{inst.placed.profile.name} {inst.holder.who}"
            if len(label) > cells * CELL - 2:  # too narrow for both: the profile is what matters here
                label = inst.placed.profile.name
            parts.append(paint(_segment(label, cells), paint.holder_code(inst.holder)))
            k += size
            continue
        end = k
        while end < n and end not in by_start and view.occupancy.is_free(end, 1):
            end += 1
        if end == k:  # taken by an instance starting before k (overlap reported as a problem)
            end = k + 1
        parts.append(paint(_segment("free", end - k), _FREE))
        k = end
    return scale, "".join(parts)


def _gpu_lines(view: GpuView, paint: _Painter) -> list[str]:
    gpu = view.gpu
    catalog = gpu.catalog
    info = catalog.gpu
    title = f"{gpu.ref.node}  GPU {gpu.ref.gpu_index}  {catalog.model}"
    if info.name and info.name != catalog.model:
        title += f" ({info.name})"
    if gpu.uuid:
        title += f"  {gpu.uuid}"
    lines = [paint(title, _BOLD)]
    if view.mig_mode_off:
        lines.append("  " + paint(mig_mode_off_line(gpu.ref.gpu_index), _WARN))
    if not catalog.profiles and gpu.whole_device is not None and view.whole is None:
        lines.append("  " + paint(_segment("whole GPU free", max(catalog.memory_slices, 4)), _FREE))
        lines.append("  MIG devices not published (whole GPU only)")
        lines.append("  still fits: whole GPU")
        return lines
    scale, bar = _bar(view, paint)
    if scale:
        lines.append("  " + scale)
    lines.append("  " + bar)
    if view.whole is not None:
        lines.append(_holder_line("all", "whole GPU", gpu.whole_device or "", view.whole, paint))
    for inst in sorted(view.instances, key=lambda i: i.placed.start):
        p = inst.placed.placement
        where = f"{p.start}" if p.size == 1 else f"{p.start}-{p.end - 1}"
        lines.append(_holder_line(where, inst.placed.profile.name, inst.device, inst.holder, paint))
    occ = view.occupancy
    if view.whole is not None:
        lines.append(f"  free: none; compute {catalog.compute_slices}/{catalog.compute_slices} slices used")
    else:
        free = [k for k in range(view.memory_slices) if occ.is_free(k, 1)]
        free_text = f"memory slices {_ranges(free)}" if free else "no memory slice"
        lines.append(
            f"  free: {free_text} ({len(free)}/{view.memory_slices}); "
            f"compute {occ.used_compute_slices}/{occ.compute_slices} slices used"
        )
    frag = view.fragmentation()
    if frag is not None:
        lines.append(f"  fragmentation: {frag:.2f}")
    fits = view.fits()
    fits_text = ", ".join(f"{name} x{n}" for name, n in fits) if fits else "nothing"
    lines.append(f"  still fits: {fits_text}")
    lines.extend("  " + paint(f"warning: {p}", _WARN) for p in view.problems)
    return lines


def mig_mode_off_line(index: int) -> str:
    return (
        f"MIG mode off (needs a GPU reset to change): for MIG devices run `nvidia-smi -i {index} -mig 1`"
        " on the node, reset the GPU or reboot, then restart the flexmig kubelet plugin"
    )


def _holder_line(where: str, profile: str, device: str, holder: Holder, paint: _Painter) -> str:
    pod = ("pod " + ",".join(holder.pods)) if holder.pods else UNKNOWN_POD
    text = f"  {where:>5}  {profile:<10} {pod}  claim {holder.claim}"
    identity = holder.identity
    text += f"  {identity}" if identity else "  (not prepared yet)"
    return paint(text, paint.holder_code(holder)) + f"  [{device}]"


def _ranges(values: Sequence[int]) -> str:
    """[1, 2, 3, 5] -> '1-3,5'."""
    out: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def render(
    inventory: Inventory,
    allocations: Allocations,
    *,
    color: bool = False,
    node: str | None = None,
) -> str:
    """The whole status text (no trailing newline)."""
    paint = _Painter(color)
    gpus = sorted(
        (g for g in inventory.gpus.values() if node is None or g.ref.node == node),
        key=lambda g: (g.ref.node, g.ref.gpu_index),
    )
    blocks: list[str] = []
    instances = 0
    for gpu in gpus:
        view = gpu_view(gpu, inventory, allocations.holders)
        instances += len(view.instances) + (view.whole is not None)
        blocks.append("\n".join(_gpu_lines(view, paint)))
    for ref, info in sorted(inventory.shared.items(), key=lambda item: (item[0].node, item[0].gpu_index)):
        if node is not None and ref.node != node:
            continue
        held = allocations.shares.get((info.pool, info.device), ())
        instances += len(held)
        dev = inventory.device((info.pool, info.device))
        model = (
            str(dev.attribute(dc.ATTR_MODEL) or dev.attribute(dc.ATTR_PRODUCT_NAME) or "")
            if dev is not None
            else ""
        )
        blocks.append("\n".join(shared_gpu_lines(ref, info, model, held, paint, paint.holder_code, _FREE)))
    shown = len(gpus) + sum(1 for ref in inventory.shared if node is None or ref.node == node)
    pools = [p for p in inventory.pools.values() if node is None or p.node == node]
    notes = [
        paint(f"pool {p.name}: incomplete (generation {p.generation} not fully published), not shown", _WARN)
        for p in sorted(pools, key=lambda p: p.name)
        if not p.complete
    ]
    known = {(g.pool, d) for g in inventory.gpus.values() for d in g.mig_devices.values()}
    known |= {(g.pool, g.whole_device) for g in inventory.gpus.values() if g.whole_device is not None}
    known |= {(i.pool, i.device) for i in inventory.shared.values()}
    orphans = {k: h for k, h in allocations.holders.items()}
    orphans |= {
        k: v[0].holder for k, v in allocations.shares.items() if v and isinstance(v[0].holder, Holder)
    }
    for (pool, device), holder in sorted(orphans.items()):
        published = inventory.pools.get(pool)
        if (pool, device) in known or (node is not None and (published is None or published.node != node)):
            continue
        notes.append(paint(f"claim {holder.claim} holds {pool}/{device}, which no GPU publishes", _WARN))
    notes += [paint(f"warning: {c}", _WARN) for c in allocations.conflicts]
    where = f" on node {node}" if node is not None else ""
    if not shown:
        summary = f"no flexmig GPU published{where}"
    else:
        nodes = len(
            {g.ref.node for g in gpus} | {r.node for r in inventory.shared if node is None or r.node == node}
        )
        summary = (
            f"{shown} GPU{'s' if shown != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''}, "
            f"{instances} allocated device{'s' if instances != 1 else ''}"
        )
    return "\n\n".join([*blocks, "\n".join([*notes, summary])])
