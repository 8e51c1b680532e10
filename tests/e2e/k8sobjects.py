"""Objects a kubelet would normally maintain, for e2e tests that run no kubelet, and namespace hygiene.

`create_ready_node` / `heartbeat_node` write what a registering kubelet writes (a Ready Node and its
Lease); `create_namespace` waits for the default ServiceAccount that pods need, `delete_namespace`
until the namespace is gone; `gated_pods` lists the pods a flexmig controller would pick up and
`wait_no_gated_pods` waits until another test's are gone; `model` turns a camelCase JSON body into a
`kubernetes` client model.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from api.constants import ALLOCATION_GATE
from controller.kube.rest import request

from .cluster import ControlPlaneError, wait_until

M = TypeVar("M")


def model(cls: type[M], obj: dict[str, Any]) -> M:
    """Build a `kubernetes` client model from its camelCase JSON form (`Model.from_dict`)."""
    built = cls.from_dict(obj)  # type: ignore[attr-defined]
    assert built is not None
    return built  # type: ignore[no-any-return]


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def create_ready_node(
    api: Any,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    capacity: Mapping[str, str] | None = None,
    wait_s: float = 60.0,
) -> None:
    """Create a Node object with a Ready condition, allocatable resources and a node Lease, and wait
    until it is schedulable.

    This is what a registering kubelet writes; with no kubelet running, the node stays schedulable
    only while `heartbeat_node` is called (the node-lifecycle controller's grace period is ~50s). The
    API server puts `node.kubernetes.io/not-ready:NoSchedule` on every new node, and the node
    lifecycle controller removes it once it has seen the node Ready: 0.2 s on an idle machine,
    seconds on a loaded one. Until then kube-scheduler and the flexmig controller both avoid the
    node, so a test that expects a pod there must not start before (`wait_s=0`: do not wait).
    """
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api)
    cap = dict(capacity or {"cpu": "64", "memory": "512Gi", "pods": "110"})
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    core.create_node(
        model(
            k8s.V1Node,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}},
        )
    )
    heartbeat_node(api, name, capacity=cap)
    if wait_s:

        def schedulable() -> bool:
            taints = core.read_node(name).spec.taints or []
            return not any(t.key == NOT_READY_TAINT for t in taints)

        wait_until(schedulable, wait_s, f"node {name} to lose the {NOT_READY_TAINT} taint")


def heartbeat_node(api: Any, name: str, *, capacity: Mapping[str, str] | None = None) -> None:
    """Refresh the node's Ready condition and renew its Lease (what kubelet does periodically)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(api)
    now = _now_rfc3339()
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "e2e kubelet stand-in",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ]
    }
    if capacity is not None:
        status["capacity"] = dict(capacity)
        status["allocatable"] = dict(capacity)
    core.patch_node_status(name, {"status": status})

    coord = k8s.CoordinationV1Api(api)
    micro = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro},
    }
    try:
        coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": lease["spec"]})
    except ApiException as exc:
        if exc.status != 404:
            raise
        coord.create_namespaced_lease("kube-node-lease", model(k8s.V1Lease, lease))


def create_namespace(api: Any, name: str, timeout_s: float = 60.0) -> None:
    """Create a namespace and wait until its default ServiceAccount exists (pods need it)."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api)
    core.create_namespace(
        model(k8s.V1Namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    )
    wait_until(
        lambda: core.read_namespaced_service_account("default", name) is not None,
        timeout_s,
        f"serviceaccount {name}/default",
    )


def delete_namespace(api: Any, name: str, timeout_s: float = 60.0) -> None:
    """Delete a namespace and wait until it is gone, so that nothing in it outlives the test."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(api)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    wait_until(gone, timeout_s, f"namespace {name} to be deleted")


def gated_pods(api: Any, skip_namespaces: Collection[str] = ()) -> list[str]:
    """`namespace/name` of every pod that still carries flexmig's allocation gate and is not being
    deleted, outside `skip_namespaces`: the pods any flexmig controller that starts now would place on
    whatever nodes it sees."""
    items: list[dict[str, Any]] = request(api, "GET", "/api/v1/pods")["items"]
    found = []
    for pod in items:
        meta = pod["metadata"]
        gates = (pod.get("spec") or {}).get("schedulingGates") or ()
        if (
            meta["namespace"] not in skip_namespaces
            and not meta.get("deletionTimestamp")
            and any(g.get("name") == ALLOCATION_GATE for g in gates)
        ):
            found.append(f"{meta['namespace']}/{meta['name']}")
    return found


def wait_no_gated_pods(api: Any, skip_namespaces: Collection[str], timeout_s: float = 60.0) -> None:
    """Wait until no pod outside `skip_namespaces` waits for a flexmig controller (`gated_pods`); fail
    naming them if some remain. A namespace another test is deleting gets `timeout_s` to go."""
    try:
        wait_until(lambda: not gated_pods(api, skip_namespaces), timeout_s, "other tests' gated pods to go")
    except ControlPlaneError:
        left = gated_pods(api, skip_namespaces)
        assert not left, (
            f"pods gated for flexmig that an earlier test left behind: {left}; a controller started now "
            "would place them on this test's nodes (delete the namespace at the end of that test)"
        )


def restore_device_classes(api: Any, saved: Mapping[str, Mapping[str, Any]]) -> None:
    """Create again the DeviceClasses a test's chart install replaced (best effort: a class already
    back is left as it is)."""
    from kubernetes.client.exceptions import ApiException

    for name, obj in saved.items():
        body = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": {"name": name},
            "spec": obj["spec"],
        }
        try:
            request(api, "POST", "/apis/resource.k8s.io/v1/deviceclasses", body)
        except ApiException:
            continue
