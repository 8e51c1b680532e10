"""hami.io/vgpu-mig-allocations: HAMi-compatible encoding and every decode error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from driver.migannotation import (
    MigAllocationRecord,
    MigAnnotationError,
    decode_mig_allocations,
    encode_mig_allocations,
)

PLANNED = MigAllocationRecord(0, 0, "GPU-a", "2g.10gb", 2, 2)
REALISED = MigAllocationRecord(1, 0, "GPU-a", "1g.5gb", 0, 1, "MIG-b", 0, 0)


def _entry(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "containerIndex": 0,
        "deviceIndex": 0,
        "gpuUUID": "GPU-a",
        "profile": "2g.10gb",
        "placement": {"start": 2, "size": 2},
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def test_encode_matches_go_json_marshal() -> None:
    assert encode_mig_allocations([PLANNED, REALISED]) == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":2,"size":2}},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1},"migUUID":"MIG-b","gpuInstanceID":0,"computeInstanceID":0}]'
    )
    assert encode_mig_allocations([]) == "[]"


def test_round_trip_keeps_zero_ids() -> None:
    records = [PLANNED, REALISED]
    decoded = decode_mig_allocations(encode_mig_allocations(records))
    assert decoded == records
    assert decoded[1].has_runtime_identity and decoded[1].gpu_instance_id == 0
    assert not decoded[0].has_runtime_identity


def test_empty_and_null_mean_none() -> None:
    assert decode_mig_allocations("") == []
    assert decode_mig_allocations("null") == []


def test_empty_mig_uuid_counts_as_absent_like_go_omitempty() -> None:
    (rec,) = decode_mig_allocations(json.dumps([_entry(migUUID="")]))
    assert rec.mig_uuid is None


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([_entry(gpuUUID=...)], "entry 0: gpuUUID is missing"),
        ([_entry(gpuUUID="")], "entry 0: gpuUUID is missing"),
        ([_entry(profile=...)], "entry 0: profile is missing"),
        ([_entry(profile=7)], "entry 0: profile must be a string"),
        ([_entry(placement=...)], "entry 0: placement is missing"),
        ([_entry(placement=[2, 2])], "entry 0: placement must be an object"),
        ([_entry(placement={"start": 2, "size": 0})], r"entry 0: placement.size is missing or 0"),
        ([_entry(placement={"start": 2})], r"entry 0: placement.size is missing or 0"),
        ([_entry(placement={"start": -1, "size": 1})], r"entry 0: placement.start must be an integer"),
        ([_entry(placement={"start": "2", "size": 1})], r"entry 0: placement: start must be an integer"),
        ([_entry(containerIndex=-1)], "entry 0: containerIndex must be an integer"),
        ([_entry(deviceIndex=1.5)], "entry 0: deviceIndex must be an integer"),
        ([_entry(containerIndex=True)], "entry 0: containerIndex must be an integer"),
        (
            [_entry(migUUID="MIG-x")],
            "entry 0: partial runtime identity: migUUID set but gpuInstanceID, computeInstanceID",
        ),
        ([_entry(gpuInstanceID=1, computeInstanceID=0)], "entry 0: partial runtime identity"),
        ([_entry(computeInstanceID=0)], "entry 0: partial runtime identity"),
        ([_entry(migUUID=5, gpuInstanceID=1, computeInstanceID=0)], "entry 0: migUUID must be a string"),
        (
            [_entry(migUUID="M", gpuInstanceID=-1, computeInstanceID=0)],
            "entry 0: gpuInstanceID must be an integer",
        ),
        (
            [_entry(migUUID="M", gpuInstanceID=1, computeInstanceID="0")],
            "entry 0: computeInstanceID must be an integer",
        ),
        (
            [_entry(), _entry(profile="1g.5gb")],
            "entry 1: duplicate allocation for containerIndex 0 deviceIndex 0",
        ),
        (["x"], "entry 0: must be a JSON object"),
    ],
)
def test_decode_errors_name_entry_and_field(entries: list[Any], message: str) -> None:
    with pytest.raises(MigAnnotationError, match=message):
        decode_mig_allocations(json.dumps(entries))


@pytest.mark.parametrize(("raw", "message"), [("{", "not valid JSON"), ('{"a":1}', "must be a JSON array")])
def test_decode_rejects_non_arrays(raw: str, message: str) -> None:
    with pytest.raises(MigAnnotationError, match=message):
        decode_mig_allocations(raw)


def test_second_entry_error_is_reported_by_position() -> None:
    with pytest.raises(MigAnnotationError, match="entry 1: gpuUUID"):
        decode_mig_allocations(json.dumps([_entry(), _entry(deviceIndex=1, gpuUUID="")]))


def test_record_invariants() -> None:
    with pytest.raises(MigAnnotationError, match="partial runtime identity"):
        MigAllocationRecord(0, 0, "GPU-a", "1g.5gb", 0, 1, mig_uuid="MIG-x")
    with pytest.raises(MigAnnotationError, match=r"placement\.size"):
        MigAllocationRecord(0, 0, "GPU-a", "1g.5gb", 0, 0)
    with pytest.raises(MigAnnotationError, match="gpuUUID"):
        MigAllocationRecord(0, 0, "", "1g.5gb", 0, 1)
    with pytest.raises(MigAnnotationError, match="duplicate"):
        encode_mig_allocations([PLANNED, PLANNED])
