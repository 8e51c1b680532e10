"""Issue 21, point 9: a node's plugin credentials change the status of its own node's claims only.

The chart's plugin ServiceAccount, RBAC and node-scope policies are rendered by the real `helm` and
applied to the real API server (1.37). 1.37 already checks claim status writes per node itself
(DRAResourceClaimGranularStatusAuthorization), which the test shows first; the chart also accepts
1.34 and 1.35, where `resourceclaims/status` patch is all the API server checks. The test then grants
the plugin what those versions grant implicitly (`arbitrary-node:patch` on resourceclaims/driver and
`resourceclaims/binding`), so only the chart's policy stands between a token bound to a plugin pod on
node A and the claims of node B: B's claim is refused with the policy's message, A's claim takes a
status.devices entry of our driver, and neither allocation, reservedFor nor another driver's entry
can be changed.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .chart_render import DRIVER, Raw, api_error, render, token_client, wait_for
from .cluster import ControlPlane
from .k8sobjects import create_namespace, model

OTHER_DRIVER = "other.example.com"
MERGE = "application/merge-patch+json"
TEMPLATES = ("templates/serviceaccounts.yaml", "templates/rbac-kubeletplugin.yaml")
POLICIES = "templates/validatingadmissionpolicy.yaml"


def claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "r0", "exactly": {"deviceClassName": f"mig.{DRIVER}"}},
                    {"name": "r1", "exactly": {"deviceClassName": "other"}},
                ]
            }
        },
    }


def allocation(node: str) -> dict[str, Any]:
    """As kube-scheduler and the controller write it: results + matchFields metadata.name In [node]."""
    return {
        "devices": {
            "results": [
                {"request": "r0", "driver": DRIVER, "pool": node, "device": "gpu-0"},
                {"request": "r1", "driver": OTHER_DRIVER, "pool": node, "device": "nic-0"},
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def device_entry(driver: str, node: str, device: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"driver": driver, "pool": node, "device": device, "data": data}


def plugin_token(raw: Raw, core: Any, namespace: str, sa: str, node: str) -> str:
    """A token of the plugin ServiceAccount bound to a pod on `node`, as the DaemonSet's pod gets."""
    pod = core.create_namespaced_pod(
        namespace,
        model(
            k8s.V1Pod,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"plugin-{node}"},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": sa,
                    "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
                },
            },
        ),
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
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }
    out = raw.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token", request)
    return str(out["status"]["token"])


def refusal(call: Callable[[], Any], wanted: str, status: int | None = 403, timeout_s: float = 30.0) -> str:
    """Retry `call` (a dry run) until the API server refuses it with a message containing `wanted`
    (the policy and the RBAC grant take effect a moment after they are created)."""
    deadline = time.monotonic() + timeout_s
    last = "accepted"
    while time.monotonic() < deadline:
        try:
            call()
        except ApiException as exc:
            last = api_error(exc)
            if wanted in last:
                assert status is None or exc.status == status, (exc.status, last)
                return last
        time.sleep(0.5)
    raise AssertionError(f"not refused with {wanted!r} after {timeout_s:.0f}s; last answer: {last}")


def test_a_plugin_token_changes_only_its_own_nodes_claim_status(
    control_plane: ControlPlane, helm_bin: Path, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, namespace, claims_ns = f"cs{suffix}", f"flexmig-cs-{suffix}", f"claims-{suffix}"
    node_a, node_b = f"cs-a-{suffix}", f"cs-b-{suffix}"
    shown = [arg for t in (*TEMPLATES, POLICIES) for arg in ("--show-only", t)]
    docs = render(helm_bin, tmp_path, *shown, namespace=namespace, release=release)
    plugin_sa = next(
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("kubelet-plugin")
    )
    user = f"system:serviceaccount:{namespace}:{plugin_sa}"
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{claims_ns}/resourceclaims"
    emulation = f"{release}-emulate-1-35"
    with control_plane.api_client() as api:
        raw, core = Raw(api), k8s.CoreV1Api(api)
        try:
            create_namespace(api, namespace)
            create_namespace(api, claims_ns)
            for node in (node_a, node_b):
                core.create_node(
                    model(k8s.V1Node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
                )
            for doc in docs:
                raw.apply(doc, dry_run=False)
            for name, node in (("claim-a", node_a), ("claim-b", node_b)):
                created = raw.request("POST", claims_path, claim_body(name))
                created["status"] = {
                    "allocation": allocation(node),
                    "devices": [device_entry(OTHER_DRIVER, node, "nic-0", {"mac": "x"})],
                }
                raw.request("PUT", f"{claims_path}/{name}/status", created)
            token = plugin_token(raw, core, namespace, plugin_sa, node_a)
            ours_b = {
                "status": {
                    "devices": [
                        device_entry(OTHER_DRIVER, node_b, "nic-0", {"mac": "x"}),
                        device_entry(DRIVER, node_b, "gpu-0", {"migUUID": "MIG-b"}),
                    ]
                }
            }
            with token_client(control_plane, token) as plugin_api:
                as_plugin = Raw(plugin_api)

                def patch(name: str, body: dict[str, Any], dry: bool = True) -> dict[str, Any]:
                    query = [("dryRun", "All")] if dry else []
                    path = f"{claims_path}/{name}/status"
                    return as_plugin.request("PATCH", path, body, content_type=MERGE, query=query)

                # 1.37 itself (a validation error, before admission): associated-node only reaches
                # claims allocated on the token's node.
                refusal(lambda: patch("claim-b", ours_b), "resourceclaims/driver", status=None)

                # What 1.34 and 1.35 allow any holder of resourceclaims/status patch.
                _grant_pre_136_status_rights(raw, emulation, namespace, plugin_sa, user)
                message = refusal(lambda: patch("claim-b", ours_b), "flexmig kubelet plugin")
                assert (
                    f"the flexmig kubelet plugin on node '{node_a}' may only change the status of claims "
                    f"allocated on its own node, not of one allocated on node '{node_b}'"
                ) in message, message
                with pytest.raises(ApiException) as real:  # the real request is refused the same way
                    patch("claim-b", ours_b, dry=False)
                assert real.value.status == 403, api_error(real.value)

                # Its own node's claim: our driver's entry yes ...
                ours_a = {
                    "status": {
                        "devices": [
                            device_entry(OTHER_DRIVER, node_a, "nic-0", {"mac": "x"}),
                            device_entry(DRIVER, node_a, "gpu-0", {"migUUID": "MIG-a"}),
                        ]
                    }
                }
                patch("claim-a", ours_a, dry=False)
                # ... but not allocation (immutable once set, but it can be cleared), reservedFor or
                # another driver's entry.
                cleared = {"status": {"allocation": None, "devices": None}}
                assert "not status.allocation or status.reservedFor" in refusal(
                    lambda: patch("claim-a", cleared), "flexmig"
                )
                reserve = {
                    "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}]}
                }
                assert "not status.allocation or status.reservedFor" in refusal(
                    lambda: patch("claim-a", reserve), "flexmig"
                )
                other = {
                    "status": {
                        "devices": [
                            device_entry(OTHER_DRIVER, node_a, "nic-0", {"mac": "evil"}),
                            device_entry(DRIVER, node_a, "gpu-0", {"migUUID": "MIG-a"}),
                        ]
                    }
                }
                assert f"entries of driver {DRIVER}" in refusal(lambda: patch("claim-a", other), "flexmig")
                # Its own node's pods: the HAMi mirror annotation only.
                pod = f"/api/v1/namespaces/{namespace}/pods/plugin-{node_a}"
                mirror = {"metadata": {"annotations": {"hami.io/vgpu-mig-allocations": "[]"}}}
                as_plugin.request("PATCH", pod, mirror, content_type=MERGE)
                dry = [("dryRun", "All")]
                for change in (
                    {"metadata": {"annotations": {"example.com/other": "x"}}},
                    {"metadata": {"labels": {"app": "x"}}},
                    {"spec": {"activeDeadlineSeconds": 5}},
                ):
                    assert "hami.io/vgpu-mig-allocations annotation" in refusal(
                        functools.partial(
                            as_plugin.request, "PATCH", pod, change, content_type=MERGE, query=dry
                        ),
                        "flexmig",
                    )
            # What the API server holds: A's status has our entry, B's is untouched.
            held = {  # as sent, less the nulls the server fills in (conditions)
                n: [
                    {k: v for k, v in d.items() if v is not None}
                    for d in raw.request("GET", f"{claims_path}/{n}")["status"]["devices"]
                ]
                for n in ("claim-a", "claim-b")
            }
            assert held["claim-a"] == ours_a["status"]["devices"]
            assert held["claim-b"] == [device_entry(OTHER_DRIVER, node_b, "nic-0", {"mac": "x"})]
        finally:
            _cleanup(raw, core, docs, emulation, (namespace, claims_ns), (node_a, node_b))


def _grant_pre_136_status_rights(raw: Raw, name: str, namespace: str, sa: str, user: str) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [DRIVER, OTHER_DRIVER],
                "verbs": ["arbitrary-node:patch"],
            },
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }
    raw.request("POST", f"{rbac}/clusterroles", role)
    raw.request("POST", f"{rbac}/clusterrolebindings", binding)

    def granted() -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "group": "resource.k8s.io",
                    "resource": "resourceclaims",
                    "subresource": "driver",
                    "verb": "arbitrary-node:patch",
                    "name": DRIVER,
                    "namespace": "x",
                },
            },
        }
        out = raw.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(out["status"].get("allowed"))

    wait_for(granted, 30, "the emulated 1.35 grant")


def _cleanup(
    raw: Raw,
    core: Any,
    docs: list[dict[str, Any]],
    emulation: str,
    namespaces: tuple[str, ...],
    nodes: tuple[str, ...],
) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    paths = [f"{rbac}/clusterroles/{emulation}", f"{rbac}/clusterrolebindings/{emulation}"]
    for doc in docs:
        if not doc["metadata"].get("namespace") or doc["metadata"]["namespace"] == "default":
            with contextlib.suppress(ApiException, AssertionError):
                ns = doc["metadata"].get("namespace")
                paths.append(
                    f"{raw.collection(doc['apiVersion'], doc['kind'], ns)}/{doc['metadata']['name']}"
                )
    for path in paths:
        with contextlib.suppress(ApiException):
            raw.request("DELETE", path)
    for ns in namespaces:
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)
    for node in nodes:
        with contextlib.suppress(ApiException):
            core.delete_node(node)
