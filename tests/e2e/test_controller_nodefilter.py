"""The controller only allocates on nodes kube-scheduler would bind the pod to: against a real
kube-apiserver + kube-scheduler, a NoSchedule taint keeps a pod without the toleration off the node
(placed elsewhere, or waiting with the taint named), and the toleration lets it there."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.leader import LeaderElector
from controller.loop import Controller
from controller.rest import request
from controller.watchcache import WatchCache
from controller.writer import CONDITION_TYPE, Writer
from driver.catalog.simulated import simulated_catalog
from kubeletplugin.nodeconfig import NodeConfig, OperatingMode
from kubeletplugin.slices import build_node_slices

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node, heartbeat_node
from .objects import claim_body, pod_body
from .test_controller_allocation import eventually

pytestmark = pytest.mark.e2e
TAINT = {"key": "e2e.flexmig.dev/dedicated", "value": "gpu", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    # A 4000 MiB request packs best on the A100 (1g.5gb; the H100's smallest is 1g.10gb): the
    # tainted node is the one the policy would pick, so only the node filter can move the pod away.
    tainted, plain = f"nf-a100-{suffix}", f"nf-h100-{suffix}"
    nodes = {tainted: "A100-40GB", plain: "H100-80GB"}
    with control_plane.api_client() as api:
        core: Any = k8s.CoreV1Api(api)
        resource: Any = k8s.ResourceV1Api(api)
        for node, model in nodes.items():
            create_ready_node(api, node)
            base = simulated_catalog(model)
            catalog = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, uuid=f"GPU-{uuid.uuid4()}"))
            built = build_node_slices([catalog], node, 1, NodeConfig(node, OperatingMode.MIG), {0: True})
            for s in built.slices:
                request(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", s.body)
        core.patch_node(tainted, {"spec": {"taints": [TAINT]}})
        device_class = f"mig-nf-{suffix}.{DRIVER_NAME}"
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
        namespace = f"nf-{suffix}"
        create_namespace(api, namespace)
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.wait(5):
                for node in nodes:
                    heartbeat_node(api, node)

        threading.Thread(target=heartbeats, daemon=True).start()
        elector = LeaderElector(api, namespace, f"e2e-nf-{suffix}", lease_s=6, renew_deadline_s=4, retry_s=1)
        elector.start()
        controller = Controller(WatchCache.for_api(api), Writer(api), is_leader=elector.is_leader)
        runner = threading.Thread(target=controller.run, args=(stop.is_set,), daemon=True)
        runner.start()
        yield {"api": api, "tainted": tainted, "plain": plain, "class": device_class, "ns": namespace}
        stop.set()
        elector.stop_event.set()
        runner.join(timeout=10)
        core.delete_namespace(namespace)
        resource.delete_device_class(device_class)
        for node in nodes:
            resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
            core.delete_node(node)


def _create_pod(env: dict[str, Any], name: str, selector: str, tolerations: list[dict[str, str]]) -> None:
    api, ns = env["api"], env["ns"]
    request(
        api,
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
        claim_body(name, env["class"], [selector]),
    )
    body = pod_body(name, name, gates=[ALLOCATION_GATE])
    if tolerations:
        body["spec"]["tolerations"] = tolerations
    request(api, "POST", f"/api/v1/namespaces/{ns}/pods", body)


def _allocated_node(env: dict[str, Any], claim: str) -> str | None:
    got = k8s.ResourceV1Api(env["api"]).read_namespaced_resource_claim(claim, env["ns"])
    if not (got.status and got.status.allocation):
        return None
    return str(got.status.allocation.node_selector.node_selector_terms[0].match_fields[0].values[0])


def _allocation_writers(env: dict[str, Any], claim: str) -> set[str]:
    """Field managers owning status.allocation: kube-scheduler there means it had to clear ours (the
    PostFilter of a pod that cannot go to our node) and allocate again itself."""
    got = request(
        env["api"], "GET", f"/apis/resource.k8s.io/v1/namespaces/{env['ns']}/resourceclaims/{claim}"
    )
    return {
        str(m.get("manager"))
        for m in got["metadata"].get("managedFields") or ()
        if "f:allocation" in ((m.get("fieldsV1") or {}).get("f:status") or {})
    }


def _placed_by_us(env: dict[str, Any], pod: str) -> str:
    """The node kube-scheduler bound `pod` (whose claim has its name) to, once the controller's allocation
    there was accepted as is."""
    node = eventually(lambda: _allocated_node(env, pod), 60, f"claim {pod} allocated")
    assert eventually(lambda: _bound(env, pod), 60, f"kube-scheduler to bind pod {pod}") == node
    writers = _allocation_writers(env, pod)
    assert writers and "kube-scheduler" not in writers, writers
    return node


def _bound(env: dict[str, Any], pod: str) -> str | None:
    name = k8s.CoreV1Api(env["api"]).read_namespaced_pod(pod, env["ns"]).spec.node_name
    return str(name) if name else None


def test_taint_steers_allocation_and_toleration_admits(env: dict[str, Any]) -> None:
    mem = f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("4000Mi")) >= 0'
    # Without the toleration: the untainted H100, although the A100 packs better.
    _create_pod(env, "plain", mem, [])
    assert _placed_by_us(env, "plain") == env["plain"]
    # With it: the A100 again wins, and kube-scheduler agrees to bind there.
    _create_pod(env, "tolerant", mem, [TOLERATION])
    assert _placed_by_us(env, "tolerant") == env["tainted"]


def test_pod_waits_with_the_taint_named_until_it_tolerates_it(env: dict[str, Any]) -> None:
    core: Any = k8s.CoreV1Api(env["api"])
    ns = env["ns"]
    only_a100 = f'device.attributes["{DRIVER_NAME}"].model == "A100-40GB"'
    _create_pod(env, "waits", only_a100, [])

    def condition() -> Any:
        conds = core.read_namespaced_pod("waits", ns).status.conditions or []
        mine = [c for c in conds if c.type == CONDITION_TYPE and c.status == "False"]
        return mine[0] if mine else None

    cond = eventually(condition, 60, "pod waits to be reported unplaceable")
    assert "1 node(s) had untolerated taint(s)" in cond.message, cond.message
    assert f"{env['tainted']}: {TAINT['key']}=gpu:NoSchedule" in cond.message, cond.message
    assert core.read_namespaced_pod("waits", ns).spec.scheduling_gates
    assert _allocated_node(env, "waits") is None
    # Tolerations may be added to a pod; the controller sees the update and places it.
    core.patch_namespaced_pod("waits", ns, {"spec": {"tolerations": [TOLERATION]}})
    assert _placed_by_us(env, "waits") == env["tainted"]
