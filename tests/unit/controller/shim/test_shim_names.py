"""Names a pod spec hands the shim: claim and template names the API server would refuse are denied
before anything is looked up (they become request paths), naming the field; and a shim template name
stands for exactly one shape, so the controller can create a template from the name alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.shim import AdmissionDenied, Mode, Shape, ShimDefaults, mutate_pod
from controller.shim.templates import shape_from_name, template_for, template_name

HOSTILE = [
    "../../secrets/x",
    "a?watch=true",
    "x/../../y",
    "UPPER",
    "a" * 254,
    "..",
    "x#frag",
    "%2e%2e",
    "-leading",
    "",
]


def pod_with(claims: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims},
    }


@pytest.mark.parametrize("field", ["resourceClaimName", "resourceClaimTemplateName"])
@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_the_api_server_would_refuse_is_denied_before_any_lookup(field: str, name: str) -> None:
    looked_up: list[Mapping[str, Any]] = []

    def lookup(entry: Mapping[str, Any]) -> bool | None:
        looked_up.append(entry)
        return True

    claims = [{"name": "ok", "resourceClaimName": "fine"}, {"name": "bad", field: name}]
    with pytest.raises(AdmissionDenied) as denied:
        mutate_pod(pod_with(claims), "team-a", ShimDefaults(), lookup)
    message = denied.value.message
    assert message.startswith(f"spec.resourceClaims[1].{field}: "), message
    assert "is not a valid name: must be a DNS-1123 subdomain" in message
    assert "at most 253 characters" in message
    assert looked_up == []  # not even the valid entry's: nothing leaves before the spec is valid
    assert len(message) < 400  # a long name is shown cut, with its length
    if len(name) > 80:
        assert f"({len(name)} characters)" in message


def test_every_bad_name_is_reported_in_one_answer() -> None:
    claims = [
        {"name": "a", "resourceClaimTemplateName": "../x"},
        {"name": "b", "resourceClaimName": "Y"},
    ]
    with pytest.raises(AdmissionDenied) as denied:
        mutate_pod(pod_with(claims), "team-a", ShimDefaults(), lambda _e: True)
    assert "spec.resourceClaims[0].resourceClaimTemplateName" in denied.value.message
    assert "spec.resourceClaims[1].resourceClaimName" in denied.value.message


def test_valid_subdomain_names_pass_to_the_lookup() -> None:
    seen: list[str] = []

    def lookup(entry: Mapping[str, Any]) -> bool | None:
        seen.append(str(entry.get("resourceClaimTemplateName")))
        return False

    claims = [{"name": "a", "resourceClaimTemplateName": "my.template-1"}]
    result = mutate_pod(pod_with(claims), "team-a", ShimDefaults(), lookup)
    assert seen == ["my.template-1"] and result.patch == []


@given(
    count=st.integers(1, 32),
    memory=st.one_of(st.tuples(st.integers(1, 2**30), st.none()), st.tuples(st.none(), st.integers(1, 100))),
    cores=st.integers(0, 100),
    mode=st.sampled_from(list(Mode)),
)
def test_a_template_name_gives_back_its_shape(
    count: int, memory: tuple[int | None, int | None], cores: int, mode: Mode
) -> None:
    shape = Shape(count=count, memory_mib=memory[0], memory_percent=memory[1], cores=cores, mode=mode)
    back = shape_from_name(template_name(shape))
    assert back == shape
    assert template_for("ns", back) == template_for("ns", shape)


@pytest.mark.parametrize(
    "name",
    [
        "flexmig-mig-2x8000mi-c0",  # count > 1 without -d: written before the distinct rule
        "flexmig-mig-1x8000mi-c0-d",  # -d on one device
        "flexmig-hami-core-2x8000mi-c0-d",  # hami-core never takes -d
        "flexmig-mig-01x8000mi-c0",  # leading zero
        "flexmig-mig-33x8000mi-c0-d",  # above the API's 32 per claim
        "flexmig-mig-1x0mi-c0",
        "flexmig-mig-1x101pct-c0",
        "flexmig-mig-1x50pct-c101",
        "flexmig-vgpu-1x50pct-c0",
        "my-template",
        "../flexmig-mig-1x50pct-c0",
    ],
)
def test_names_the_shim_never_writes_stand_for_no_shape(name: str) -> None:
    assert shape_from_name(name) is None
