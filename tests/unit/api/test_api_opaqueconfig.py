"""Strict decoding of the gpu.flexmig.dev opaque-config types (api/opaqueconfig.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.opaqueconfig import (
    OpaqueConfigError,
    SharedGpuRequest,
    decode_parameters,
    known_types,
)

WHERE = "config[0].opaque.parameters"
KNOWN = "allowed: gpu.flexmig.dev/v1alpha1 SharedGpuRequest"


def _params(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "gpu.flexmig.dev/v1alpha1",
        "kind": "SharedGpuRequest",
        "memoryPercentage": 25,
    }
    return {k: v for k, v in (base | over).items() if v is not None}


def test_a_valid_shared_gpu_request_decodes_from_an_object_or_its_json() -> None:
    assert decode_parameters(WHERE, _params()) == SharedGpuRequest(25)
    assert decode_parameters(WHERE, json.dumps(_params())) == SharedGpuRequest(25)
    assert decode_parameters(WHERE, json.dumps(_params()).encode()) == SharedGpuRequest(25)
    assert known_types() == "gpu.flexmig.dev/v1alpha1 SharedGpuRequest"


@given(st.integers(1, 100))
def test_to_parameters_round_trips(pct: int) -> None:
    assert decode_parameters(WHERE, SharedGpuRequest(pct).to_parameters()) == SharedGpuRequest(pct)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # A typo in kind, or no kind at all, is refused with the list of known types.
        (_params(kind="SharedGPURequest"), f"{WHERE}.kind: 'SharedGPURequest' is not a known"),
        (_params(kind=None), f"{WHERE}.kind: None is not a known"),
        (
            _params(apiVersion="gpu.flexmig.dev/v2"),
            f"{WHERE}.apiVersion: 'gpu.flexmig.dev/v2' is not a known",
        ),
        (_params(apiVersion=None), f"{WHERE}.apiVersion: None is not a known"),
        (_params(kind=3), f"{WHERE}.kind: 3 is not a known"),
    ],
)
def test_an_unknown_type_is_refused_listing_the_known_ones(params: dict[str, Any], expected: str) -> None:
    with pytest.raises(OpaqueConfigError) as err:
        decode_parameters(WHERE, params)
    assert expected in str(err.value)
    assert KNOWN in str(err.value)


def test_unknown_fields_are_refused_naming_them_and_the_allowed_ones() -> None:
    with pytest.raises(OpaqueConfigError) as err:
        decode_parameters(WHERE, _params(memoryPercent=30, zeta=1))
    assert str(err.value) == (
        f"{WHERE}: unknown field(s) memoryPercent, zeta in SharedGpuRequest; "
        "allowed: apiVersion, kind, memoryPercentage"
    )


@pytest.mark.parametrize("bad", [0, 101, -5, "50", True, 12.5, None])
def test_memory_percentage_outside_1_to_100_is_refused(bad: Any) -> None:
    params = _params() | {"memoryPercentage": bad}
    with pytest.raises(OpaqueConfigError) as err:
        decode_parameters(WHERE, params)
    assert f"{WHERE}.memoryPercentage must be an integer in 1..100, got {bad!r}" == str(err.value)


def test_missing_memory_percentage_is_refused() -> None:
    with pytest.raises(OpaqueConfigError) as err:
        decode_parameters(WHERE, _params(memoryPercentage=None))
    assert f"{WHERE}.memoryPercentage is required" in str(err.value) and "1..100" in str(err.value)


@pytest.mark.parametrize("raw", ["{not json", b"[1, 2]", "42", None, ["SharedGpuRequest"]])
def test_parameters_that_are_not_an_object_are_refused(raw: Any) -> None:
    with pytest.raises(OpaqueConfigError) as err:
        decode_parameters(WHERE, raw)
    assert str(err.value).startswith(WHERE)


def test_the_type_itself_refuses_an_out_of_range_value() -> None:
    with pytest.raises(OpaqueConfigError, match=r"1\.\.100"):
        SharedGpuRequest(0)
