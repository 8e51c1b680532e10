"""MIG hardware rules applied to the simulator state (no I/O, no locking).

Errors are raised as pynvml's own `NVMLError(code)` so the library layer can let them through
unchanged, exactly as the real bindings would raise them.
"""

from __future__ import annotations

import uuid
from typing import NoReturn

import pynvml

from driver.nvml.sim.hardware import SKUS, GiProfileRow, Sku, Variant, ci_profiles, is_full_gpu
from driver.nvml.sim.state import CiState, GiState, GpuState, MigOffQueries, SimState

# GI ids go by size on real GPUs: the ids form a binary tree over the memory-slice axis, so a profile
# holding 1/n of the memory gets an id in [n-1, 2n-2]: the full GPU 0, halves 1-2, quarters 3-6,
# eighths 7-14 (A100/H100: 3g/4g 1-2, 2g 3-6, 1g 7-14; A30 and RTX PRO 6000: 2g 1-2, 1g 3-6) [C from
# the user guide's examples and captures]. Inside its range an id is not tied to the placement on
# real hardware, so the simulator takes the lowest free one [U]. The 1g double-memory GI holds a
# quarter of the memory and so takes a quarter's id (3-6) [D]. nvidia-caps mig-minors stop at gi14.
MAX_GI_ID = 14
MAX_CI_ID = 7
_MIG_NAMESPACE = uuid.UUID("5b7f4c0e-6d1a-4d6e-9a43-0c1f3f6b8a21")


def fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def gpu_at(state: SimState, index: int) -> GpuState:
    if not 0 <= index < len(state.gpus):
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return state.gpus[index]


def sku_of(gpu: GpuState) -> Sku:
    return SKUS[gpu.sku]


def gpu_uuid(seed: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_MIG_NAMESPACE, f'gpu/{seed}/{index}')}"


def mig_uuid(gpu_uuid_str: str, gi_id: int, ci_id: int) -> str:
    """Stable MIG UUID of (GPU, GI id, CI id), R470+ format."""
    return f"MIG-{uuid.uuid5(_MIG_NAMESPACE, f'mig/{gpu_uuid_str}/{gi_id}/{ci_id}')}"


def require_mig_on(gpu: GpuState) -> None:
    if not gpu.mig_current:
        fail(pynvml.NVML_ERROR_NOT_SUPPORTED)


def require_mig_query(gpu: GpuState) -> None:
    """Profile queries: Ampere needs MIG on; Hopper+ answers or refuses with MIG off, per the GPU's
    `mig_off_queries` switch [U: nvml.h says refuse; field 199 says some GPUs answer]."""
    if sku_of(gpu).mig_query_needs_mig_enabled or gpu.mig_off_queries == MigOffQueries.REFUSE:
        require_mig_on(gpu)


def profile_by_id(gpu: GpuState, profile_id: int) -> GiProfileRow:
    row = sku_of(gpu).profile_by_id(profile_id)
    if row is None:
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return row


def find_gi(gpu: GpuState, gi_id: int) -> GiState:
    for gi in gpu.gis:
        if gi.id == gi_id:
            return gi
    fail(pynvml.NVML_ERROR_NOT_FOUND)


def find_ci(gi: GiState, ci_id: int) -> CiState:
    for ci in gi.cis:
        if ci.id == ci_id:
            return ci
    fail(pynvml.NVML_ERROR_NOT_FOUND)


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


def _variant_allows(sku: Sku, gpu: GpuState, row: GiProfileRow) -> bool:
    """Media-engine rules: one +me GI at a time; +me.all admits only -me neighbours."""
    existing = [sku.profile_by_id(gi.profile_id) for gi in gpu.gis]
    variants = [r.variant for r in existing if r is not None]
    if Variant.ME_ALL in variants and row.variant is not Variant.NO_ME:
        return False
    if row.variant is Variant.ME_ALL and any(v is not Variant.NO_ME for v in variants):
        return False
    return not (row.variant is Variant.ME and Variant.ME in variants)


def _fits(sku: Sku, gpu: GpuState, row: GiProfileRow, start: int) -> bool:
    used_compute = sum(r.compute_slices for r in _rows(sku, gpu))
    if used_compute + row.compute_slices > sku.compute_slices:
        return False
    return not any(_overlaps(start, row.memory_slices, gi.start, gi.size) for gi in gpu.gis)


def _rows(sku: Sku, gpu: GpuState) -> list[GiProfileRow]:
    rows = [sku.profile_by_id(gi.profile_id) for gi in gpu.gis]
    return [r for r in rows if r is not None]


def _count_of(gpu: GpuState, row: GiProfileRow) -> int:
    return sum(1 for gi in gpu.gis if gi.profile_id == row.profile_id)


def remaining_capacity(gpu: GpuState, row: GiProfileRow) -> int:
    """How many more GIs of `row` fit now: free placements, capped by compute and instance limits."""
    sku = sku_of(gpu)
    if not _variant_allows(sku, gpu, row):
        return 0
    # Greedy over the profile's free starts, skipping ones that would overlap an already counted one,
    # gives the number of instances that could coexist (placements are aligned to their size).
    taken: list[int] = []
    for s in row.starts:
        occupied = [(g.start, g.size) for g in gpu.gis] + [(t, row.memory_slices) for t in taken]
        if not any(_overlaps(s, row.memory_slices, a, b) for a, b in occupied):
            taken.append(s)
    free_compute = sku.compute_slices - sum(r.compute_slices for r in _rows(sku, gpu))
    by_compute = free_compute // row.compute_slices
    return max(0, min(len(taken), by_compute, row.max_instances - _count_of(gpu, row)))


def gi_id_range(sku: Sku, row: GiProfileRow) -> range:
    """The GI ids a GI of `row` can get: [n-1, 2n-2] for a profile holding 1/n of the memory axis."""
    if is_full_gpu(sku, row):
        return range(0, 1)
    blocks = max(1, sku.memory_slices // row.memory_slices)
    return range(blocks - 1, min(2 * blocks - 1, MAX_GI_ID + 1))


def _next_gi_id(sku: Sku, gpu: GpuState, row: GiProfileRow) -> int:
    used = {gi.id for gi in gpu.gis}
    for candidate in gi_id_range(sku, row):
        if candidate not in used:
            return candidate
    fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)


def create_gi(state: SimState, gpu: GpuState, profile_id: int, start: int | None) -> GiState:
    """Create a GI; `start=None` means the driver's default placement (first start that fits)."""
    require_mig_on(gpu)
    sku = sku_of(gpu)
    row = profile_by_id(gpu, profile_id)
    if start is not None and start not in row.starts:
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not _variant_allows(sku, gpu, row) or _count_of(gpu, row) >= row.max_instances:
        fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    candidates = row.starts if start is None else (start,)
    chosen = next((s for s in candidates if _fits(sku, gpu, row, s)), None)
    if chosen is None:
        fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi = GiState(
        id=_next_gi_id(sku, gpu, row),
        profile_id=profile_id,
        start=chosen,
        size=row.memory_slices,
        serial=state.new_serial(),
    )
    gpu.gis.append(gi)
    gpu.gis.sort(key=lambda g: g.id)
    return gi


def _busy(gpu: GpuState, gi_id: int, ci_id: int | None = None) -> bool:
    return any(p.gi_id == gi_id and (ci_id is None or p.ci_id == ci_id) for p in gpu.processes)


def destroy_gi(gpu: GpuState, gi: GiState) -> None:
    require_mig_on(gpu)
    if gi.cis or _busy(gpu, gi.id):
        fail(pynvml.NVML_ERROR_IN_USE)
    gpu.gis.remove(gi)


def gi_row(gpu: GpuState, gi: GiState) -> GiProfileRow:
    return profile_by_id(gpu, gi.profile_id)


def create_ci(state: SimState, gpu: GpuState, gi: GiState, ci_profile_id: int, start: int | None) -> CiState:
    require_mig_on(gpu)
    rows = {r.profile_id: r for r in ci_profiles(sku_of(gpu), gi_row(gpu, gi))}
    row = rows.get(ci_profile_id)
    if row is None:
        fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if start is not None and start not in row.starts:
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    same = sum(1 for ci in gi.cis if ci.profile_id == ci_profile_id)
    if same >= row.max_instances:
        fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    candidates = row.starts if start is None else (start,)
    chosen = next(
        (s for s in candidates if not any(_overlaps(s, row.slices, c.start, c.size) for c in gi.cis)),
        None,
    )
    used_ids = {ci.id for ci in gi.cis}
    free_id = next((i for i in range(MAX_CI_ID + 1) if i not in used_ids), None)
    if chosen is None or free_id is None:
        fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    ci = CiState(
        id=free_id, profile_id=ci_profile_id, start=chosen, size=row.slices, serial=state.new_serial()
    )
    gi.cis.append(ci)
    gi.cis.sort(key=lambda c: c.id)
    return ci


def destroy_ci(gpu: GpuState, gi: GiState, ci: CiState) -> None:
    require_mig_on(gpu)
    if _busy(gpu, gi.id, ci.id):
        fail(pynvml.NVML_ERROR_IN_USE)
    gi.cis.remove(ci)


def set_mig_mode(gpu: GpuState, enabled: bool) -> int:
    """Returns the activation status (an NVML return code); the call itself does not fail."""
    # Switching modes unbinds/reconfigures the GPU, which needs it idle.
    if (gpu.gis or gpu.processes) and enabled != gpu.mig_current:
        return int(pynvml.NVML_ERROR_IN_USE)
    if sku_of(gpu).architecture.mig_toggle_needs_reset:
        gpu.mig_pending = enabled
    else:
        gpu.mig_current = gpu.mig_pending = enabled
    return int(pynvml.NVML_SUCCESS)


def reset(gpu: GpuState) -> None:
    """GPU reset (also what a reboot or driver reload does): refused while processes run; clears all
    instances. Ampere keeps MIG mode across it (the mode is persisted, and a pending change takes effect
    now); Hopper and newer do not persist it and come back with MIG off [C]."""
    if gpu.processes:
        fail(pynvml.NVML_ERROR_IN_USE)
    gpu.gis.clear()
    if sku_of(gpu).architecture.mig_toggle_needs_reset:
        gpu.mig_current = gpu.mig_pending
    else:
        gpu.mig_current = gpu.mig_pending = False


def mig_device_list(gpu: GpuState) -> list[tuple[GiState, CiState]]:
    """MIG devices in index order (one per CI, ordered by GI id then CI id)."""
    if not gpu.mig_current:
        return []
    return [
        (gi, ci) for gi in sorted(gpu.gis, key=lambda g: g.id) for ci in sorted(gi.cis, key=lambda c: c.id)
    ]
