"""The pod webhook against the real API server, with input from untrusted pod authors and clients
(the chart and controller set up as in test_webhook.py, by its fixtures, for this module):

- an AdmissionReview sent straight to the webhook port by an anonymous client, for a pod that never
  exists, creates no template and no namespace;
- a pod labelled `gpu.flexmig.dev/webhook=disabled` is translated and gated all the same: only an
  administrator's namespace label opts out;
- a pod claim naming `../../secrets/x` (or `a?watch=true`, `x/../../y`) is denied naming the field.
"""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.kube.rest import request as rest

from . import test_webhook as wh
from .k8sobjects import create_namespace, delete_namespace
from .test_webhook import DRIVER, Installed, api_message, create_pod, eventually, gpu_pod, template_of

pytestmark = pytest.mark.e2e

# The module fixtures of test_webhook.py, instantiated again for this module (its own install).
installed = wh.installed
ca_pem = wh.ca_pem
pods_ns = wh.pods_ns


def anonymous_review(installed: Installed, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview sent straight to the webhook port, as any client that reaches it can: no
    client certificate, no API server, and a pod nobody creates."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "object": pod,
        },
    }
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", installed.port, context=ctx, timeout=10)
    try:
        conn.request("POST", "/mutate-pods", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        out: dict[str, Any] = json.loads(response.read())["response"]
        return out
    finally:
        conn.close()


def test_an_anonymous_review_for_a_pod_that_never_exists_creates_no_template(
    installed: Installed, pods_ns: str
) -> None:
    ghost_ns = f"wh-ghost-{uuid.uuid4().hex[:6]}"  # a namespace that does not exist either
    for namespace in (pods_ns, ghost_ns):
        answer = anonymous_review(
            installed, namespace, gpu_pod("ghost", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4321"})
        )
        assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"  # translated, nothing more
    # A barrier: a real pod created after the reviews gets its template, so the controller's template
    # sync has run past them; the ghost's template exists in neither namespace.
    real = create_pod(
        installed, pods_ns, gpu_pod("after-ghost", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4322"})
    )
    real_name = real["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    eventually(lambda: template_of(installed, pods_ns, real_name), 30, "the real pod's template")
    ghost_name = real_name.replace("4322mi", "4321mi")
    assert template_of(installed, pods_ns, ghost_name) is None
    assert template_of(installed, ghost_ns, ghost_name) is None
    with pytest.raises(ApiException) as missing:
        rest(installed.api, "GET", f"/api/v1/namespaces/{ghost_ns}")
    assert missing.value.status == 404


def test_a_pod_labelled_opted_out_is_gated_and_translated_all_the_same(
    installed: Installed, pods_ns: str
) -> None:
    body = gpu_pod("opted-out", {"nvidia.com/gpu": "1"})
    body["metadata"]["labels"] = {f"{DRIVER}/webhook": "disabled"}
    pod = create_pod(installed, pods_ns, body)
    assert {"name": ALLOCATION_GATE} in pod["spec"]["schedulingGates"]
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("flexmig-")


def test_a_namespace_an_administrator_labelled_disabled_is_not_sent(installed: Installed) -> None:
    namespace = f"wh-optout-{uuid.uuid4().hex[:6]}"
    create_namespace(installed.api, namespace)
    try:
        rest(
            installed.api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}",
            {"metadata": {"labels": {f"{DRIVER}/webhook": "disabled"}}},
            content_type="application/merge-patch+json",
        )

        def untouched() -> dict[str, Any] | None:
            pod = create_pod(installed, namespace, gpu_pod("hami", {"nvidia.com/gpu": "1"}), dry_run=True)
            return None if pod["spec"].get("schedulingGates") else pod

        pod = eventually(
            untouched, 30, "the namespace label to take the namespace out of the webhook's scope"
        )
        assert "resourceClaims" not in pod["spec"]
    finally:
        delete_namespace(installed.api, namespace)


@pytest.mark.parametrize("name", ["../../secrets/x", "a?watch=true", "x/../../y"])
def test_a_pod_claim_with_a_traversal_name_is_denied_naming_the_field(
    installed: Installed, pods_ns: str, name: str
) -> None:
    body = gpu_pod(
        "traversal",
        {},
        resourceClaims=[
            {"name": "ok", "resourceClaimName": "other-driver"},
            {"name": "bad", "resourceClaimTemplateName": name},
        ],
    )
    with pytest.raises(ApiException) as denied:
        create_pod(installed, pods_ns, body)
    message = api_message(denied.value)
    assert denied.value.status == 400, message
    assert (
        f"spec.resourceClaims[1].resourceClaimTemplateName: {json.dumps(name)} is not a valid name" in message
    )
    assert "DNS-1123 subdomain" in message


def test_no_permission_error_and_no_failed_step(installed: Installed, pods_ns: str) -> None:
    installed.alive()
    log = installed.log_text()
    assert "webhook maintenance step failed" not in log, log[-4000:]
    assert "forbidden" not in log.lower(), log[-4000:]
