"""The controller against a real kube-apiserver + kube-scheduler: gated pod -> claim allocated -> gate
removed -> kube-scheduler binds the pod to the chosen node; unplaceable pods are told why and placed once
capacity frees up; claims of deleted pods are deallocated."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from prometheus_client import generate_latest

from api.constants import ALLOCATION_GATE, ANNOTATION_MIG_ALLOCATIONS, DRIVER_NAME
from controller.leader import LeaderElector
from controller.loop import Controller
from controller.rest import request
from controller.watchcache import WatchCache
from controller.writer import CONDITION_TYPE, FINALIZER, Writer
from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from kubeletplugin.nodeconfig import NodeConfig, OperatingMode
from kubeletplugin.slices import build_node_slices

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node, heartbeat_node
from .objects import claim_body, pod_body

pytestmark = pytest.mark.e2e
T = TypeVar("T")
CONFIG: list[dict[str, Any]] = [{"opaque": {"driver": DRIVER_NAME, "parameters": {"note": "copied"}}}]


def eventually(fn: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def _catalogs(model: str, n: int) -> list[GpuCatalog]:
    base = simulated_catalog(model)
    return [
        dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, index=i, uuid=f"GPU-{uuid.uuid4()}"))
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    with control_plane.api_client() as api:
        nodes = {f"ctl-a100-{suffix}": ("A100-40GB", 1), f"ctl-h100-{suffix}": ("H100-80GB", 1)}
        resource: Any = k8s.ResourceV1Api(api)
        for node, (model, n) in nodes.items():
            create_ready_node(api, node)
            built = build_node_slices(
                _catalogs(model, n),
                node,
                1,
                NodeConfig(node, OperatingMode.MIG),
                dict.fromkeys(range(n), True),
            )
            for s in built.slices:
                request(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", s.body)
        device_class = f"mig-{suffix}.{DRIVER_NAME}"
        request(
            api,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": device_class},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
            },
        )
        namespace = f"ctl-{suffix}"
        create_namespace(api, namespace)
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.wait(5):
                for node in nodes:
                    heartbeat_node(api, node)

        beat = threading.Thread(target=heartbeats, daemon=True)
        beat.start()
        elector = LeaderElector(api, namespace, f"e2e-{suffix}", lease_s=6, renew_deadline_s=4, retry_s=1)
        elector.start()
        controller = Controller(WatchCache.for_api(api), Writer(api), is_leader=elector.is_leader)
        runner = threading.Thread(target=controller.run, args=(stop.is_set,), daemon=True)
        runner.start()
        yield {
            "api": api,
            "nodes": nodes,
            "class": device_class,
            "ns": namespace,
            "controller": controller,
            "elector": elector,
        }
        stop.set()
        elector.stop_event.set()
        runner.join(timeout=10)
        k8s.CoreV1Api(api).delete_namespace(namespace)
        resource.delete_device_class(device_class)
        for node in nodes:
            resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
            k8s.CoreV1Api(api).delete_node(node)


def _gated_pod(name: str, claim: str | dict[str, str]) -> dict[str, Any]:
    return pod_body(name, claim, gates=[ALLOCATION_GATE])


def _create(api: Any, ns: str, plural: str, body: dict[str, Any]) -> None:
    group = "/api/v1" if plural == "pods" else "/apis/resource.k8s.io/v1"
    request(api, "POST", f"{group}/namespaces/{ns}/{plural}", body)


def _mem_selector(mib: int) -> str:
    return f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("{mib}Mi")) >= 0'


def test_gated_pod_is_allocated_released_and_bound(env: dict[str, Any]) -> None:
    api, ns = env["api"], env["ns"]
    core: Any = k8s.CoreV1Api(api)
    resource: Any = k8s.ResourceV1Api(api)
    eventually(env["elector"].is_leader, 30, "the controller to win the leader election")
    _create(
        api, ns, "resourceclaims", claim_body("small", env["class"], [_mem_selector(4000)], config=CONFIG)
    )
    _create(api, ns, "pods", _gated_pod("small", {"resourceClaimName": "small"}))

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
    _create(
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
    _create(api, ns, "pods", _gated_pod("big-1", {"resourceClaimTemplateName": "big"}))
    eventually(lambda: core.read_namespaced_pod("big-1", ns).spec.node_name, 60, "big-1 bound")
    _create(api, ns, "pods", _gated_pod("big-2", {"resourceClaimTemplateName": "big"}))

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
