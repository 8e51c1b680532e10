"""The `hami.io/vgpu-mig-allocations` pod annotation, wire-compatible with HAMi.

flexmig writes this annotation as a *mirror* of what a pod got (the claim is the source of truth), so
tools built for HAMi keep working. The format is HAMi's `MigAllocation` JSON array:

    [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-...","profile":"2g.10gb",
      "placement":{"start":2,"size":2},
      "migUUID":"MIG-...","gpuInstanceID":4,"computeInstanceID":0}]

The three runtime fields (`migUUID`, `gpuInstanceID`, `computeInstanceID`) are written by the node once
the instance exists; before that all three are absent. Decoding applies HAMi's `DecodeMigAllocations`
checks (one bad entry rejects the whole annotation, as in HAMi) but names the entry and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MIG_ALLOCATIONS_ANNOTATION = "hami.io/vgpu-mig-allocations"

# HAMi keeps placement and instance ids in Go uint32 fields; values outside fail json.Unmarshal there.
_UINT32_MAX = 2**32 - 1
# Go `int` on the 64-bit platforms HAMi runs on.
_INT64_MAX = 2**63 - 1


class MigAnnotationError(ValueError):
    """The annotation is not a valid HAMi MIG allocation array."""


@dataclass(frozen=True, slots=True)
class MigAllocationRecord:
    """One MIG device of one container.

    `container_index` counts init containers first, then app containers (HAMi's convention).
    The runtime identity (`mig_uuid`, `gpu_instance_id`, `compute_instance_id`) is all set or all None.
    """

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement_start: int
    placement_size: int
    mig_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def __post_init__(self) -> None:
        _check_values(
            f"record (container {self.container_index}, device {self.device_index})",
            self.container_index,
            self.device_index,
            self.gpu_uuid,
            self.profile,
            self.placement_start,
            self.placement_size,
            self.mig_uuid,
            self.gpu_instance_id,
            self.compute_instance_id,
        )

    @property
    def has_runtime_identity(self) -> bool:
        return self.mig_uuid is not None


def _check_values(
    where: str,
    container_index: int,
    device_index: int,
    gpu_uuid: str,
    profile: str,
    placement_start: int,
    placement_size: int,
    mig_uuid: str | None,
    gpu_instance_id: int | None,
    compute_instance_id: int | None,
) -> None:
    for field, value, upper in (
        ("containerIndex", container_index, _INT64_MAX),
        ("deviceIndex", device_index, _INT64_MAX),
        ("placement.start", placement_start, _UINT32_MAX),
        ("placement.size", placement_size, _UINT32_MAX),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
            raise MigAnnotationError(f"{where}: {field} must be an integer in [0, {upper}], got {value!r}")
    if not isinstance(gpu_uuid, str) or not gpu_uuid:
        raise MigAnnotationError(f"{where}: gpuUUID is missing or empty")
    if not isinstance(profile, str) or not profile:
        raise MigAnnotationError(f"{where}: profile is missing or empty")
    if placement_size == 0:
        raise MigAnnotationError(f"{where}: placement.size must not be 0")
    runtime = {
        "migUUID": mig_uuid,
        "gpuInstanceID": gpu_instance_id,
        "computeInstanceID": compute_instance_id,
    }
    present = [k for k, v in runtime.items() if v is not None]
    if 0 < len(present) < 3:
        missing = [k for k in runtime if k not in present]
        raise MigAnnotationError(
            f"{where}: partial runtime identity: {', '.join(present)} set but {', '.join(missing)} missing"
            " (all three or none)"
        )
    if mig_uuid is not None and (not isinstance(mig_uuid, str) or not mig_uuid):
        raise MigAnnotationError(f"{where}: migUUID must be a non-empty string")
    for field, ident in (("gpuInstanceID", gpu_instance_id), ("computeInstanceID", compute_instance_id)):
        if ident is None:
            continue
        if isinstance(ident, bool) or not isinstance(ident, int) or not 0 <= ident <= _UINT32_MAX:
            raise MigAnnotationError(
                f"{where}: {field} must be an integer in [0, {_UINT32_MAX}], got {ident!r}"
            )


def encode_mig_allocations(records: Iterable[MigAllocationRecord]) -> str:
    """Serialise like Go's json.Marshal of HAMi's struct: field order, compact, omitempty runtime fields.

    Raises MigAnnotationError on duplicate (containerIndex, deviceIndex) so we never write an annotation
    that HAMi (or our own decoder) would reject.
    """
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for i, rec in enumerate(records):
        key = (rec.container_index, rec.device_index)
        if key in seen:
            raise MigAnnotationError(
                f"entry {i}: duplicate allocation for containerIndex {key[0]} deviceIndex {key[1]}"
            )
        seen.add(key)
        item: dict[str, Any] = {
            "containerIndex": rec.container_index,
            "deviceIndex": rec.device_index,
            "gpuUUID": rec.gpu_uuid,
            "profile": rec.profile,
            "placement": {"start": rec.placement_start, "size": rec.placement_size},
        }
        if rec.has_runtime_identity:
            item["migUUID"] = rec.mig_uuid
            item["gpuInstanceID"] = rec.gpu_instance_id
            item["computeInstanceID"] = rec.compute_instance_id
        out.append(item)
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _req_int(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry.get(key, 0)  # Go decodes a missing int as 0, which HAMi accepts for the indices
    if isinstance(value, bool) or not isinstance(value, int):
        raise MigAnnotationError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _opt_int(entry: Mapping[str, Any], key: str, where: str) -> int | None:
    value = entry.get(key)  # a missing or null pointer id stays absent, as in Go
    if value is None:
        return None
    return _req_int(entry, key, where)


def _decode_entry(i: int, entry: Any) -> MigAllocationRecord:
    where = f"entry {i}"
    if not isinstance(entry, dict):
        raise MigAnnotationError(f"{where}: must be a JSON object, got {type(entry).__name__}")
    for key in ("gpuUUID", "profile"):
        value = entry.get(key)
        if value is None or value == "":
            raise MigAnnotationError(f"{where}: {key} is missing or empty")
        if not isinstance(value, str):
            raise MigAnnotationError(f"{where}: {key} must be a string, got {value!r}")
    placement = entry.get("placement")
    if placement is None:
        raise MigAnnotationError(f"{where}: placement is missing")
    if not isinstance(placement, dict):
        raise MigAnnotationError(f"{where}: placement must be an object with start and size")
    start = _req_int(placement, "start", f"{where}: placement")
    size = _req_int(placement, "size", f"{where}: placement")
    if size == 0:
        raise MigAnnotationError(f"{where}: placement.size is missing or 0")
    mig_uuid = entry.get("migUUID")
    if mig_uuid is not None and not isinstance(mig_uuid, str):
        raise MigAnnotationError(f"{where}: migUUID must be a string, got {mig_uuid!r}")
    values = (
        _req_int(entry, "containerIndex", where),
        _req_int(entry, "deviceIndex", where),
        entry["gpuUUID"],
        entry["profile"],
        start,
        size,
        # Go's omitempty treats "" as absent, so an empty migUUID is "not set" exactly as in HAMi.
        mig_uuid or None,
        _opt_int(entry, "gpuInstanceID", where),
        _opt_int(entry, "computeInstanceID", where),
    )
    # Check with the entry's position in the message (the constructor would name the record's indices).
    _check_values(where, *values)
    return MigAllocationRecord(*values)


def decode_mig_allocations(raw: str) -> list[MigAllocationRecord]:
    """Parse the annotation value. An empty string means "no MIG allocations" (HAMi returns nil)."""
    if raw == "":
        return []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MigAnnotationError(f"{MIG_ALLOCATIONS_ANNOTATION} is not valid JSON: {exc}") from exc
    if data is None:
        return []  # Go unmarshals `null` into a nil slice
    if not isinstance(data, list):
        raise MigAnnotationError(
            f"{MIG_ALLOCATIONS_ANNOTATION} must be a JSON array, got {type(data).__name__}"
        )
    records: list[MigAllocationRecord] = []
    seen: dict[tuple[int, int], int] = {}
    for i, entry in enumerate(data):
        rec = _decode_entry(i, entry)
        key = (rec.container_index, rec.device_index)
        if key in seen:
            raise MigAnnotationError(
                f"entry {i}: duplicate allocation for containerIndex {key[0]} deviceIndex {key[1]}"
                f" (first at entry {seen[key]})"
            )
        seen[key] = i
        records.append(rec)
    return records
