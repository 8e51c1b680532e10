"""Smoke tests of the real control plane: API, feature gates, identities and DRA scheduling."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import DRIVER_NAME as DRIVER

from .cluster import REQUIRED_FEATURES, ControlPlane
from .controller_env import device_class_body, eventually
from .k8sobjects import create_namespace, create_ready_node, heartbeat_node, model
from .objects import claim_body, pod_body

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.api_client() as client:
        yield client


def test_version_and_resource_api_versions(control_plane: ControlPlane, api: Any) -> None:
    info = k8s.VersionApi(api).get_code()
    assert info.git_version == "v1.37.2"
    groups: dict[str, Any] = {g.name: g for g in k8s.ApisApi(api).get_api_versions().groups}
    served = {v.version for v in groups["resource.k8s.io"].versions}
    assert {"v1", "v1beta1", "v1beta2"} <= served
    assert groups["resource.k8s.io"].preferred_version.version == "v1"


def test_dra_feature_gates_enabled(control_plane: ControlPlane) -> None:
    status, metrics = control_plane.get("/metrics")
    assert status == 200
    enabled = {}
    for line in metrics.splitlines():
        if line.startswith("kubernetes_feature_enabled{"):
            labels, value = line.rsplit(" ", 1)
            name = labels.split('name="', 1)[1].split('"', 1)[0]
            enabled[name] = float(value) == 1.0
    missing = [f for f in REQUIRED_FEATURES if not enabled.get(f)]
    assert not missing, f"features not enabled in kube-apiserver: {missing}"


def test_node_identity_kubeconfig(control_plane: ControlPlane) -> None:
    kubeconfig = control_plane.node_kubeconfig("e2e-identity-node")
    with control_plane.api_client(kubeconfig) as node_api:
        review = k8s.AuthenticationV1Api(node_api).create_self_subject_review(
            model(
                k8s.V1SelfSubjectReview,
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )
        )
    assert review.status is not None and review.status.user_info is not None
    user = review.status.user_info
    assert user.username == "system:node:e2e-identity-node"
    assert "system:nodes" in (user.groups or [])


# --------------------------------------------------------------------------------------------------
# DRA: a node publishing one GPU as partitionable devices (1.35+ layout), allocated by kube-scheduler


@pytest.fixture(scope="module")
def gpu_node(api: Any) -> Iterator[dict[str, str]]:
    """A Ready node with a two-slice pool: a counter set slice and a devices slice."""
    suffix = uuid.uuid4().hex[:6]
    node = f"e2e-node-{suffix}"
    pool = node
    create_ready_node(api, node)
    resource = k8s.ResourceV1Api(api)
    memory_slices = {f"memory-slice-{k}": {"value": "1"} for k in range(2)}
    counter_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-counters"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 2},
            "sharedCounters": [
                {
                    "name": "gpu-0-counter-set",
                    "counters": {**memory_slices, "memory": {"value": "80Gi"}},
                }
            ],
        },
    }
    device_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-devices"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 2},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                    "consumesCounters": [
                        {
                            "counterSet": "gpu-0-counter-set",
                            "counters": {**memory_slices, "memory": {"value": "80Gi"}},
                        }
                    ],
                },
                {
                    "name": "gpu-0-mig-1g40gb-0",
                    "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.40gb"}},
                    "capacity": {"memory": {"value": "40Gi"}},
                    "consumesCounters": [
                        {
                            "counterSet": "gpu-0-counter-set",
                            "counters": {"memory-slice-0": {"value": "1"}, "memory": {"value": "40Gi"}},
                        }
                    ],
                },
            ],
        },
    }
    resource.create_resource_slice(model(k8s.V1ResourceSlice, counter_slice))
    resource.create_resource_slice(model(k8s.V1ResourceSlice, device_slice))
    device_class = f"e2e-{suffix}.{DRIVER}"
    resource.create_device_class(model(k8s.V1DeviceClass, device_class_body(device_class)))
    namespace = f"e2e-{suffix}"
    create_namespace(api, namespace)
    yield {
        "node": node,
        "pool": pool,
        "class": device_class,
        "namespace": namespace,
        "counters": f"{node}-{DRIVER}-counters",
        "devices": f"{node}-{DRIVER}-devices",
    }
    k8s.CoreV1Api(api).delete_namespace(namespace)
    resource.delete_device_class(device_class)
    resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
    k8s.CoreV1Api(api).delete_node(node)


def test_resource_slices_with_shared_counters_accepted(api: Any, gpu_node: dict[str, str]) -> None:
    resource = k8s.ResourceV1Api(api)
    counters: Any = resource.read_resource_slice(gpu_node["counters"])
    assert counters.spec.shared_counters[0].name == "gpu-0-counter-set"
    assert counters.spec.shared_counters[0].counters["memory"].value == "80Gi"
    assert not counters.spec.devices
    devices: Any = resource.read_resource_slice(gpu_node["devices"])
    assert [d.name for d in devices.spec.devices] == ["gpu-0", "gpu-0-mig-1g40gb-0"]
    mig = devices.spec.devices[1]
    assert mig.consumes_counters[0].counter_set == "gpu-0-counter-set"
    assert mig.consumes_counters[0].counters["memory-slice-0"].value == "1"
    listed: Any = resource.list_resource_slice(
        field_selector=f"spec.driver={DRIVER},spec.nodeName={gpu_node['node']}"
    )
    assert sorted(s.metadata.name for s in listed.items) == sorted(
        [gpu_node["counters"], gpu_node["devices"]]
    )


def _claim(name: str, device_class: str, device_type: str) -> k8s.ResourceV1ResourceClaim:
    selector = f'device.attributes["{DRIVER}"].type == "{device_type}"'
    return model(k8s.ResourceV1ResourceClaim, claim_body(name, device_class, [selector]))


def _pod(name: str, claim: str) -> k8s.V1Pod:
    return model(k8s.V1Pod, pod_body(name, claim))


def test_scheduler_allocates_claim_and_honours_counters(api: Any, gpu_node: dict[str, str]) -> None:
    ns = gpu_node["namespace"]
    core = k8s.CoreV1Api(api)
    resource = k8s.ResourceV1Api(api)
    heartbeat_node(api, gpu_node["node"])

    resource.create_namespaced_resource_claim(ns, _claim("mig-claim", gpu_node["class"], "mig"))
    core.create_namespaced_pod(ns, _pod("mig-pod", "mig-claim"))

    def allocated() -> Any:
        claim = resource.read_namespaced_resource_claim("mig-claim", ns)
        return claim if claim.status and claim.status.allocation else None

    claim: Any = eventually(allocated, 60, "kube-scheduler to allocate mig-claim")
    results = claim.status.allocation.devices.results
    assert [(r.request, r.driver, r.pool, r.device) for r in results] == [
        ("gpu", DRIVER, gpu_node["pool"], "gpu-0-mig-1g40gb-0")
    ]
    terms = claim.status.allocation.node_selector.node_selector_terms
    assert terms[0].match_fields[0].values == [gpu_node["node"]]
    assert [r.name for r in claim.status.reserved_for] == ["mig-pod"]

    def node_name(pod: str) -> str | None:
        spec = core.read_namespaced_pod(pod, ns).spec
        assert spec is not None
        return spec.node_name

    bound = eventually(lambda: node_name("mig-pod"), 30, "mig-pod to be bound")
    assert bound == gpu_node["node"]

    # The whole GPU shares memory-slice-0 with the allocated MIG device: counters forbid it.
    resource.create_namespaced_resource_claim(ns, _claim("gpu-claim", gpu_node["class"], "gpu"))
    core.create_namespaced_pod(ns, _pod("gpu-pod", "gpu-claim"))

    def unschedulable() -> bool:
        status = core.read_namespaced_pod("gpu-pod", ns).status
        conds = {c.type: c for c in ((status.conditions if status else None) or [])}
        cond = conds.get("PodScheduled")
        return bool(cond and cond.status == "False" and cond.reason == "Unschedulable")

    eventually(unschedulable, 30, "gpu-pod to be reported Unschedulable")
    gpu_claim = resource.read_namespaced_resource_claim("gpu-claim", ns)
    assert not (gpu_claim.status and gpu_claim.status.allocation)
    assert not node_name("gpu-pod")


def test_helm_installs_chart(control_plane: ControlPlane, api: Any, tmp_path: Path) -> None:
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: smoke\nversion: 0.1.0\nkubeVersion: '>=1.37.0-0'\n"
    )
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    ns = f"e2e-helm-{uuid.uuid4().hex[:6]}"
    control_plane.helm(
        "install", "smoke", str(chart), "-n", ns, "--create-namespace", "--wait", "--timeout", "60s"
    )
    cm = k8s.CoreV1Api(api).read_namespaced_config_map("smoke-cm", ns)
    assert cm.data == {"kube": "v1.37.2"}
    listed = control_plane.helm("list", "-n", ns, "-q").stdout.split()
    assert listed == ["smoke"]
    control_plane.helm("uninstall", "smoke", "-n", ns, "--wait")
    k8s.CoreV1Api(api).delete_namespace(ns)
