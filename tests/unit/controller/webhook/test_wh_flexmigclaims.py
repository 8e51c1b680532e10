"""Whether a pod's own claim uses flexmig devices: by class name, by the class's CEL, for claims and
templates, `exactly` and `firstAvailable`; unknown (None) when the object is not there; errors raise."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from wh_fakeapi import FakeApi

from controller.webhook.flexmigclaims import FlexmigClaims, is_flexmig_class, requested_classes

API = "/apis/resource.k8s.io/v1"


def device_class(name: str, expression: str = "") -> dict[str, Any]:
    spec = {"selectors": [{"cel": {"expression": expression}}]} if expression else {}
    return {"metadata": {"name": name}, "spec": spec}


def claim_spec(*classes: str, first_available: bool = False) -> dict[str, Any]:
    if first_available:
        request = {
            "name": "r",
            "firstAvailable": [{"name": f"a{i}", "deviceClassName": c} for i, c in enumerate(classes)],
        }
        return {"devices": {"requests": [request]}}
    return {
        "devices": {
            "requests": [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
        }
    }


def test_class_detection() -> None:
    assert is_flexmig_class(device_class("gpu.flexmig.dev"))
    assert is_flexmig_class(device_class("mig.gpu.flexmig.dev"))
    assert is_flexmig_class(device_class("big-mig", 'device.driver == "gpu.flexmig.dev"'))
    assert not is_flexmig_class(device_class("gpu.nvidia.com", 'device.driver == "gpu.nvidia.com"'))
    assert not is_flexmig_class(device_class("notgpu.flexmig.dev.example.com"))
    assert requested_classes(claim_spec("a", "b", first_available=True)) == {"a", "b"}


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "gpu.flexmig.dev"',
        "device.driver=='gpu.flexmig.dev'",
        '"gpu.flexmig.dev" == device.driver',
        'device.attributes["gpu.flexmig.dev"].profile == "1g.10gb"',
        "device.attributes[ 'gpu.flexmig.dev' ].memoryMiB >= 8000",
        'device.capacity["x"].a > 1 && device.driver == "gpu.flexmig.dev"',
    ],
)
def test_cel_selecting_the_driver(expression: str) -> None:
    assert is_flexmig_class(device_class("admin-class", expression))


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver != "gpu.flexmig.dev"',
        'device.driver == "x.gpu.flexmig.dev.example"',
        'device.driver == "gpu.flexmig.dev.example"',
        'device.driver == "x.gpu.flexmig.dev"',
        'device.attributes["x.gpu.flexmig.dev.example"].a == 1',
        'mydevice.driver == "gpu.flexmig.dev"',
        '"gpu.flexmig.dev" == device.driverName',
        '"gpu.flexmig.dev" != device.driver',
    ],
)
def test_cel_merely_mentioning_the_driver(expression: str) -> None:
    assert not is_flexmig_class(device_class("admin-class", expression))


@pytest.fixture
def cluster(fake_api: FakeApi) -> FakeApi:
    for c in (device_class("big-mig", 'device.driver == "gpu.flexmig.dev"'), device_class("gpu.nvidia.com")):
        fake_api.put(f"{API}/deviceclasses", c)
    ns = f"{API}/namespaces/team-a"
    fake_api.put(f"{ns}/resourceclaims", {"metadata": {"name": "mine"}, "spec": claim_spec("big-mig")})
    fake_api.put(
        f"{ns}/resourceclaims", {"metadata": {"name": "nvidia"}, "spec": claim_spec("gpu.nvidia.com")}
    )
    fake_api.put(
        f"{ns}/resourceclaimtemplates",
        {
            "metadata": {"name": "either"},
            "spec": {"spec": claim_spec("gpu.nvidia.com", "mig.gpu.flexmig.dev", first_available=True)},
        },
    )
    return fake_api


def test_claims_and_templates(cluster: FakeApi) -> None:
    check = FlexmigClaims(None).checker("team-a")
    assert check({"name": "a", "resourceClaimName": "mine"}) is True
    assert check({"name": "b", "resourceClaimName": "nvidia"}) is False
    assert check({"name": "c", "resourceClaimTemplateName": "either"}) is True
    assert check({"name": "d", "resourceClaimName": "not-yet"}) is None
    assert check({"name": "e"}) is False  # names nothing: API validation rejects the pod


def test_the_class_list_is_cached_for_the_ttl(cluster: FakeApi) -> None:
    now = [0.0]
    claims = FlexmigClaims(None, ttl_s=30, clock=lambda: now[0])
    assert claims.flexmig_classes() == {"big-mig"}
    cluster.put(f"{API}/deviceclasses", device_class("new.gpu.flexmig.dev"))
    now[0] = 10
    assert claims.flexmig_classes() == {"big-mig"}
    now[0] = 31
    assert claims.flexmig_classes() == {"big-mig", "new.gpu.flexmig.dev"}
    lists = [c for c in cluster.calls if c == ("GET", f"{API}/deviceclasses")]
    assert len(lists) == 2


def test_an_api_error_raises_so_the_webhook_fails_closed(cluster: FakeApi) -> None:
    cluster.fail[("GET", f"{API}/namespaces/team-a/resourceclaims/mine")] = 500
    with pytest.raises(ApiException):
        FlexmigClaims(None).uses_flexmig("team-a", {"name": "a", "resourceClaimName": "mine"})
