"""Hostile names in a pod spec, through the service's own review handler (the real rewrite, the real
claim lookup, an in-memory API recording every request): the pod is denied with a message naming the
field, and no request leaves the pod's namespace. Path helpers escape every segment."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wh_fakeapi import FakeApi

from controller.kube import rest
from controller.kube.names import namespaced_path
from controller.shim import ShimDefaults
from controller.webhook import WebhookService, WebhookSettings
from controller.webhook.flexmigclaims import FlexmigClaims
from controller.webhook.templates import templates_path

NS = "team-a"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
HOSTILE = [
    "../../secrets/x",
    "../../../../api/v1/namespaces/kube-system/secrets/flexmig-webhook-cert",
    "a?watch=true",
    "x/../../y",
    "UPPER",
    "a" * 254,
    "%2e%2e%2fx",
    "x#y",
]


def review(claims: list[dict[str, Any]], namespace: str = NS) -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims},
    }
    request = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": pod,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


@pytest.fixture
def service(fake_api: FakeApi) -> Any:
    fake_api.put(
        CLAIMS,
        {
            "metadata": {"name": "mine"},
            "spec": {
                "devices": {
                    "requests": [{"name": "r", "exactly": {"deviceClassName": "mig.gpu.flexmig.dev"}}]
                }
            },
        },
    )
    fake_api.calls.clear()
    svc = WebhookService(
        None, WebhookSettings(port=0, hosts=("127.0.0.1",)), ShimDefaults(), is_leader=lambda: True
    )
    yield svc
    svc.stop()


@pytest.mark.parametrize("field", ["resourceClaimName", "resourceClaimTemplateName"])
@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_claim_name_is_denied_naming_the_field_and_nothing_leaves_the_namespace(
    service: Any, fake_api: FakeApi, field: str, name: str
) -> None:
    status, raw = service.handler(
        review([{"name": "ok", "resourceClaimName": "mine"}, {"name": "bad", field: name}])
    )
    response = json.loads(raw)["response"]
    assert status == 200 and response["allowed"] is False
    assert (response["status"]["code"], response["status"]["reason"]) == (400, "BadRequest")
    message = response["status"]["message"]
    assert message.startswith(f"spec.resourceClaims[1].{field}: "), message
    assert "is not a valid name: must be a DNS-1123 subdomain" in message
    # Nothing was requested for the bad name, and nothing outside the pod's namespace at all.
    assert all(path.startswith(f"/apis/resource.k8s.io/v1/namespaces/{NS}/") for _, path in fake_api.calls)
    assert not [path for _, path in fake_api.calls if name in path or "secrets" in path]
    assert fake_api.writes() == []


def test_a_valid_pod_claim_is_still_looked_up_in_its_namespace(service: Any, fake_api: FakeApi) -> None:
    _status, raw = service.handler(review([{"name": "ok", "resourceClaimName": "mine"}]))
    response = json.loads(raw)["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"  # gated
    assert fake_api.calls == [("GET", f"{CLAIMS}/mine")]


def test_a_missing_shim_template_named_by_hand_is_gated_not_denied(service: Any, fake_api: FakeApi) -> None:
    """A pod spec copied out of the cluster names a shim template that was collected meanwhile: its
    body follows from its name, so the pod is gated and the controller creates it once the pod exists."""
    _status, raw = service.handler(
        review([{"name": "g", "resourceClaimTemplateName": "flexmig-mig-1x8000mi-c0"}])
    )
    response = json.loads(raw)["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert fake_api.writes() == []


def test_flexmig_claims_refuses_an_unchecked_name_without_a_request(fake_api: FakeApi) -> None:
    """Defence in depth: the lookup itself never builds a path from a bad name."""
    claims = FlexmigClaims(None)
    for entry in ({"resourceClaimName": "../../secrets/x"}, {"resourceClaimTemplateName": "a?watch=true"}):
        with pytest.raises(ValueError, match="is not a valid name"):
            claims.uses_flexmig(NS, entry)
    with pytest.raises(ValueError, match="is not a valid namespace name"):
        claims.uses_flexmig("../kube-system", {"resourceClaimName": "x"})
    assert fake_api.calls == []


def test_path_helpers_escape_every_segment() -> None:
    assert (
        rest.claim_path("ns", "../x", "status")
        == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/..%2Fx/status"
    )
    assert rest.pod_path("a/b", "p?watch=true") == "/api/v1/namespaces/a%2Fb/pods/p%3Fwatch%3Dtrue"
    assert rest.lease_path("ns", "l#x") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l%23x"
    assert rest.lease_path("../x") == "/apis/coordination.k8s.io/v1/namespaces/..%2Fx/leases"
    assert templates_path("ns", "flexmig-mig-1x1mi-c0") == (
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates/flexmig-mig-1x1mi-c0"
    )
    for bad in (("../x", "n"), ("ns", "../x"), ("ns", "A")):
        with pytest.raises(ValueError):
            namespaced_path("/api/v1", bad[0], "pods", bad[1])
