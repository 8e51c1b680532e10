"""The chart's preflight check per node, against the real control plane (templates/_preflight.tpl).

The chart refuses only where another GPU manager's DaemonSet and flexmig's kubelet plugin share a
node. The other DaemonSets here are placed by the real DaemonSet controller (and scheduler) onto
Node objects the tests create; nothing runs their pods (no kubelet), which is all the check reads:
each pod's node, or, while a DaemonSet has no pods, its node selector. Every other DaemonSet selects
only this test's nodes by a label of its own, so nodes of other tests cannot change the outcome.
While no node is one flexmig's plugin would run on, the check cannot tell and refuses wherever the
other one runs; so the cases that pass keep a node for flexmig that the other one avoids, and the
cases of no such node point flexmig at a label of their own that no node has.

Installs that must succeed are real (`helm install`) where the point is the install, and otherwise
`helm template --dry-run=server`, which runs the same `lookup`s and leaves nothing to remove.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .chart_render import CHART, KUBE_VERSION, WEBHOOK_ON, Raw, wait_for
from .cluster import ControlPlane
from .k8sobjects import create_namespace, delete_namespace, model
from .test_helm_chart_install import device_classes_restored

pytestmark = pytest.mark.e2e

GPU = {"nvidia.com/gpu.present": "true"}  # the GPU Operator's label, in the plugin's default affinity
MARK = "flexmig-e2e/preflight"  # which of this test's nodes another DaemonSet selects
POOL = "flexmig-e2e/pool"  # which of this test's nodes flexmig's plugin is pointed at
RANK = "flexmig-e2e/rank"  # a number, for a Gt requirement the check cannot judge
NVIDIA = {"app": "nvidia-device-plugin-daemonset"}
MIG_MANAGER = {"app": "nvidia-mig-manager"}


@contextlib.contextmanager
def _nodes(core: k8s.CoreV1Api, labels_by_node: Mapping[str, Mapping[str, str]]) -> Iterator[None]:
    """Node objects with these labels (no kubelet, no status), deleted afterwards."""
    try:
        for name, labels in labels_by_node.items():
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
            core.create_node(model(k8s.V1Node, body))
        yield
    finally:
        for name in labels_by_node:
            with contextlib.suppress(ApiException):
                core.delete_node(name)


def _daemonset(
    name: str,
    labels: Mapping[str, str],
    node_selector: Mapping[str, str],
    affinity: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "nodeSelector": dict(node_selector),
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
    }
    if affinity:
        pod_spec["affinity"] = dict(affinity)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": pod_spec,
            },
        },
    }


def _owned_pod_nodes(raw: Raw, namespace: str, uid: str) -> set[str]:
    """The nodes of a DaemonSet's pods: bound, or pinned by the controller's metadata.name term."""
    nodes: set[str] = set()
    for pod in raw.request("GET", f"/api/v1/namespaces/{namespace}/pods").get("items") or ():
        if not any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or ()):
            continue
        spec = pod["spec"]
        if spec.get("nodeName"):
            nodes.add(spec["nodeName"])
            continue
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        for term in required.get("nodeSelectorTerms") or ():
            for field in term.get("matchFields") or ():
                if field["key"] == "metadata.name" and field["operator"] == "In":
                    nodes.update(field["values"])
    return nodes


@contextlib.contextmanager
def _foreign(
    api: Any,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    node_selector: Mapping[str, str],
    *,
    on_nodes: set[str] | None,
    no_pods: bool = False,
    affinity: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """Another GPU manager's DaemonSet in its own namespace, placed where `on_nodes` says (waited
    for); `no_pods`: a ResourceQuota of 0 pods keeps the DaemonSet controller from creating any, so
    only its selector can tell where it would run. Everything is deleted afterwards, its pods with
    grace 0 (no kubelet would ever confirm a graceful deletion)."""
    raw, core = Raw(api), k8s.CoreV1Api(api)
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    create_namespace(api, namespace)
    try:
        if no_pods:
            quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"}}
            quota["spec"] = {"hard": {"pods": "0"}}
            raw.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
        created = raw.request("POST", path, _daemonset(name, labels, node_selector, affinity))
        uid = created["metadata"]["uid"]

        def settled() -> bool:
            ds = raw.request("GET", f"{path}/{name}")
            status = ds.get("status") or {}
            if status.get("observedGeneration") != ds["metadata"]["generation"]:
                return False
            if no_pods:
                return status.get("desiredNumberScheduled") == 1
            return _owned_pod_nodes(raw, namespace, uid) == on_nodes

        wait_for(settled, 60, f"the DaemonSet controller to place {namespace}/{name}")
        if no_pods:
            assert not _owned_pod_nodes(raw, namespace, uid), "the ResourceQuota let a pod through"
        yield
    finally:
        with contextlib.suppress(ApiException):
            raw.request("DELETE", f"{path}/{name}")
        wait_for(lambda: name not in _names(raw, path), 30, f"daemonset {namespace}/{name} to go")
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, f"the pods of {namespace} to go")
        delete_namespace(api, namespace)


def _names(raw: Raw, path: str) -> set[str]:
    return {item["metadata"]["name"] for item in raw.request("GET", path).get("items") or ()}


def _required(expressions: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod affinity that requires a node matching all these node selector requirements."""
    terms = [{"matchExpressions": expressions}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _template(control_plane: ControlPlane, *args: str) -> Any:
    """`helm template` with the cluster's `lookup` (the preflight check runs, nothing is created)."""
    return control_plane.helm(
        "template",
        "pf",
        str(CHART),
        "-n",
        "pf-e2e",
        "--dry-run=server",
        "--kube-version",
        KUBE_VERSION,
        *WEBHOOK_ON,
        *args,
        check=False,
    )


def test_daemonset_on_a_node_without_gpu_labels_installs(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    gpu, cpu = f"pf-gpu-{suffix}", f"pf-cpu-{suffix}"
    release, other = f"pf-ok-{suffix}", f"pf-nvidia-{suffix}"
    with (
        control_plane.api_client() as api,
        device_classes_restored(Raw(api)),
        # `gpu` is flexmig's: without it no node would be, and the check would refuse (next tests).
        _nodes(k8s.CoreV1Api(api), {gpu: GPU, cpu: {MARK: suffix}}),
        _foreign(api, other, "nvidia-device-plugin-daemonset", NVIDIA, {MARK: suffix}, on_nodes={cpu}),
    ):
        args = ("install", release, str(CHART), "-n", release, "--create-namespace", "--take-ownership")
        try:
            control_plane.helm(*args, *WEBHOOK_ON)
        finally:
            control_plane.helm("uninstall", release, "-n", release, "--wait", "--timeout", "2m", check=False)
            with contextlib.suppress(ApiException):
                delete_namespace(api, release)
        # The check did see that DaemonSet and its node: a plugin allowed onto that node refuses.
        marked = _required([{"key": MARK, "operator": "Exists"}])
        refused = _template(control_plane, "--set-json", f"kubeletPlugin.affinity={json.dumps(marked)}")
        assert refused.returncode != 0
        assert (
            f"daemonset {other}/nvidia-device-plugin-daemonset) runs on 1 of flexmig's GPU nodes: {cpu}."
            in (refused.stderr)
        ), refused.stderr


@pytest.mark.parametrize("keep_off", ["nodeSelector", "affinity"])
def test_flexmig_kept_off_the_daemonsets_nodes_passes(control_plane: ControlPlane, keep_off: str) -> None:
    """Both are on GPU nodes, but flexmig's plugin is pointed at other ones."""
    suffix = uuid.uuid4().hex[:6]
    shared, own = f"pf-a-{suffix}", f"pf-b-{suffix}"
    other = f"pf-nvidia-{suffix}"
    if keep_off == "nodeSelector":
        values = ("--set-json", f"kubeletPlugin.nodeSelector={json.dumps({POOL: suffix})}")
    else:  # the GPU label as in the default affinity, and not where the other one is
        gpu_not_marked: list[dict[str, Any]] = [
            {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
            {"key": MARK, "operator": "DoesNotExist"},
        ]
        values = ("--set-json", f"kubeletPlugin.affinity={json.dumps(_required(gpu_not_marked))}")
    with (
        control_plane.api_client() as api,
        _nodes(k8s.CoreV1Api(api), {shared: {**GPU, MARK: suffix}, own: {**GPU, POOL: suffix}}),
        _foreign(api, other, "nvidia-device-plugin-daemonset", NVIDIA, {MARK: suffix}, on_nodes={shared}),
    ):
        passed = _template(control_plane, *values)
        assert passed.returncode == 0, passed.stderr
        # Without that value both would run on `shared`.
        refused = _template(control_plane)
        assert refused.returncode != 0
        assert f"runs on 1 of flexmig's GPU nodes: {shared}." in refused.stderr, refused.stderr


@pytest.mark.parametrize("overlap", [1, 4])
def test_overlap_on_gpu_nodes_refuses_naming_them(control_plane: ControlPlane, overlap: int) -> None:
    suffix = uuid.uuid4().hex[:6]
    shared = [f"pf-{i}-{suffix}" for i in range(overlap)]
    apart = f"pf-x-{suffix}"  # a GPU node the other one's affinity keeps it off: never named
    release, other = f"pf-no-{suffix}", f"pf-nvidia-{suffix}"
    ds_name = "nvidia-device-plugin-daemonset"
    # The other one's pods, not its selector, say where it runs: the check cannot judge Gt (it would
    # count `apart` as shared), the DaemonSet controller can.
    nodes = {n: {**GPU, MARK: suffix, RANK: "5"} for n in shared} | {apart: {**GPU, MARK: suffix, RANK: "1"}}
    above_3 = _required([{"key": RANK, "operator": "Gt", "values": ["3"]}])
    with (
        control_plane.api_client() as api,
        _nodes(k8s.CoreV1Api(api), nodes),
        _foreign(api, other, ds_name, NVIDIA, {MARK: suffix}, on_nodes=set(shared), affinity=above_3),
    ):
        args = ("install", release, str(CHART), "-n", release, "--create-namespace", "--take-ownership")
        refused = control_plane.helm(*args, *WEBHOOK_ON, check=False)
        try:
            assert refused.returncode != 0, refused.stdout
            named = shared[0] if overlap == 1 else f"{', '.join(shared[:3])} and 1 more"
            expected = (
                f"preflight: NVIDIA's device plugin (daemonset {other}/{ds_name}) runs on {overlap} of "
            )
            assert f"{expected}flexmig's GPU nodes: {named}." in refused.stderr, refused.stderr
            assert apart not in refused.stderr
            assert "preflight.allowCoexistence=true" in refused.stderr
            assert control_plane.helm("status", release, "-n", release, check=False).returncode != 0
        finally:
            with contextlib.suppress(ApiException):
                delete_namespace(api, release)  # --create-namespace may have made it before the refusal


def test_daemonset_without_pods_is_judged_by_its_node_selector(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    shared, apart = f"pf-m-{suffix}", f"pf-n-{suffix}"
    other, ds_name = f"pf-mig-{suffix}", "nvidia-mig-manager"
    with (
        control_plane.api_client() as api,
        _nodes(k8s.CoreV1Api(api), {shared: {**GPU, MARK: suffix}, apart: GPU}),
        _foreign(api, other, ds_name, MIG_MANAGER, {MARK: suffix}, on_nodes=None, no_pods=True),
    ):
        refused = _template(control_plane)
        assert refused.returncode != 0
        expected = (
            f"the GPU Operator's MIG manager (daemonset {other}/{ds_name}) runs on 1 of flexmig's GPU nodes"
        )
        assert f"{expected}: {shared}." in refused.stderr, refused.stderr
        assert _template(control_plane, "--set", "preflight.allowCoexistence=true").returncode == 0


def test_no_node_for_flexmig_refuses_while_another_runs(control_plane: ControlPlane) -> None:
    """GPU nodes still to come (a pool scaling from zero, labels not yet set): the chart cannot tell
    whether the other one will share them with flexmig, so it refuses until told."""
    suffix = uuid.uuid4().hex[:6]
    cpu, own = f"pf-c-{suffix}", f"pf-o-{suffix}"
    release, other, ds_name = f"pf-none-{suffix}", f"pf-nvidia-{suffix}", "nvidia-device-plugin-daemonset"
    # flexmig's plugin is pointed at a label no node has yet (and the default GPU affinity): none runs it.
    nowhere = ("--set-json", f"kubeletPlugin.nodeSelector={json.dumps({POOL: suffix})}")
    with (
        control_plane.api_client() as api,
        device_classes_restored(Raw(api)),
        _nodes(k8s.CoreV1Api(api), {cpu: {MARK: suffix}}),
        _foreign(api, other, ds_name, NVIDIA, {MARK: suffix}, on_nodes={cpu}),
    ):
        refused = _template(control_plane, *nowhere)
        assert refused.returncode != 0
        expected = (
            f"preflight: NVIDIA's device plugin (daemonset {other}/{ds_name}) runs on 1 node: {cpu}; and no "
            "current node is one flexmig's kubelet plugin would run on"
        )
        assert expected in refused.stderr, refused.stderr
        assert "so the chart cannot tell whether they will share nodes" in refused.stderr, refused.stderr
        assert "--set preflight.allowCoexistence=true" in refused.stderr, refused.stderr

        args = ("install", release, str(CHART), "-n", release, "--create-namespace", "--take-ownership")
        try:
            control_plane.helm(*args, *WEBHOOK_ON, *nowhere, "--set", "preflight.allowCoexistence=true")
            assert control_plane.helm("status", release, "-n", release, check=False).returncode == 0
        finally:
            control_plane.helm("uninstall", release, "-n", release, "--wait", "--timeout", "2m", check=False)
            with contextlib.suppress(ApiException):
                delete_namespace(api, release)

        # Once a node of flexmig's exists, the check judges per node again: the other one avoids it.
        with _nodes(k8s.CoreV1Api(api), {own: {**GPU, POOL: suffix}}):
            passed = _template(control_plane, *nowhere)
            assert passed.returncode == 0, passed.stderr


def test_no_node_for_flexmig_and_another_scheduled_nowhere_refuses(control_plane: ControlPlane) -> None:
    """Another manager scheduled to no node while no node is flexmig's either (a GPU pool that scales
    from zero): both would arrive with the first GPU node, so the chart refuses until confirmed."""
    suffix = uuid.uuid4().hex[:6]
    other, ds_name = f"pf-mig-{suffix}", "nvidia-mig-manager"
    nowhere = ("--set-json", f"kubeletPlugin.nodeSelector={json.dumps({POOL: suffix})}")
    with (
        control_plane.api_client() as api,
        _foreign(api, other, ds_name, MIG_MANAGER, {MARK: suffix}, on_nodes=set()),
    ):
        ds = Raw(api).request("GET", f"/apis/apps/v1/namespaces/{other}/daemonsets/{ds_name}")
        assert ds["status"].get("desiredNumberScheduled", 0) == 0, ds["status"]
        refused = _template(control_plane, *nowhere)
        assert refused.returncode != 0, refused.stdout
        assert f"{other}/{ds_name}) exists, scheduled to no node yet" in refused.stderr, refused.stderr
        assert "no current node is one flexmig's kubelet plugin would run on" in refused.stderr
        confirmed = _template(control_plane, *nowhere, "--set", "preflight.allowCoexistence=true")
        assert confirmed.returncode == 0, confirmed.stderr
