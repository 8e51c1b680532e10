"""Which bad ResourceClaims the real API server refuses itself, and which it stores for flexmig's
controller to refuse (docs/reliability.md, "ResourceClaims": the "where it is seen" column). A claim the
API server accepts is exactly what the controller's unit-level rows (tests/unit/reliability) decide."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.kube.rest import request as rest

from .cluster import ControlPlane
from .k8sobjects import create_namespace

# The webhook installed by the chart, as test_webhook.py runs it (module-scoped: one install here).
from .test_webhook import Installed, api_message, ca_pem, create_pod, gpu_pod, installed, pods_ns

__all__ = ["ca_pem", "installed", "pods_ns"]  # fixtures used by name

MIG = f"mig.{DRIVER_NAME}"


@pytest.fixture(scope="module")
def claims_ns(control_plane: ControlPlane) -> Iterator[tuple[Any, str]]:
    namespace = f"bad-input-{uuid.uuid4().hex[:6]}"
    with control_plane.api_client() as api:
        create_namespace(api, namespace)
        try:
            yield api, namespace
        finally:
            rest(api, "DELETE", f"/api/v1/namespaces/{namespace}")


def _claim(name: str, **exactly: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": MIG, **exactly}}]}},
    }


def _create(api: Any, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = rest(
        api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", body
    )
    return result


def _selector(expression: str) -> dict[str, Any]:
    return {"selectors": [{"cel": {"expression": expression}}]}


@pytest.mark.parametrize(
    ("name", "exactly"),
    [
        ("count-1000", {"count": 1000}),
        ("all-mode", {"allocationMode": "All"}),
        ("runtime-error", _selector(f'device.attributes["{DRIVER_NAME}"].noSuchAttribute == "x"')),
        ("type-error", _selector(f'device.attributes["{DRIVER_NAME}"].profile > 3')),
        ("matches-nothing", _selector(f'device.attributes["{DRIVER_NAME}"].profile == "9g.99gb"')),
    ],
)
def test_claims_the_api_server_stores_for_the_controller_to_refuse(
    claims_ns: tuple[Any, str], name: str, exactly: dict[str, Any]
) -> None:
    api, ns = claims_ns
    stored = _create(api, ns, _claim(name, **exactly))
    assert stored["metadata"]["name"] == name
    assert not (stored.get("status") or {}).get("allocation")


@pytest.mark.parametrize(
    ("name", "exactly", "fragment"),
    [
        ("no-compile", _selector("device.attributes["), "compilation failed"),
        ("unknown-var", _selector("request.size > 1"), "undeclared reference to 'request'"),
    ],
)
def test_claims_the_api_server_refuses_itself(
    claims_ns: tuple[Any, str], name: str, exactly: dict[str, Any], fragment: str
) -> None:
    api, ns = claims_ns
    with pytest.raises(ApiException) as refused:
        _create(api, ns, _claim(name, **exactly))
    assert refused.value.status == 422, refused.value.body
    body = str(refused.value.body)
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in body and fragment in body, body


def test_legacy_resources_only_in_requests_pass_the_api_servers_validation(
    installed: Installed, pods_ns: str
) -> None:
    """Alone, `nvidia.com/gpu` in requests without limits is refused by the API server ("Limit must be
    set for non overcommitable resources"); the mutating webhook removes it before validation, so the pod
    is admitted as if the value were in limits (docs/reliability.md row L13)."""
    body = gpu_pod("requests-only", {})
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}
    }
    pod = create_pod(installed, pods_ns, body)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources.get("claims") == [{"name": "main-gpu"}]
    assert not any(
        k.startswith("nvidia.com/") for part in ("limits", "requests") for k in resources.get(part) or {}
    )
    assert {"name": ALLOCATION_GATE} in pod["spec"]["schedulingGates"]
    assert pod["spec"]["resourceClaims"] == [
        {"name": "main-gpu", "resourceClaimTemplateName": "flexmig-any-1x8000mi-c10"}
    ]


def test_legacy_limits_and_requests_that_differ_are_denied_by_the_webhook(
    installed: Installed, pods_ns: str
) -> None:
    body = gpu_pod("differ", {"nvidia.com/gpu": "1"})
    body["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "2"}
    with pytest.raises(ApiException) as denied:
        create_pod(installed, pods_ns, body)
    message = api_message(denied.value)
    assert (
        denied.value.status == 400
        and "nvidia.com/gpu differs between limits ('1') and requests ('2')" in message
    )
