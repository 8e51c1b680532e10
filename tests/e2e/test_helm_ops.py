"""Day-2 operations of the chart against the real control plane: preflight, `helm test`'s checks,
and an uninstall that leaves nothing behind.

- preflight: with a DaemonSet of NVIDIA's device plugin running on a GPU node, where flexmig's
  kubelet plugin would run too, `helm install` fails and names it (`lookup` in
  templates/_preflight.tpl); `preflight.allowCoexistence=true` installs. The check per node:
  test_helm_preflight.py.
- the `helm test` script (files/check_serving.py), run here with a token of the test hook's own
  ServiceAccount and RBAC, reads a release none of whose workloads runs and reports exactly what is
  not serving, so its API paths, selectors and permissions are the real ones. The real `helm test`
  of a release whose workloads serve is test_helm_test_hook.py; the pod's spec is checked in
  test_helm_chart.py.
- uninstall: no object of the release is left, the webhook certificate Secret included, and a
  ResourceClaimTemplate made by the webhook's real TemplateEnsurer in a user namespace is deleted
  by the garbage collector once the chart's DeviceClasses go.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
import uuid
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.shim import Mode, Shape
from controller.shim.templates import template_for
from controller.webhook.templates import TemplateEnsurer

from .chart_render import CHART, DRIVER, KUBE_VERSION, WEBHOOK_ON, Raw, wait_for
from .cluster import ControlPlane
from .k8sobjects import create_namespace, model
from .test_helm_chart_install import device_classes_restored

pytestmark = pytest.mark.e2e
INSTANCE = "app.kubernetes.io/instance"


def _check_serving() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_serving", CHART / "files" / "check_serving.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_serving"] = mod
    spec.loader.exec_module(mod)
    return mod


def _daemonset(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
                },
            },
        },
    }


def test_preflight_refuses_next_to_nvidia_device_plugin(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, namespace, other = f"pf-{suffix}", f"pf-{suffix}", f"gpu-operator-{suffix}"
    node = f"pf-node-{suffix}"
    ds_name = "nvidia-device-plugin-daemonset"
    with control_plane.api_client() as api, device_classes_restored(Raw(api)):
        raw, core = Raw(api), k8s.CoreV1Api(api)
        installed = False
        try:
            # Labelled as a GPU node (the plugin's default affinity): both DaemonSets would run there.
            meta = {"name": node, "labels": {"nvidia.com/gpu.present": "true"}}
            core.create_node(model(k8s.V1Node, {"apiVersion": "v1", "kind": "Node", "metadata": meta}))
            create_namespace(api, other)
            ds_path = f"/apis/apps/v1/namespaces/{other}/daemonsets"
            raw.request("POST", ds_path, _daemonset(ds_name, {"app": "nvidia-device-plugin-daemonset"}))
            wait_for(
                lambda: (raw.request("GET", f"{ds_path}/{ds_name}").get("status") or {}).get(
                    "desiredNumberScheduled"
                ),
                60,
                "the DaemonSet controller to schedule the device plugin",
            )
            args = ("install", release, str(CHART), "-n", namespace, "--create-namespace", "--take-ownership")
            refused = control_plane.helm(*args, *WEBHOOK_ON, check=False)
            assert refused.returncode != 0, refused.stdout
            assert re.search(
                rf"preflight: NVIDIA's device plugin \(daemonset {other}/{ds_name}\) runs on \d+ of "
                r"flexmig's GPU nodes: ",
                refused.stderr,
            ), refused.stderr
            assert "preflight.allowCoexistence=true" in refused.stderr
            assert control_plane.helm("status", release, "-n", namespace, check=False).returncode != 0
            control_plane.helm(*args, *WEBHOOK_ON, "--set", "preflight.allowCoexistence=true")
            installed = True
        finally:
            if installed:
                control_plane.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "2m")
            # The DaemonSet must be gone before the next install's preflight looks; its pods never
            # ran (no kubelet), so they are removed with grace 0 or the namespace would hang.
            with contextlib.suppress(ApiException):
                raw.request("DELETE", f"/apis/apps/v1/namespaces/{other}/daemonsets/{ds_name}")
            wait_for(
                lambda: not _exists(raw, f"/apis/apps/v1/namespaces/{other}/daemonsets/{ds_name}"),
                30,
                "the DaemonSet to go",
            )
            with contextlib.suppress(ApiException):
                core.delete_collection_namespaced_pod(other, grace_period_seconds=0)
            for ns in (other, namespace):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(ns)
            with contextlib.suppress(ApiException):
                core.delete_node(node)


def _exists(raw: Raw, path: str) -> bool:
    try:
        raw.request("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _hook_rbac(control_plane: ControlPlane, release: str, namespace: str) -> list[dict[str, Any]]:
    """The test hook's ServiceAccount and RBAC as `helm test` creates them (the Pod is left out)."""
    out = control_plane.helm(
        "template",
        release,
        str(CHART),
        "-n",
        namespace,
        "--kube-version",  # `helm template` renders offline: without it helm assumes v1.20
        KUBE_VERSION,
        *WEBHOOK_ON,
        "--show-only",
        "templates/tests/test-serving.yaml",
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in docs} == {"test"}
    return [
        d
        for d in docs
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    ]


def _release_objects(raw: Raw, release: str, namespace: str) -> list[str]:
    selector = [("labelSelector", f"{INSTANCE}={release}")]
    found = []
    for base, plural in (
        ("/api/v1", "configmaps"),
        ("/api/v1", "secrets"),
        ("/api/v1", "services"),
        ("/api/v1", "serviceaccounts"),
        ("/api/v1", "pods"),
        ("/apis/apps/v1", "deployments"),
        ("/apis/apps/v1", "daemonsets"),
        ("/apis/rbac.authorization.k8s.io/v1", "roles"),
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
        ("/apis/policy/v1", "poddisruptionbudgets"),
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ):
        for item in raw.request("GET", f"{base}/namespaces/{namespace}/{plural}", query=selector)["items"]:
            found.append(f"{plural}/{item['metadata']['name']}")
    for base, plural in (
        ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
        ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
        ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"),
        ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies"),
        ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings"),
        ("/apis/resource.k8s.io/v1", "deviceclasses"),
    ):
        for item in raw.request("GET", f"{base}/{plural}", query=selector)["items"]:
            found.append(f"{plural}/{item['metadata']['name']}")
    return found


def test_helm_test_checks_and_clean_uninstall(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    # A release name holding the chart name is the object-name prefix (flexmig.fullname).
    release, namespace, user_ns = f"flexmig-ops-{suffix}", f"ops-{suffix}", f"ops-user-{suffix}"
    cs = _check_serving()
    with control_plane.api_client() as api, device_classes_restored(Raw(api)):
        raw, core = Raw(api), k8s.CoreV1Api(api)
        installed = False
        rbac: list[dict[str, Any]] = []
        path = ""  # the shim template, once made
        try:
            control_plane.helm(
                "install",
                release,
                str(CHART),
                "-n",
                namespace,
                "--create-namespace",
                "--take-ownership",
                *WEBHOOK_ON,
            )
            installed = True
            secret = raw.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{release}-webhook-cert")
            assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            assert not secret.get("data"), "Helm's Secret has no data: the controller fills it"

            # The test script with the hook's own identity: every read is permitted, and it names
            # each component that does not serve (no kubelet runs the pods here).
            rbac = _hook_rbac(control_plane, release, namespace)
            for obj in rbac:
                raw.apply(obj, dry_run=False)
            sa = f"{release}-test"
            token = raw.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 600},
                },
            )["status"]["token"]
            env = {
                "FLEXMIG_NAMESPACE": namespace,
                "FLEXMIG_CONTROLLER": f"{release}-controller",
                "FLEXMIG_CONTROLLER_PORT": "31993",
                "FLEXMIG_WEBHOOK_CONFIG": f"{release}.{DRIVER}",
                "FLEXMIG_PLUGIN": f"{release}-kubelet-plugin",
                "FLEXMIG_PLUGIN_PORT": "31992",
            }
            as_test = cs.Api(control_plane.server, token, str(control_plane.ca_file))
            plan = cs.plan(as_test, env)  # a 403 would raise here
            text = "\n".join(plan.problems)
            assert f"MutatingWebhookConfiguration {release}.{DRIVER}: caBundle is empty" in text, text
            assert f"DaemonSet {release}-kubelet-plugin: runs no pod" in text, text
            assert f"Deployment {release}-controller:" in text, text
            assert plan.probes == [], plan.probes
            assert cs.check(lambda: plan, 0) == plan.problems

            # A template as the webhook makes it, by the real ensurer: owned by the chart's class.
            create_namespace(api, user_ns)
            spec = template_for(
                user_ns, Shape(count=1, memory_mib=8000, memory_percent=None, cores=0, mode=Mode.MIG)
            )
            TemplateEnsurer(api).ensure([spec])
            path = f"/apis/resource.k8s.io/v1/namespaces/{user_ns}/resourceclaimtemplates/{spec.name}"
            owners = raw.request("GET", path)["metadata"]["ownerReferences"]
            assert {o["name"] for o in owners} == {f"mig.{DRIVER}"}
        finally:
            for obj in rbac:  # hooks: `helm test` deletes them when it passes; here we do
                with contextlib.suppress(ApiException):
                    meta = obj["metadata"]
                    raw.request(
                        "DELETE",
                        f"{raw.collection(obj['apiVersion'], obj['kind'], meta.get('namespace'))}/{meta['name']}",
                    )
            if installed:
                control_plane.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "2m")
        try:
            assert _release_objects(raw, release, namespace) == []
            with pytest.raises(ApiException) as gone:
                core.read_namespaced_secret(f"{release}-webhook-cert", namespace)
            assert gone.value.status == 404

            def template_gone() -> bool:
                try:
                    raw.request("GET", path)
                except ApiException as exc:
                    return bool(exc.status == 404)
                return False

            assert path, "the test stopped before it made a template"
            wait_for(template_gone, 60, "the garbage collector to delete the shim template")
        finally:
            for ns in (user_ns, namespace):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(ns)
