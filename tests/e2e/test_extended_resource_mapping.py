"""Kubernetes' extended-resource mapping (KEP-5004, GA in 1.37) with a flexmig DeviceClass, on the real
control plane: the shim leaves a count-only pod as written, kube-scheduler creates and allocates its
claim from the published flexmig devices (recorded in `pod.status.extendedResourceClaimStatus`), and
flexmig's controller, allocating gated pods at the same time, counts that GPU as taken."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.shim import ShimDefaults, mutate_pod
from controller.shim.defaults import ResourceNames

from .cluster import ControlPlane
from .controller_env import (
    bound_node,
    controller_env,
    create,
    device_class_body,
    eventually,
    gpu_catalogs,
    published_slices,
    type_is,
)
from .objects import UNPULLABLE_IMAGE, claim_body, pod_body

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    prefix = f"GPU-ext{suffix}-"
    node = f"ext-h100-{suffix}"
    slices = {node: published_slices(node, gpu_catalogs("H100-80GB", 2, prefix), mig_enabled=False)}
    # A name of this module's own: the control plane is shared, and one name maps to one class.
    resource = f"example.com/gpu-{suffix}"
    whole = device_class_body(
        f"whole-{suffix}.{DRIVER_NAME}",
        type_is("gpu"),
        f'device.attributes["{DRIVER_NAME}"].uuid.startsWith("{prefix}")',
    )
    whole["spec"]["extendedResourceName"] = resource
    with (
        control_plane.api_client() as api,
        controller_env(api, f"ext-{suffix}", slices, [whole]) as ctl,
    ):
        yield {
            "api": api,
            "ns": ctl.namespace,
            "node": node,
            "resource": resource,
            "class": whole["metadata"]["name"],
            "elector": ctl.elector,
        }


def _count_only_pod(name: str, resource: str) -> dict[str, Any]:
    limits = {resource: "1"}
    container = {"name": "main", "image": UNPULLABLE_IMAGE, "resources": {"limits": limits}}
    spec = {"automountServiceAccountToken": False, "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _allocated_devices(api: Any, ns: str, claim: str) -> list[str]:
    status = k8s.ResourceV1Api(api).read_namespaced_resource_claim(claim, ns).status
    if not status or not status.allocation:
        return []
    return [r.device for r in status.allocation.devices.results if r.driver == DRIVER_NAME]


def test_mapping_serves_count_only_pods_and_the_controller_counts_them(env: dict[str, Any]) -> None:
    api, ns, node, resource = env["api"], env["ns"], env["node"], env["resource"]
    core: Any = k8s.CoreV1Api(api)
    eventually(env["elector"].is_leader, 30, "the controller to win the leader election")

    # 1. The shim, told that the name is mapped (and that it is the pod's count resource, as
    #    nvidia.com/gpu would be), leaves the pod as written and ungated ...
    pod = _count_only_pod("mapped", resource)
    defaults = ShimDefaults(names=ResourceNames(count=resource), mapped_resources=frozenset({resource}))
    decision = mutate_pod(pod, ns, defaults, lambda _entry: False)
    assert (decision.patch, decision.gated) == ([], False)
    # ... and without the mapping it would have translated it: the two never both act.
    assert mutate_pod(pod, ns, ShimDefaults(names=ResourceNames(count=resource)), lambda _e: False).gated

    # 2. kube-scheduler creates the claim, allocates a published flexmig whole GPU and binds the pod.
    create(api, ns, "pods", pod)
    eventually(lambda: bound_node(api, ns, "mapped"), 60, "the mapped pod to be bound")
    assert bound_node(api, ns, "mapped") == node

    def mapped_claim() -> str | None:
        status = core.read_namespaced_pod("mapped", ns).status
        ext = status.extended_resource_claim_status if status else None
        return str(ext.resource_claim_name) if ext and ext.resource_claim_name else None

    claim = eventually(mapped_claim, 30, "pod.status.extendedResourceClaimStatus")
    [taken] = eventually(
        lambda: _allocated_devices(api, ns, claim) or None, 30, "the mapped claim's allocation"
    )
    assert taken in ("gpu-0", "gpu-1")

    # 3. The controller gives a gated whole-GPU pod the other GPU, never the one the mapping took ...
    create(api, ns, "resourceclaims", claim_body("w1", env["class"]))
    create(api, ns, "pods", pod_body("w1", "w1", gates=[ALLOCATION_GATE]))
    [other] = eventually(lambda: _allocated_devices(api, ns, "w1") or None, 60, "w1 to be allocated")
    assert {taken, other} == {"gpu-0", "gpu-1"}

    # 4. ... and with both GPUs taken, a third pod waits (still gated, nothing allocated).
    create(api, ns, "resourceclaims", claim_body("w2", env["class"]))
    create(api, ns, "pods", pod_body("w2", "w2", gates=[ALLOCATION_GATE]))

    def waiting_with_reason() -> bool:
        p = core.read_namespaced_pod("w2", ns)
        gated = any(g.name == ALLOCATION_GATE for g in p.spec.scheduling_gates or [])
        said = any(c.type.startswith(DRIVER_NAME) for c in (p.status.conditions or []))
        return gated and said and not _allocated_devices(api, ns, "w2")

    eventually(waiting_with_reason, 30, "w2 to wait, gated, with the controller's condition")
