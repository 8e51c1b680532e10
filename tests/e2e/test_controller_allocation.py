"""The controller against a real kube-apiserver + kube-scheduler: gated pod -> claim allocated -> gate
removed -> kube-scheduler binds the pod to the chosen node; unplaceable pods are told why and placed once
capacity frees up; claims of deleted pods are deallocated."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from prometheus_client import generate_latest

from api.constants import ALLOCATION_GATE, ANNOTATION_MIG_ALLOCATIONS, DRIVER_NAME
from controller.kube.rest import request
from controller.kube.writer import CONDITION_TYPE, FINALIZER

from .cluster import ControlPlane
from .controller_env import (
    controller_env,
    create,
    device_class_body,
    eventually,
    gpu_catalogs,
    published_slices,
)
from .objects import claim_body, pod_body

pytestmark = pytest.mark.e2e
# Claim config is copied into the allocation whatever driver it is for; a config for our own driver must be
# a known type (api/opaqueconfig.py), so another driver's carries the check.
CONFIG: list[dict[str, Any]] = [{"opaque": {"driver": "nic.example.com", "parameters": {"note": "copied"}}}]


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    nodes = {f"ctl-a100-{suffix}": ("A100-40GB", 1), f"ctl-h100-{suffix}": ("H100-80GB", 1)}
    slices = {node: published_slices(node, gpu_catalogs(model, n)) for node, (model, n) in nodes.items()}
    device_class = f"mig-{suffix}.{DRIVER_NAME}"
    with (
        control_plane.api_client() as api,
        controller_env(api, f"ctl-{suffix}", slices, [device_class_body(device_class)]) as ctl,
    ):
        yield {
            "api": api,
            "nodes": nodes,
            "class": device_class,
            "ns": ctl.namespace,
            "controller": ctl.controller,
            "elector": ctl.elector,
        }


def _gated_pod(name: str, claim: str | dict[str, str]) -> dict[str, Any]:
    return pod_body(name, claim, gates=[ALLOCATION_GATE])


def _mem_selector(mib: int) -> str:
    return f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("{mib}Mi")) >= 0'


def test_gated_pod_is_allocated_released_and_bound(env: dict[str, Any]) -> None:
    api, ns = env["api"], env["ns"]
    core: Any = k8s.CoreV1Api(api)
    resource: Any = k8s.ResourceV1Api(api)
    eventually(env["elector"].is_leader, 30, "the controller to win the leader election")
    create(api, ns, "resourceclaims", claim_body("small", env["class"], [_mem_selector(4000)], config=CONFIG))
    create(api, ns, "pods", _gated_pod("small", {"resourceClaimName": "small"}))

    def allocated() -> Any:
        claim = resource.read_namespaced_resource_claim("small", ns)
        return claim if claim.status and claim.status.allocation else None

    claim = eventually(allocated, 60, "the controller to allocate claim small")
    (result,) = claim.status.allocation.devices.results
    node = claim.status.allocation.node_selector.node_selector_terms[0].match_fields[0].values[0]
    # 4000 MiB: the A100's 1g.5gb wastes least (the H100's smallest is 1g.10gb).
    assert node.startswith("ctl-a100-")
    assert result.driver == DRIVER_NAME and result.pool == node and "-mig-1g5gb-" in result.device
    assert FINALIZER in claim.metadata.finalizers
    assert claim.status.allocation.devices.config[0].source == "FromClaim"

    def bound() -> str | None:
        pod = core.read_namespaced_pod("small", ns)
        return pod.spec.node_name

    assert eventually(bound, 60, "kube-scheduler to bind pod small") == node
    pod = core.read_namespaced_pod("small", ns)
    assert not pod.spec.scheduling_gates
    (record,) = json.loads(pod.metadata.annotations[ANNOTATION_MIG_ALLOCATIONS])
    assert record["profile"] == "1g.5gb" and "migUUID" not in record
    reserved = resource.read_namespaced_resource_claim("small", ns).status.reserved_for
    assert [r.name for r in reserved] == ["small"]

    # The node writes the realised identity into status.devices (as the kubelet plugin does); the
    # controller's hami_node_gpu_mig_instance_info must then show the instance with its placement.
    current = request(api, "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/small")
    current["status"]["devices"] = [
        {
            "driver": DRIVER_NAME,
            "pool": node,
            "device": result.device,
            "data": {
                "migUUID": "MIG-11111111-2222-3333-4444-555555555555",
                "gpuInstanceID": 7,
                "computeInstanceID": 0,
                "parentUUID": "GPU-e2e-parent",
                "profile": "1g.5gb",
                "placement": {"start": int(result.device.rsplit("-", 1)[1]), "size": 1},
            },
        }
    ]
    request(api, "PUT", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/small/status", current)

    def instance_metric() -> str | None:
        text = generate_latest(env["controller"].metrics.registry).decode()
        rows = [line for line in text.splitlines() if line.startswith("hami_node_gpu_mig_instance_info{")]
        return next((r for r in rows if "MIG-11111111-2222-3333-4444-555555555555" in r), None)

    row = eventually(instance_metric, 30, "the controller to export the realised instance")
    for label in (f'node="{node}"', 'profile="1g.5gb"', 'gpu_instance_id="7"', 'compute_instance_id="0"'):
        assert label in row, row
    assert 'placement_size="1"' in row and row.rstrip().endswith(" 1.0"), row


def test_unplaceable_pod_waits_with_reason_then_placed_after_release(env: dict[str, Any]) -> None:
    api, ns = env["api"], env["ns"]
    core: Any = k8s.CoreV1Api(api)
    resource: Any = k8s.ResourceV1Api(api)
    eventually(env["elector"].is_leader, 30, "leadership")
    # Fill the H100 with one 7g.80gb through a template-generated claim.
    create(
        api,
        ns,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "big"},
            "spec": {"spec": claim_body("x", env["class"], [_mem_selector(60000)], config=CONFIG)["spec"]},
        },
    )
    create(api, ns, "pods", _gated_pod("big-1", {"resourceClaimTemplateName": "big"}))
    eventually(lambda: core.read_namespaced_pod("big-1", ns).spec.node_name, 60, "big-1 bound")
    create(api, ns, "pods", _gated_pod("big-2", {"resourceClaimTemplateName": "big"}))

    def condition() -> Any:
        status = core.read_namespaced_pod("big-2", ns).status
        conds = [c for c in status.conditions or [] if c.type == CONDITION_TYPE]
        return conds[0] if conds and conds[0].status == "False" else None

    cond = eventually(condition, 60, "big-2 to be reported unplaceable")
    assert cond.reason == "AllPlacementsTaken"
    assert core.read_namespaced_pod("big-2", ns).spec.scheduling_gates
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=big-2").items
    assert any(e.reason == "FailedAllocation" and "AllPlacementsTaken" in e.message for e in events)

    first_claim = core.read_namespaced_pod("big-1", ns).status.resource_claim_statuses[0].resource_claim_name
    core.delete_namespaced_pod("big-1", ns, grace_period_seconds=0)

    def claim_gone() -> bool:
        names = [c.metadata.name for c in resource.list_namespaced_resource_claim(ns).items]
        return first_claim not in names

    eventually(claim_gone, 60, "the first claim to be deallocated and deleted")
    eventually(lambda: core.read_namespaced_pod("big-2", ns).spec.node_name, 60, "big-2 bound after release")
