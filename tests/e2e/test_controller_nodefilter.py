"""The controller only allocates on nodes kube-scheduler would bind the pod to: against a real
kube-apiserver + kube-scheduler, a NoSchedule taint keeps a pod without the toleration off the node
(placed elsewhere, or waiting with the taint named), and the toleration lets it there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.kube.rest import request
from controller.kube.writer import CONDITION_TYPE

from .cluster import ControlPlane
from .controller_env import (
    bound_node,
    controller_env,
    create,
    device_class_body,
    eventually,
    gpu_catalogs,
    published_slices,
)
from .objects import claim_body, pod_body

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
    slices = {node: published_slices(node, gpu_catalogs(model, 1)) for node, model in nodes.items()}
    device_class = f"mig-nf-{suffix}.{DRIVER_NAME}"
    with (
        control_plane.api_client() as api,
        controller_env(
            api, f"nf-{suffix}", slices, [device_class_body(device_class)], taints={tainted: [TAINT]}
        ) as ctl,
    ):
        yield {"api": api, "tainted": tainted, "plain": plain, "class": device_class, "ns": ctl.namespace}


def _create_pod(env: dict[str, Any], name: str, selector: str, tolerations: list[dict[str, str]]) -> None:
    api, ns = env["api"], env["ns"]
    create(api, ns, "resourceclaims", claim_body(name, env["class"], [selector]))
    body = pod_body(name, name, gates=[ALLOCATION_GATE])
    if tolerations:
        body["spec"]["tolerations"] = tolerations
    create(api, ns, "pods", body)


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
    assert (
        eventually(lambda: bound_node(env["api"], env["ns"], pod), 60, f"kube-scheduler to bind pod {pod}")
        == node
    )
    writers = _allocation_writers(env, pod)
    assert writers and "kube-scheduler" not in writers, writers
    return node


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
