"""One real `helm install` of `deployments/helm/flexmig` against the real API server.

The objects exist, the policies type-check, RBAC grants what the components need and no more
(SubjectAccessReviews), the node-scope policy lets a plugin token write only its own node's
ResourceSlices and pods, the webhook fails closed for GPU pods only; then `helm uninstall` removes the
cluster-scoped objects. Workloads never run (no kubelet).
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .chart_render import (
    CHART,
    DRIVER,
    WEBHOOK_ON,
    Raw,
    api_error,
    first_refusal,
    token_client,
    wait_for,
)
from .cluster import ControlPlane
from .k8sobjects import create_namespace, model

RELEASE = "flexmig"
NAMESPACE = "flexmig-helm-e2e"
PLUGIN_SA = f"{RELEASE}-kubelet-plugin"
CONTROLLER_SA = f"{RELEASE}-controller"
CHART_DEVICE_CLASSES = (f"mig.{DRIVER}", DRIVER)


def slice_body(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def pod_body(name: str, node: str | None = None, gpu: bool = False, sa: str | None = None) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": "c", "image": "registry.invalid/none:1"}
    if gpu:
        ctr["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}
    spec: dict[str, Any] = {"containers": [ctr]}
    if node:
        spec["nodeName"] = node
    if sa:
        spec["serviceAccountName"] = sa
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def can(
    api: Any, user: str, *, verb: str, resource: str, group: str = "", name: str = "", ns: str = ""
) -> bool:
    sub, _, subresource = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": group,
                "resource": sub,
                "subresource": subresource,
                "verb": verb,
                "name": name,
                "namespace": ns,
            },
        },
    }
    out = Raw(api).request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(out["status"].get("allowed"))


@contextlib.contextmanager
def device_classes_restored(raw: Raw) -> Iterator[None]:
    """Other e2e modules create `mig.gpu.flexmig.dev` for their own use; put back what was there."""
    before: dict[str, dict[str, Any]] = {}
    for name in CHART_DEVICE_CLASSES:
        with contextlib.suppress(ApiException):
            before[name] = raw.request("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
    try:
        yield
    finally:
        for name, obj in before.items():
            body = {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {"name": name},
                "spec": obj["spec"],
            }
            with contextlib.suppress(ApiException):
                raw.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body)


def test_install_and_uninstall(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"helm-e2e-a-{suffix}", f"helm-e2e-b-{suffix}"
    gpu_ns = f"helm-e2e-gpu-{suffix}"
    with control_plane.api_client() as api, device_classes_restored(Raw(api)):
        raw = Raw(api)
        core = k8s.CoreV1Api(api)
        installed = False
        try:
            control_plane.helm(
                "install",
                RELEASE,
                str(CHART),
                "-n",
                NAMESPACE,
                "--create-namespace",
                "--take-ownership",
                "--timeout",
                "2m",
                *WEBHOOK_ON,
            )
            installed = True
            _check_objects(raw, core)
            _check_rbac(api)
            for node in (node_a, node_b):
                core.create_node(
                    model(k8s.V1Node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
                )
            _check_node_scope_policy(control_plane, api, raw, core, node_a, node_b)
            _check_webhook_scope(api, raw, core, gpu_ns)
        finally:
            if installed:
                control_plane.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "2m")
            for node in (node_a, node_b):
                with contextlib.suppress(ApiException):
                    core.delete_node(node)
            for ns in (gpu_ns, NAMESPACE):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(ns)
            for name in (f"{node_a}-own", f"{node_b}-foreign"):
                with contextlib.suppress(ApiException):
                    raw.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}")
        # Cluster-scoped objects go with the release.
        for path in (
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}.{DRIVER}",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{RELEASE}-slices-node-scope.{DRIVER}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{PLUGIN_SA}",
            f"/apis/resource.k8s.io/v1/deviceclasses/{DRIVER}",
        ):
            with pytest.raises(ApiException) as gone:
                raw.request("GET", path)
            assert gone.value.status == 404, path


def _check_objects(raw: Raw, core: Any) -> None:
    for name in CHART_DEVICE_CLASSES:
        dc = raw.request("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        assert dc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for cm in ("device-config", "node-config"):
        core.read_namespaced_config_map(f"{RELEASE}-{cm}", NAMESPACE)
    for sa in (PLUGIN_SA, CONTROLLER_SA):
        core.read_namespaced_service_account(sa, NAMESPACE)
        raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{sa}")
        raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{sa}")
    raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/{CONTROLLER_SA}")
    raw.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER_SA}")
    raw.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{PLUGIN_SA}")
    services = {
        svc: core.read_namespaced_service(svc, NAMESPACE).spec
        for svc in (f"{CONTROLLER_SA}-metrics", f"{PLUGIN_SA}-metrics")
    }
    # In-cluster by default: no NodePort taken on every node.
    assert {
        svc: (spec.type, spec.ports[0].port, spec.ports[0].node_port) for svc, spec in services.items()
    } == {
        f"{CONTROLLER_SA}-metrics": ("ClusterIP", 31993, None),
        f"{PLUGIN_SA}-metrics": ("ClusterIP", 31992, None),
    }
    hook = raw.request(
        "GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}.{DRIVER}"
    )
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == f"{RELEASE}-webhook"
    for kind in ("slices", "pods", "claims"):
        name = f"{RELEASE}-{kind}-node-scope.{DRIVER}"
        base = "/apis/admissionregistration.k8s.io/v1"
        raw.request("GET", f"{base}/validatingadmissionpolicybindings/{name}")

        def type_checked(name: str = name, base: str = base) -> dict[str, Any] | None:
            policy = raw.request("GET", f"{base}/validatingadmissionpolicies/{name}")
            status: dict[str, Any] = policy.get("status") or {}
            done = status.get("observedGeneration") == policy["metadata"]["generation"]
            return status if done else None

        # kube-controller-manager type-checks every expression against the matched types' schemas
        # and records the result (observedGeneration, typeChecking.expressionWarnings).
        status = wait_for(type_checked, 60, f"type checking of {name}")
        assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


def _check_rbac(api: Any) -> None:
    ctrl = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER_SA}"
    plugin = f"system:serviceaccount:{NAMESPACE}:{PLUGIN_SA}"
    res = "resource.k8s.io"
    # What the controller needs, including the 1.36+ synthetic subresources ...
    assert can(api, ctrl, verb="update", resource="resourceclaims/binding", group=res)
    assert can(api, ctrl, verb="update", resource="resourceclaims/status", group=res, ns="ns1", name="c")
    assert can(
        api,
        ctrl,
        verb="arbitrary-node:update",
        resource="resourceclaims/driver",
        group=res,
        ns="ns1",
        name=DRIVER,
    )
    assert can(api, ctrl, verb="create", resource="resourceclaimtemplates", group=res, ns="ns1")
    # The webhook stamps a template's last use; the leader deletes unused ones.
    for verb in ("patch", "delete"):
        assert can(api, ctrl, verb=verb, resource="resourceclaimtemplates", group=res, ns="ns1", name="t")
    assert can(api, ctrl, verb="patch", resource="pods", ns="ns1", name="p")
    assert can(
        api,
        ctrl,
        verb="update",
        resource="leases",
        group="coordination.k8s.io",
        ns=NAMESPACE,
        name="flexmig-controller",
    )
    hooks = "admissionregistration.k8s.io"
    assert can(
        api,
        ctrl,
        verb="patch",
        resource="mutatingwebhookconfigurations",
        group=hooks,
        name=f"{RELEASE}.{DRIVER}",
    )
    # The plugin's Node events: in the default namespace only.
    assert can(api, plugin, verb="create", resource="events", ns="default")
    assert not can(api, plugin, verb="create", resource="events", ns="ns1")
    # The self-generated webhook certificate: its own Secret only.
    cert = f"{RELEASE}-webhook-cert"
    for verb in ("get", "update"):
        assert can(api, ctrl, verb=verb, resource="secrets", ns=NAMESPACE, name=cert)
    assert can(api, ctrl, verb="create", resource="secrets", ns=NAMESPACE)
    assert not can(api, ctrl, verb="get", resource="secrets", ns=NAMESPACE, name="other")
    assert not can(api, ctrl, verb="create", resource="secrets", ns="ns1")
    # Preemption's and moves' promises for the next leader: its own ConfigMap only.
    for verb in ("get", "update"):
        assert can(api, ctrl, verb=verb, resource="configmaps", ns=NAMESPACE, name="flexmig-room-state")
    assert can(api, ctrl, verb="create", resource="configmaps", ns=NAMESPACE)
    assert not can(api, ctrl, verb="update", resource="configmaps", ns=NAMESPACE, name="other")
    assert not can(api, ctrl, verb="create", resource="configmaps", ns="ns1")
    # ... and not more.
    assert not can(
        api, ctrl, verb="patch", resource="mutatingwebhookconfigurations", group=hooks, name="other"
    )
    assert not can(api, ctrl, verb="create", resource="pods", ns="ns1")
    assert not can(api, ctrl, verb="list", resource="secrets", ns=NAMESPACE)
    assert not can(api, ctrl, verb="create", resource="resourceslices", group=res)
    assert not can(
        api, ctrl, verb="update", resource="leases", group="coordination.k8s.io", ns=NAMESPACE, name="other"
    )
    assert not can(
        api,
        ctrl,
        verb="arbitrary-node:update",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name="x.io",
    )
    # The plugin: its node's slices and claims' device status, never allocations or another driver.
    assert can(api, plugin, verb="create", resource="resourceslices", group=res)
    assert can(
        api,
        plugin,
        verb="associated-node:patch",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name=DRIVER,
    )
    assert not can(
        api,
        plugin,
        verb="arbitrary-node:patch",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name=DRIVER,
    )
    assert not can(api, plugin, verb="update", resource="resourceclaims/binding", group=res)
    assert not can(api, plugin, verb="delete", resource="pods", ns="ns1", name="p")
    assert not can(api, plugin, verb="get", resource="secrets", ns=NAMESPACE, name="x")
    assert not can(api, plugin, verb="create", resource="deviceclasses", group=res)


def _check_node_scope_policy(
    control_plane: ControlPlane, api: Any, raw: Raw, core: Any, node_a: str, node_b: str
) -> None:
    """A token bound to a plugin pod on node A: A's slices and pods yes, B's no."""
    plugin_pod = core.create_namespaced_pod(
        NAMESPACE, model(k8s.V1Pod, pod_body(f"plugin-{node_a}", node=node_a, sa=PLUGIN_SA))
    )
    core.create_namespaced_pod(
        NAMESPACE, model(k8s.V1Pod, pod_body(f"other-{node_b}", node=node_b, sa=PLUGIN_SA))
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": plugin_pod.metadata.name,
                "uid": plugin_pod.metadata.uid,
            },
        },
    }
    token = raw.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{PLUGIN_SA}/token", request)[
        "status"
    ]["token"]
    # The claim the policy relies on is really in the token (ServiceAccountTokenPodNodeInfo).
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["kubernetes.io"]["node"]["name"] == node_a

    with token_client(control_plane, token) as plugin_api:
        as_plugin = Raw(plugin_api)
        slices = "/apis/resource.k8s.io/v1/resourceslices"
        own = as_plugin.request("POST", slices, slice_body(f"{node_a}-own", node_a))
        own["spec"]["devices"][0]["attributes"]["type"] = {"string": "mig"}
        as_plugin.request("PUT", f"{slices}/{node_a}-own", own)

        dry = [("dryRun", "All")]

        def denied(method: str, path: str, body: Any, *, content_type: str = "application/json") -> str:
            exc = first_refusal(
                lambda: as_plugin.request(method, path, body, content_type=content_type, query=dry)
            )
            assert exc.status == 403, api_error(exc)
            # The dry run was refused; the real request must be refused the same way.
            with pytest.raises(ApiException) as real:
                as_plugin.request(method, path, body, content_type=content_type)
            assert real.value.status == 403, api_error(real.value)
            return api_error(real.value)

        assert f"may only modify ResourceSlices of its own node, not those of node '{node_b}'" in denied(
            "POST", slices, slice_body(f"{node_b}-foreign", node_b)
        )
        assert "of driver gpu.flexmig.dev" in denied(
            "POST", slices, slice_body(f"{node_a}-x", node_a, "other.example.com")
        )
        # Another node's slice (here created by an admin) can be neither changed nor deleted.
        raw.request("POST", slices, slice_body(f"{node_b}-foreign", node_b))
        foreign = raw.request("GET", f"{slices}/{node_b}-foreign")  # the plugin only lists (by node)
        foreign["spec"]["devices"] = []
        assert node_b in denied("PUT", f"{slices}/{node_b}-foreign", foreign)
        assert node_b in denied("DELETE", f"{slices}/{node_b}-foreign", None)
        as_plugin.request("DELETE", f"{slices}/{node_a}-own")

        # Pods: the mirror annotation on a pod of its own node, not on another node's pod.
        patch = {"metadata": {"annotations": {"hami.io/vgpu-mig-allocations": "x"}}}
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        as_plugin.request(
            "PATCH", f"{pods}/plugin-{node_a}", patch, content_type="application/merge-patch+json"
        )
        assert "may only modify pods bound to its own node" in denied(
            "PATCH", f"{pods}/other-{node_b}", patch, content_type="application/merge-patch+json"
        )


def _check_webhook_scope(api: Any, raw: Raw, core: Any, gpu_ns: str) -> None:
    """No controller runs, so the webhook has no backend: GPU pods fail closed, all others pass."""
    create_namespace(api, gpu_ns)
    pods = f"/api/v1/namespaces/{gpu_ns}/pods"
    dry = [("dryRun", "All")]  # sideEffects None: the webhook is consulted in dry runs too
    exc = first_refusal(lambda: raw.request("POST", pods, pod_body("gpu", gpu=True), query=dry))
    assert f'failed calling webhook "pods.{DRIVER}"' in api_error(exc), api_error(exc)
    raw.request("POST", pods, pod_body("plain"), query=dry)
    # The opt-out label on the pod does not bypass the webhook (only an administrator's namespace
    # label does): it fails closed like any other GPU pod. The release namespace bypasses it.
    opted_out = pod_body("gpu-opted-out", gpu=True)
    opted_out["metadata"]["labels"] = {"gpu.flexmig.dev/webhook": "disabled"}
    exc = first_refusal(lambda: raw.request("POST", pods, opted_out, query=dry))
    assert f'failed calling webhook "pods.{DRIVER}"' in api_error(exc), api_error(exc)
    raw.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body("gpu", gpu=True, sa=PLUGIN_SA), query=dry
    )
